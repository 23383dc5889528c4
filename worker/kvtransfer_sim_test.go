package worker_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/sim"
	"tandem/worker"
)

// TestKVTransferSimModelled: between sim workers (engines with a modelled forward pass and no
// KV memory) a pull goes through the real ORPC call, hashes and checksums, but its blocks
// carry no payload; it takes at least the timing model's transfer time of the bytes the
// blocks stand for, the metrics count those bytes, D's import enters its prefix cache with
// KV events as a real one does, and the decode matches an aggregated sim engine.
func TestKVTransferSimModelled(t *testing.T) {
	env := newPeerEnv(t)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	// A slow modelled link, so that the modelled time dwarfs loopback's.
	timing := sim.Timing{PrefillPerToken: 0.01, DecodeBase: 0.2, TransferBase: 20, TransferPerMiB: 2000}
	salt := kvcache.Salt(modelName, "", "")
	startSim := func(name string) *peerNode {
		be := cpu.New(1)
		m, err := model.Load(path, be)
		if err != nil {
			t.Fatal(err)
		}
		tok := m.Tokenizer
		step, err := simstep.New(simstep.Config{Timing: timing, Vocab: m.Config.VocabSize,
			Skip: func(id int32) bool { return tok.IsEOG(id) || tok.IsControl(id) }})
		if err != nil {
			t.Fatal(err)
		}
		eng, err := engine.NewWithForwarder(m, step, engine.Config{KVBlocks: 128, BlockSize: 16, Salt: salt})
		if err != nil {
			t.Fatal(err)
		}
		return env.startEngine(name, path, m, eng, worker.Config{KVTransferTime: timing.Transfer}, func() { m.Close(); be.Close() })
	}
	p, d, agg := startSim("p"), startSim("d"), startSim("agg")
	pc, dc := env.dial(p), env.dial(d)
	f, err := p.eng.KVFormat()
	if err != nil || !f.Modelled() || f.BlockBytes() == 0 {
		t.Fatalf("sim format %v (modelled %v): %v", f, f.Modelled(), err)
	}
	bb := f.BlockBytes()
	prompt := p.m.Tokenizer.Encode(strings.Repeat("Lily and Ben played in the park with a big red ball. ", 6), true, false)
	blocks := len(prompt) / 16
	modelled := timing.Transfer(int64(blocks * bb))
	t.Logf("%d blocks of %d modelled bytes: %v modelled", blocks, bb, modelled)

	// Over the wire, straight from P: every block, in order, with its hash and a checksum
	// of what is sent, which is nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rep cluster.PrefillReply
	err = pc.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{Generate: cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: 8}}}, &rep)
	if err != nil || rep.Handle == 0 || rep.Blocks != blocks || rep.Layout.Store != engine.SimStore {
		t.Fatalf("prefill: %+v, %v", rep, err)
	}
	hashes := kvcache.HashBlocks(salt, prompt, 16, nil)
	t0 := time.Now()
	cs, err := pc.Stream(ctx, cluster.MethodPullKV, &cluster.PullRequest{Handle: rep.Handle, Layout: rep.Layout, Hashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	n, payload := 0, 0
	for {
		var blk cluster.KVBlock
		err := cs.RecvMsg(&blk)
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil {
			err = blk.Verify()
		}
		if err != nil {
			t.Fatalf("block %d: %v", n, err)
		}
		if n >= blocks || blk.Index != n || blk.Hash != hashes[n] {
			t.Fatalf("block %d: index %d, hash %#x; want %d of %d, %#x", n, blk.Index, blk.Hash, n, blocks, hashes[min(n, blocks-1)])
		}
		n, payload = n+1, payload+len(blk.Data)
	}
	elapsed := time.Since(t0)
	cs.Close()
	if n != blocks || payload != 0 {
		t.Errorf("pulled %d blocks carrying %d payload bytes; want %d carrying none", n, payload, blocks)
	}
	if elapsed < modelled {
		t.Errorf("the pull took %v, less than the modelled %v", elapsed, modelled)
	}
	if got := testutil.ToFloat64(p.met.Bytes.WithLabelValues("sent")); got != float64(blocks*bb) {
		t.Errorf("P counted %v bytes sent, want the modelled %d", got, blocks*bb)
	}
	var rel cluster.ReleaseReply
	if err := pc.Call(ctx, cluster.MethodReleaseKV, &cluster.ReleaseRequest{Handle: rep.Handle}, &rel); err != nil || !rel.Released {
		t.Errorf("release: %+v %v", rel, err)
	}
	p.idle(t)

	// The whole flow: P prefills (from its cache now), D pulls everything and decodes.
	const maxTokens = 12
	want := reference(t, agg, prompt, maxTokens)
	events, stopEvents := d.eng.Pool().Subscribe(1024)
	defer stopEvents()
	t0 = time.Now()
	got, usage, err := disagg(t, pc, dc, p, prompt, maxTokens, cluster.KVSource{})
	elapsed = time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("disaggregated %v\naggregated    %v", got, want)
	}
	if elapsed < modelled {
		t.Errorf("the disaggregated request took %v, less than the modelled transfer %v", elapsed, modelled)
	}
	if usage.CachedTokens != 0 || usage.CompletionTokens != maxTokens-1 {
		t.Errorf("D's usage %+v: nothing was cached on D before the transfer", usage)
	}
	if got := testutil.ToFloat64(d.met.Pulls.WithLabelValues("ok")); got != 1 {
		t.Errorf("D's successful pulls %v, want 1", got)
	}
	if got := testutil.ToFloat64(d.met.Blocks.WithLabelValues("received")); got != float64(blocks) {
		t.Errorf("D received %v blocks, want %d", got, blocks)
	}
	if got := testutil.ToFloat64(d.met.Bytes.WithLabelValues("received")); got != float64(blocks*bb) {
		t.Errorf("D counted %v bytes received, want the modelled %d", got, blocks*bb)
	}
	// D's prefix cache announced the imported blocks, as if computed there.
	stored := map[uint64]bool{}
	for len(stored) < blocks {
		select {
		case ev := <-events:
			if ev.Kind == kvcache.EventStored {
				for _, h := range ev.Hashes {
					stored[h] = true
				}
			}
			continue
		default:
		}
		break
	}
	for i, h := range hashes {
		if !stored[h] {
			t.Errorf("no KV event on D stored the prompt's block %d (%#x)", i, h)
		}
	}
	p.idle(t)
	d.idle(t)
}
