package worker_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/orpc"
	"tandem/worker"
)

// startKV is env.start with a KV cache of kvType.
func (env *peerEnv) startKV(name, modelPath string, kvType hal.DType, cfg worker.Config) *peerNode {
	t := env.t
	t.Helper()
	be := cpu.New(1)
	m, err := model.Load(modelPath, be)
	if err != nil {
		t.Fatal(err)
	}
	m.KVType = kvType
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 128, BlockSize: 16, Salt: kvcache.Salt(modelName, "", "")})
	if err != nil {
		t.Fatal(err)
	}
	return env.startEngine(name, modelPath, m, eng, cfg, func() { m.Close(); be.Close() })
}

// Workers with F16 KV caches move the prompt's blocks as "f16" and decode as one F16 engine
// would. A worker with an F32 cache does not take an F16 worker's blocks: the pull is
// refused, naming both formats, and the decode worker computes the prompt itself.
func TestKVTransferF16Workers(t *testing.T) {
	env := newPeerEnv(t)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	p := env.startKV("p", path, hal.F16, worker.Config{})
	d := env.startKV("d", path, hal.F16, worker.Config{})
	d32 := env.startKV("d32", path, hal.F32, worker.Config{})
	agg := env.startKV("agg", path, hal.F16, worker.Config{})
	pc, dc, d32c := env.dial(p), env.dial(d), env.dial(d32)

	prompt := p.m.Tokenizer.Encode(strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3), true, false)
	const maxTokens = 20
	want := reference(t, agg, prompt, maxTokens)
	got, _, err := disagg(t, pc, dc, p, prompt, maxTokens, cluster.KVSource{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("disaggregated %v\naggregated    %v", got, want)
	}
	blocks := len(prompt) / 16
	if n := testutil.ToFloat64(d.met.Blocks.WithLabelValues("received")); n != float64(blocks) {
		t.Errorf("D received %v blocks, want %d", n, blocks)
	}

	// F16 prefill, F32 decode: no blocks cross, the request still completes.
	got, usage, err := disagg(t, pc, d32c, p, prompt, maxTokens, cluster.KVSource{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != maxTokens || usage.CachedTokens != 0 {
		t.Errorf("F32 decode of an F16 prefill: %d tokens, usage %+v", len(got), usage)
	}
	if n := testutil.ToFloat64(d32.met.Blocks.WithLabelValues("received")); n != 0 {
		t.Errorf("the F32 worker took %v blocks from the F16 one", n)
	}

	// The refusal itself, as P answers a pull in F32's layout.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rep cluster.PrefillReply
	err = pc.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{Generate: cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: 8}}}, &rep)
	if err != nil || rep.Handle == 0 || rep.Layout.DType != "f16" {
		t.Fatalf("prefill: %+v, %v", rep, err)
	}
	f32, err := d32.eng.KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := pc.Stream(ctx, cluster.MethodPullKV, &cluster.PullRequest{Handle: rep.Handle, Layout: cluster.KVLayout(f32), Hashes: nil})
	if err == nil {
		err = cs.RecvMsg(&cluster.KVBlock{})
	}
	var st *orpc.Status
	if !errors.As(err, &st) || st.Code != orpc.FailedPrecondition || !strings.Contains(st.Message, "KV layouts differ") ||
		!strings.Contains(st.Message, " f16,") || !strings.Contains(st.Message, " f32,") {
		t.Errorf("pull of F16 blocks in F32's layout: %v", err)
	}
	var rel cluster.ReleaseReply
	if err := pc.Call(ctx, cluster.MethodReleaseKV, &cluster.ReleaseRequest{Handle: rep.Handle}, &rel); err != nil || !rel.Released {
		t.Errorf("release: %+v %v", rel, err)
	}
	p.idle(t)
	d.idle(t)
	d32.idle(t)
}
