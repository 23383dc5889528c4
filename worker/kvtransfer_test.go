package worker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/orpc"
	"tandem/worker"
)

// peerNode is a worker serving ORPC with an identity of the test's CA, registered with no
// router (the router address it is given answers nothing): peers call it directly.
type peerNode struct {
	name string
	eng  *engine.Engine
	m    *model.Model
	w    *worker.Worker
	met  *metrics.KVTransfer
	logs *syncBuffer
	// stopEngine stops the engine alone: the worker stays registered and answers, but
	// every generation fails as unavailable.
	stopEngine context.CancelFunc
	// kill stops the worker and its engine at once (no drain), as a crash would.
	kill context.CancelFunc
}

type peerEnv struct {
	t  testing.TB
	ca *orpc.CA
}

func newPeerEnv(t testing.TB) *peerEnv {
	ca, err := orpc.NewCA("test cluster")
	if err != nil {
		t.Fatal(err)
	}
	return &peerEnv{t: t, ca: ca}
}

func (env *peerEnv) identity(name string) *orpc.Identity {
	id, err := env.ca.NewIdentity(name, []string{"127.0.0.1"})
	if err != nil {
		env.t.Fatal(err)
	}
	return id
}

// start runs an engine on modelPath as worker name; cfg's Engine, Card (but its Role),
// Node and Listen are filled in, and without a join token an Identity and a router that
// does not answer.
func (env *peerEnv) start(name, modelPath string, cfg worker.Config) *peerNode {
	t := env.t
	t.Helper()
	be := cpu.New(1)
	m, err := model.Load(modelPath, be)
	if err != nil {
		t.Fatal(err)
	}
	salt := kvcache.Salt(modelName, "", "")
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 128, BlockSize: 16, Salt: salt})
	if err != nil {
		t.Fatal(err)
	}
	return env.startEngine(name, modelPath, m, eng, cfg, func() { m.Close(); be.Close() })
}

// startEngine runs eng (an engine of 128 blocks of 16 on m, whose salt is modelName's) as
// worker name, as start does (the worker serves cfg.Engine if set, a wrapper of eng);
// closeModel runs at cleanup, after both stopped.
func (env *peerEnv) startEngine(name, modelPath string, m *model.Model, eng *engine.Engine, cfg worker.Config, closeModel func()) *peerNode {
	t := env.t
	t.Helper()
	salt := kvcache.Salt(modelName, "", "")
	met := metrics.NewKVTransfer(prometheus.NewRegistry(), modelName)
	logs := &syncBuffer{}
	if cfg.Engine == nil {
		cfg.Engine = eng
	}
	format, files, err := cluster.EncodeTokenizer(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Card = cluster.ModelCard{Model: modelName, HashVersion: kvcache.HashVersion, BlockSize: 16, Salt: salt, KVBlocks: 128,
		ContextLen: m.Config.ContextLen, TokenizerFormat: format, TokenizerFiles: files, Role: cfg.Card.Role}
	cfg.Node, cfg.Listen, cfg.KVMetrics = name, "127.0.0.1:0", met
	if cfg.Token == "" {
		cfg.Identity = env.identity(name)
	}
	if len(cfg.Routers) == 0 {
		cfg.Routers = []string{"127.0.0.1:9"} // nobody: the worker keeps retrying in the background
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	engCtx, stopEngine := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { eng.Run(engCtx); done <- struct{}{} }()
	go func() { w.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
		closeModel()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, logs.String())
		}
	})
	select {
	case <-w.Ready():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s not ready", name)
	}
	return &peerNode{name: name, eng: eng, m: m, w: w, met: met, logs: logs, stopEngine: stopEngine, kill: cancel}
}

func (env *peerEnv) dial(n *peerNode) *orpc.Client {
	c, err := orpc.Dial(context.Background(), n.w.Addr(), env.identity("router").ClientTLS())
	if err != nil {
		env.t.Fatal(err)
	}
	env.t.Cleanup(func() { c.Close() })
	return c
}

// idle waits until n's pool has no referenced block and nothing is held.
func (n *peerNode) idle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, _ := n.eng.HeldStats()
		if n.eng.Pool().Stats().Used == 0 && held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d blocks in use, %d handles held", n.name, n.eng.Pool().Stats().Used, held)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reference generates greedily on an engine of its own.
func reference(t *testing.T, n *peerNode, prompt []int32, maxTokens int) []int32 {
	t.Helper()
	st, err := n.eng.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: maxTokens})
	if err != nil {
		t.Fatal(err)
	}
	return drain(t, st)
}

func drain(t *testing.T, st llm.Stream) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []int32
	for {
		ev, err := st.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev.Token)
	}
}

