package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"tandem/llm"
	"tandem/model"
)

// gatedForward runs each forward step only once the test lets it (one value on gate, or
// gate closed), and notes when each step ended: the engine commits the step's KV right
// after.
type gatedForward struct {
	inner Forwarder
	gate  chan struct{}

	mu   sync.Mutex
	ends []time.Time
}

func (g *gatedForward) Forward(b *model.Batch, logits []float32) error {
	if g.gate != nil {
		<-g.gate
	}
	err := g.inner.Forward(b, logits)
	g.mu.Lock()
	g.ends = append(g.ends, time.Now())
	g.mu.Unlock()
	return err
}

// gatedEngine runs an engine on a random-weight llama fixture (context 2048) whose steps go
// through a gatedForward.
func gatedEngine(tb testing.TB, cfg Config, gate chan struct{}) (*Engine, *gatedForward) {
	tb.Helper()
	m, be := loadFixture(tb, "rand-llama-tok512-f32.gguf", 1)
	if cfg.KVBlocks == 0 {
		cfg.KVBlocks = 256
	}
	e, err := New(m, be, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	g := &gatedForward{inner: e.fwd, gate: gate}
	e.fwd = g
	runEngine(tb, e)
	return e, g
}

// randomPrompt is n tokens of the tok512 vocabulary; different seeds share no block.
func randomPrompt(seed uint64, n int) []int32 {
	r := rand.New(rand.NewPCG(seed, 1))
	p := make([]int32, n)
	p[0] = 1 // BOS
	for i := 1; i < n; i++ {
		p[i] = int32(3 + r.IntN(500))
	}
	return p
}

// exported is one block as ExportBlocks handed it over.
type exported struct {
	index int
	hash  uint64
}

// receive waits for the next exported block, failing the test after a generous bound (a
// hang guard, not a timing assertion).
func receive(t *testing.T, got <-chan exported, what string) exported {
	t.Helper()
	select {
	case b := <-got:
		return b
	case <-time.After(20 * time.Second):
		t.Fatalf("no block after 20 s: %s", what)
	}
	panic("unreachable")
}

// returned waits for ExportBlocks's result, with the same guard.
func returned(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("ExportBlocks did not return within 20 s: %s", what)
	}
	panic("unreachable")
}

// startHeld starts a held prefill of a prompt of blocks full blocks (and a partial one) on
// p and returns its handle, its wait and its prompt's block hashes.
func startHeld(t *testing.T, ctx context.Context, p *Engine, seed uint64, blocks int) (uint64, func() (*PrefillResult, error), []uint64) {
	t.Helper()
	h, wait, err := p.StartPrefill(ctx, &llm.Request{Prompt: randomPrompt(seed, blocks*16+5), MaxTokens: 4}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p.held.mu.Lock()
	hashes := slices.Clone(p.held.m[h].prompt)
	p.held.mu.Unlock()
	return h, wait, hashes
}

// exportAsync runs ExportBlocks of hashes in a goroutine: the blocks go to the returned
// channel as they are handed over, the result to the second.
func exportAsync(ctx context.Context, p *Engine, h uint64, hashes []uint64) (<-chan exported, <-chan error) {
	got := make(chan exported, len(hashes))
	errc := make(chan error, 1)
	go func() {
		errc <- p.ExportBlocks(ctx, h, hashes, func(i int, hash uint64, data []byte) error {
			got <- exported{i, hash}
			return nil
		})
	}()
	return got, errc
}

// A long prompt prefilled one block per step, the steps released one at a time: the
// exporter hands over each block after the step that computed it and before the next step
// runs (so no wake-up is missed: a missed one would hang here), every block in order; then an
// exporter waiting for blocks returns as soon as its context is cancelled, and one whose
// prefill is cancelled returns ErrNotHeld even though nobody waits for the prefill's result.
func TestExportStreamsBlocksAsCommitted(t *testing.T) {
	const blocks = 24
	gate := make(chan struct{})
	p, _ := gatedEngine(t, Config{MaxBatchTokens: 16}, gate)
	h, wait, hashes := startHeld(t, context.Background(), p, 1, blocks)
	if len(hashes) != blocks {
		t.Fatalf("%d prompt blocks, want %d", len(hashes), blocks)
	}
	got, errc := exportAsync(context.Background(), p, h, hashes)
	for i := range blocks {
		gate <- struct{}{} // step i computes block i
		b := receive(t, got, "streaming the prefill")
		if b.index != i || b.hash != hashes[i] {
			t.Fatalf("block %d (%#x) after step %d, want block %d (%#x)", b.index, b.hash, i, i, hashes[i])
		}
	}
	if err := returned(t, errc, "after the last block"); err != nil {
		t.Fatal(err)
	}

	// A second exporter of the same (still running) prefill, asking for blocks it has
	// all of: it sends them from the prefix cache without waiting.
	n := 0
	if err := p.ExportBlocks(context.Background(), h, hashes[:3], func(int, uint64, []byte) error { n++; return nil }); err != nil || n != 3 {
		t.Fatalf("export of computed blocks: %d sent, %v", n, err)
	}
	close(gate) // the rest of the prefill runs freely
	res, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Hashes, hashes) {
		t.Errorf("held hashes differ from the exported ones")
	}
	p.ReleaseHeld(h)
	waitIdle(t, p)

	t.Run("exporter cancelled", func(t *testing.T) {
		gate := make(chan struct{})
		p, _ := gatedEngine(t, Config{MaxBatchTokens: 16}, gate)
		h, wait, hashes := startHeld(t, context.Background(), p, 2, blocks)
		ctx, cancel := context.WithCancel(context.Background())
		got, errc := exportAsync(ctx, p, h, hashes)
		gate <- struct{}{}
		gate <- struct{}{}
		receive(t, got, "block 0")
		receive(t, got, "block 1")
		cancel() // the exporter is waiting for block 2, which the gate holds back
		if err := returned(t, errc, "after its context was cancelled"); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled export: %v, want context.Canceled", err)
		}
		close(gate)
		if _, err := wait(); err != nil {
			t.Fatal(err)
		}
		p.ReleaseHeld(h)
		waitIdle(t, p)
	})

	t.Run("prefill cancelled", func(t *testing.T) {
		gate := make(chan struct{})
		p, _ := gatedEngine(t, Config{MaxBatchTokens: 16}, gate)
		ctx, cancel := context.WithCancel(context.Background())
		h, _, hashes := startHeld(t, ctx, p, 3, blocks)
		got, errc := exportAsync(context.Background(), p, h, hashes)
		gate <- struct{}{}
		receive(t, got, "block 0")
		cancel()    // the prefill's caller goes away (and never asks for its result)
		close(gate) // the scheduler runs on and drops the sequence
		if err := returned(t, errc, "after the prefill was cancelled"); !errors.Is(err, ErrNotHeld) {
			t.Errorf("export of a cancelled prefill: %v, want ErrNotHeld", err)
		}
		// Nobody calls wait or ReleaseHeld: the engine forgets the handle by itself.
		if held, _ := p.HeldStats(); held != 0 {
			t.Errorf("%d handles held after the prefill's caller went away, want 0", held)
		}
		if p.ReleaseHeld(h) {
			t.Errorf("handle %d still held after its prefill was cancelled", h)
		}
		waitIdle(t, p)
	})
}

// BenchmarkExportLag measures how long after the step that computes a block ExportBlocks
// hands it over, while the prefill runs: one op is the export of a 20-block prompt prefilled
// one block per step, each step taking the model's time plus 5 ms (a slower model's chunk).
// lag_us is the mean over the blocks, lag_max_us the worst.
//
//	go test -run x -bench ExportLag -count 5 ./engine
func BenchmarkExportLag(b *testing.B) {
	const blocks = 20
	p, g := gatedEngine(b, Config{MaxBatchTokens: 16}, nil)
	g.inner = slowForward{g.inner, 5 * time.Millisecond}
	var lags []time.Duration
	seed := uint64(100)
	for b.Loop() {
		seed++
		prompt := randomPrompt(seed, blocks*16+5)
		g.mu.Lock()
		g.ends = g.ends[:0]
		g.mu.Unlock()
		h, wait, err := p.StartPrefill(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: 1}, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		p.held.mu.Lock()
		hashes := slices.Clone(p.held.m[h].prompt)
		p.held.mu.Unlock()
		at := make([]time.Time, blocks)
		err = p.ExportBlocks(context.Background(), h, hashes, func(i int, hash uint64, data []byte) error {
			at[i] = time.Now()
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := wait(); err != nil {
			b.Fatal(err)
		}
		p.ReleaseHeld(h)
		g.mu.Lock()
		for i := range blocks { // step i computed block i
			lags = append(lags, at[i].Sub(g.ends[i]))
		}
		g.mu.Unlock()
	}
	var sum time.Duration
	for _, l := range lags {
		sum += l
	}
	b.ReportMetric(float64(sum.Microseconds())/float64(len(lags)), "lag_us")
	b.ReportMetric(float64(slices.Max(lags).Microseconds()), "lag_max_us")
}

// slowForward adds a fixed time to every step.
type slowForward struct {
	inner Forwarder
	d     time.Duration
}

func (s slowForward) Forward(b *model.Batch, logits []float32) error {
	time.Sleep(s.d)
	return s.inner.Forward(b, logits)
}