// disagg runs prompt through P's Worker.Prefill and D's Worker.Decode and returns the tokens
// and the final usage.
func disagg(t *testing.T, pc, dc *orpc.Client, p *peerNode, prompt []int32, maxTokens int, src cluster.KVSource) ([]int32, llm.Usage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rep cluster.PrefillReply
	req := cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: maxTokens}}
	if err := pc.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{Generate: req}, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.First.Kind != cluster.EventToken || rep.Handle == 0 {
		t.Fatalf("prefill reply %+v", rep)
	}
	out := []int32{rep.First.Event.Token}
	if src.Addr == "" {
		src.Addr = p.w.Addr()
	}
	if src.Handle == 0 {
		src.Handle = rep.Handle
	}
	src.Node, src.PromptLen = p.name, len(prompt)
	dreq := req
	dreq.Prompt = append(slices.Clone(prompt), rep.First.Event.Token)
	dreq.MaxTokens = maxTokens - 1
	cs, err := dc.Stream(ctx, cluster.MethodDecode, &cluster.DecodeRequest{Generate: dreq, Source: src})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	return readGenerate(t, cs, out)
}

// readGenerate appends to out the tokens of the generate stream cs and returns them with
// the final usage, or with the error an error event carries; a broken stream fails t.
func readGenerate(t testing.TB, cs *orpc.ClientStream, out []int32) ([]int32, llm.Usage, error) {
	t.Helper()
	var usage llm.Usage
	for {
		var ev cluster.GenerateEvent
		err := cs.RecvMsg(&ev)
		if errors.Is(err, io.EOF) {
			return out, usage, nil
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Kind {
		case cluster.EventError:
			return out, usage, ev.Error()
		case cluster.EventToken:
			out = append(out, ev.Event.Token)
			if ev.Event.Finish != "" {
				usage = ev.Event.Usage
			}
		}
	}
}

func TestKVTransferBetweenWorkers(t *testing.T) {
	env := newPeerEnv(t)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	p := env.start("p", path, worker.Config{})
	d := env.start("d", path, worker.Config{})
	agg := env.start("agg", path, worker.Config{})
	pc, dc := env.dial(p), env.dial(d)

	text := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3)
	prompt := p.m.Tokenizer.Encode(text, true, false)
	const maxTokens = 20
	want := reference(t, agg, prompt, maxTokens)
	got, usage, err := disagg(t, pc, dc, p, prompt, maxTokens, cluster.KVSource{})
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
	if n := testutil.ToFloat64(p.met.Blocks.WithLabelValues("sent")); n != float64(blocks) {
		t.Errorf("P sent %v blocks, want %d", n, blocks)
	}
	f, _ := d.eng.KVFormat()
	if n := testutil.ToFloat64(d.met.Bytes.WithLabelValues("received")); n != float64(blocks*f.BlockBytes()) {
		t.Errorf("D received %v bytes, want %d", n, blocks*f.BlockBytes())
	}
	if usage.CachedTokens != 0 || usage.CompletionTokens != maxTokens-1 {
		t.Errorf("D's usage %+v: nothing was cached on D before the transfer", usage)
	}
	p.idle(t)
	d.idle(t)

	// A longer prompt sharing that prefix: D holds the prefix now, and pulls only the rest.
	prompt2 := p.m.Tokenizer.Encode(text+"Then they went home and ate a big cake with mom.", true, false)
	want2 := reference(t, agg, prompt2, maxTokens)
	got2, _, err := disagg(t, pc, dc, p, prompt2, maxTokens, cluster.KVSource{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got2, want2) {
		t.Errorf("second request: disaggregated %v\naggregated    %v", got2, want2)
	}
	blocks2 := len(prompt2) / 16
	if n := testutil.ToFloat64(d.met.Blocks.WithLabelValues("received")); n != float64(blocks2) {
		t.Errorf("D received %v blocks in all, want %d (%d + only the %d missing)", n, blocks2, blocks, blocks2-blocks)
	}
	p.idle(t)
	d.idle(t)

	// A handle P does not hold (expired, say): the transfer fails and D prefills locally.
	got3, _, err := disagg(t, pc, dc, p, prompt, maxTokens, cluster.KVSource{Handle: 999999})
	if err != nil || !slices.Equal(got3, want) {
		t.Errorf("after a failed transfer: %v, %v; want %v", got3, err, want)
	}
	// D held every block already: nothing to pull, so nothing failed.
	if n := testutil.ToFloat64(d.met.Pulls.WithLabelValues("failed")); n != 0 {
		t.Errorf("failed pulls %v, want 0: D needed no block", n)
	}
	if n := testutil.ToFloat64(d.met.Pulls.WithLabelValues("none_missing")); n < 1 {
		t.Errorf("pulls with nothing missing %v, want ≥ 1", n)
	}
	// The same with a prompt D lacks, and strict: the request fails.
	prompt3 := p.m.Tokenizer.Encode("The little dog ran to the big tree and barked at the cat who sat on a branch.", true, false)
	_, _, err = disagg(t, pc, dc, p, prompt3, maxTokens, cluster.KVSource{Handle: 999999, Strict: true})
	if err == nil || !errors.Is(err, llm.ErrUnavailable) || !strings.Contains(err.Error(), "KV transfer failed") {
		t.Errorf("strict request after a failed transfer: %v", err)
	}
	if n := testutil.ToFloat64(d.met.Pulls.WithLabelValues("failed")); n != 1 {
		t.Errorf("failed pulls %v, want 1", n)
	}
	// P's real handle of that prefill is released by the failing D anyway? No: D asked for
	// handle 999999. It expires on P; release it here so the pool check below holds.
	time.Sleep(10 * time.Millisecond)
	for h := uint64(1); h < 10; h++ {
		p.eng.ReleaseHeld(h)
	}
	p.idle(t)
	d.idle(t)

	// A dead P: D prefills locally.
	got4, _, err := disagg(t, pc, dc, p, prompt3, maxTokens, cluster.KVSource{Addr: "127.0.0.1:9", TimeoutMs: 300})
	want4 := reference(t, agg, prompt3, maxTokens)
	if err != nil || !slices.Equal(got4, want4) {
		t.Errorf("with P unreachable: %v, %v; want %v", got4, err, want4)
	}
	for h := uint64(1); h < 10; h++ {
		p.eng.ReleaseHeld(h)
	}
	p.idle(t)
	d.idle(t)
}

// A pull in another layout is refused, naming both layouts.
func TestKVTransferLayoutMismatch(t *testing.T) {
	env := newPeerEnv(t)
	p := env.start("p", fixtures.Model(t, "stories260K-f32.gguf"), worker.Config{})
	pc := env.dial(p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rep cluster.PrefillReply
	prompt := p.m.Tokenizer.Encode(strings.Repeat("Lily and Ben played. ", 5), true, false)
	err := pc.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{Generate: cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: 8}}}, &rep)
	if err != nil || rep.Handle == 0 {
		t.Fatalf("prefill: %+v, %v", rep, err)
	}
	other := rep.Layout
	other.HeadDim *= 2
	cs, err := pc.Stream(ctx, cluster.MethodPullKV, &cluster.PullRequest{Handle: rep.Handle, Layout: other, Hashes: nil})
	if err == nil {
		err = cs.RecvMsg(&cluster.KVBlock{})
	}
	var st *orpc.Status
	if !errors.As(err, &st) || st.Code != orpc.FailedPrecondition || !strings.Contains(st.Message, "KV layouts differ") {
		t.Errorf("pull in a foreign layout: %v", err)
	}
	var rel cluster.ReleaseReply
	if err := pc.Call(ctx, cluster.MethodReleaseKV, &cluster.ReleaseRequest{Handle: rep.Handle}, &rel); err != nil || !rel.Released {
		t.Errorf("release: %+v %v", rel, err)
	}
	p.idle(t)
}

// A pull that outlives its deadline is abandoned: D computes the prompt itself and answers
// correctly, and both sides free their blocks (D its import, P its hold, released by D).
func TestKVTransferDeadline(t *testing.T) {
	env := newPeerEnv(t)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	p := env.start("p", path, worker.Config{KVSendRate: 4000}) // a 10 KiB block every 2.5 s
	d := env.start("d", path, worker.Config{})
	agg := env.start("agg", path, worker.Config{})
	pc, dc := env.dial(p), env.dial(d)
	prompt := p.m.Tokenizer.Encode(strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3), true, false)
	want := reference(t, agg, prompt, 16)
	got, _, err := disagg(t, pc, dc, p, prompt, 16, cluster.KVSource{TimeoutMs: 300})
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("after an abandoned transfer: %v, %v; want %v", got, err, want)
	}
	if n := testutil.ToFloat64(d.met.Pulls.WithLabelValues("timeout")); n != 1 {
		t.Errorf("timed-out pulls %v, want 1", n)
	}
	if !strings.Contains(d.logs.String(), "transfer abandoned") {
		t.Errorf("D logged no abandoned transfer:\n%s", d.logs.String())
	}
	p.idle(t)
	d.idle(t)
}

// A release that arrives before its prefill (the decode worker needed nothing) makes the
// prefill hold nothing when it finishes.
func TestKVReleaseBeforePrefill(t *testing.T) {
	env := newPeerEnv(t)
	p := env.start("p", fixtures.Model(t, "stories260K-f32.gguf"), worker.Config{})
	pc := env.dial(p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const id = 0xabcdef
	var rel cluster.ReleaseReply
	if err := pc.Call(ctx, cluster.MethodReleaseKV, &cluster.ReleaseRequest{Handle: id}, &rel); err != nil || rel.Released {
		t.Fatalf("early release: %+v, %v", rel, err)
	}
	prompt := p.m.Tokenizer.Encode(strings.Repeat("Lily and Ben played. ", 5), true, false)
	var rep cluster.PrefillReply
	err := pc.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{TransferID: id,
		Generate: cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: 8}}}, &rep)
	if err != nil || rep.First.Kind != cluster.EventToken || rep.Handle != 0 || rep.First.Event.Finish != "" {
		t.Fatalf("prefill after its release: %+v, %v", rep, err)
	}
	p.idle(t)
}
