package engine

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"tandem/kvcache"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/sched"
)

// Stats counts what the scheduler holds: admitted sequences split into prefilling and
// decoding, their uncomputed prompt tokens and blocks, and the queue.
func TestStatsPublish(t *testing.T) {
	m, be := loadStories(t)
	e, err := New(m, be, Config{KVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	toks := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(1 + i%50)
		}
		return out
	}
	// a: a 40-token prompt, 16 computed (mid chunked prefill).
	a := &sequence{Seq: sched.Seq{Tokens: toks(40), PromptLen: 40, KV: e.pool.NewSeq(0)}}
	if err := a.KV.Reserve(40); err != nil {
		t.Fatal(err)
	}
	a.KV.Commit(a.Tokens[:16])
	// b: a 10-token prompt and 3 generated tokens, decoding (all but the last computed).
	b := &sequence{Seq: sched.Seq{Tokens: toks(13), PromptLen: 10, KV: e.pool.NewSeq(0)}, firstToken: time.Now()}
	if err := b.KV.Reserve(13); err != nil {
		t.Fatal(err)
	}
	b.KV.Commit(b.Tokens[:12])
	// c: queued.
	c := &sequence{Seq: sched.Seq{Tokens: toks(7), PromptLen: 7}}
	e.publishSeqs([]*sequence{a, b}, []*sequence{c})
	e.stepDone(3*time.Millisecond, 17)

	got := e.Stats()
	want := Stats{Census: sched.Census{Running: 2, Prefilling: 1, Waiting: 1, PrefillTokens: 24, WaitingTokens: 7, DecodeBlocks: 3 + 1},
		Step: 1, KVUsed: 4, KVBlocks: 64, KVUsage: 4.0 / 64, LastStep: 3 * time.Millisecond, LastStepTokens: 17, Steps: 1,
		BlockPrefillMicros: 3000 * 16 / 17} // the step's 17 prompt tokens in 3 ms: the measured cost of a block
	if got != want {
		t.Errorf("stats\n got %+v\nwant %+v", got, want)
	}
	// A later publish keeps the step timings.
	a.KV.Release()
	b.KV.Release()
	e.publish()
	if got := e.Stats(); got != (Stats{Step: 1, KVBlocks: 64, LastStep: 3 * time.Millisecond, LastStepTokens: 17, Steps: 1, BlockPrefillMicros: want.BlockPrefillMicros}) {
		t.Errorf("idle stats %+v", got)
	}
}

// On a running engine, Stats shows the sequences while they run and the last step's
// timing, and returns to idle afterwards; reading it concurrently is safe.
func TestStatsLive(t *testing.T) {
	m, be := loadStories(t)
	e, err := New(m, be, Config{MaxSeqs: 1, KVBlocks: 256})
	if err != nil {
		t.Fatal(err)
	}
	// The scheduler never waits for its clients, so the test holds its forward passes to
	// look at a state that would otherwise last a few milliseconds.
	held := runHeld(t, e, false)
	if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.Steps != 0 || st.KVBlocks != 256 {
		t.Fatalf("fresh engine: %+v", st)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a reader racing the scheduler (meaningful under -race)
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = e.Stats()
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prompt := m.Tokenizer.Encode("Once upon a time, there was a little girl named Lily.", true, false)
	// Held from the start and let through one pass at a time: free-running, s1 could
	// finish its tokens before the test looks.
	held.hold(true)
	s1, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: 200, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the prefill's token, then a decode step's
		held.step()
		if _, err := s1.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	// MaxSeqs 1: s2 waits behind s1. One more pass lets the scheduler take s2 in; the
	// next one holds the state still.
	held.step()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.Running == 1 && st.Waiting == 1 && st.WaitingTokens == len(prompt) && st.Steps > 0 &&
			st.LastStep > 0 && st.LastStepTokens == 1 && st.DecodeBlocks > 0 && st.KVUsed >= st.DecodeBlocks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("while one runs and one waits: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	held.hold(false)
	s1.Close()
	collect(t, s2)
	waitIdle(t, e)
	deadline = time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.Prefilling == 0 && st.PrefillTokens == 0 && st.DecodeBlocks == 0 && st.KVUsed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle engine: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// Publishing allocates nothing.
func TestStatsNoAlloc(t *testing.T) {
	m, be := loadStories(t)
	e, err := New(m, be, Config{KVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	running := []*sequence{{Seq: sched.Seq{Tokens: make([]int32, 8), PromptLen: 8, KV: e.pool.NewSeq(0)}}}
	if n := testing.AllocsPerRun(100, func() { e.publishSeqs(running, nil); e.stepDone(time.Millisecond, 8); _ = e.Stats() }); n != 0 {
		t.Errorf("%v allocations per publish+Stats", n)
	}
}

// runHeld runs e with its forward passes behind a heldForwarder, held from the start or
// not, until the test ends.
func runHeld(t *testing.T, e *Engine, hold bool) *heldForwarder {
	held := &heldForwarder{f: e.fwd, held: hold}
	held.cond = sync.NewCond(&held.mu)
	e.fwd = held
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { e.Run(runCtx); close(runDone) }()
	t.Cleanup(func() { held.hold(false); stopRun(); <-runDone })
	return held
}

// heldForwarder runs f's forward passes except while held; step lets one through.
type heldForwarder struct {
	f       Forwarder
	mu      sync.Mutex
	cond    *sync.Cond
	held    bool
	allow   int
	waiting int // forward passes waiting
}

func (h *heldForwarder) hold(on bool) {
	h.mu.Lock()
	h.held = on
	h.mu.Unlock()
	h.cond.Broadcast()
}

func (h *heldForwarder) step() {
	h.mu.Lock()
	h.allow++
	h.mu.Unlock()
	h.cond.Broadcast()
}

// parked reports whether a forward pass waits to be let through.
func (h *heldForwarder) parked() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting > 0 && h.allow == 0
}

func (h *heldForwarder) Forward(b *model.Batch, logits []float32) error {
	h.mu.Lock()
	for h.held && h.allow == 0 {
		h.waiting++
		h.cond.Wait()
		h.waiting--
	}
	if h.held {
		h.allow--
	}
	h.mu.Unlock()
	return h.f.Forward(b, logits)
}

// Every step's tokens are split into prompt and decode tokens: over a run, the decode
// tokens are each request's generated tokens but its last (which is never computed) and
// the prompt tokens are the prompts' uncached tokens, however chunked; one observation of
// each per step.
func TestStepComposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	met := metrics.NewEngine(reg, "stories")
	e, m := startEngine(t, Config{MaxBatchTokens: 5, Metrics: met})
	_, last := runConcurrently(t, e, m, 12)
	wantPrefill, wantDecode := 0, 0
	for _, ev := range last {
		wantPrefill += ev.Usage.PromptTokens - ev.Usage.CachedTokens
		wantDecode += ev.Usage.CompletionTokens - 1
	}
	waitIdle(t, e)
	hist := map[string]*dto.Histogram{}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if h := f.GetMetric()[0].GetHistogram(); h != nil {
			hist[f.GetName()] = h
		}
	}
	pre, dec, all := hist["tandem:iteration_prefill_tokens"], hist["tandem:iteration_decode_tokens"], hist["tandem:iteration_tokens_total"]
	if pre.GetSampleSum() != float64(wantPrefill) || dec.GetSampleSum() != float64(wantDecode) {
		t.Errorf("prefill tokens %v, decode tokens %v; want %d and %d", pre.GetSampleSum(), dec.GetSampleSum(), wantPrefill, wantDecode)
	}
	if pre.GetSampleCount() != all.GetSampleCount() || dec.GetSampleCount() != all.GetSampleCount() || all.GetSampleSum() != float64(wantPrefill+wantDecode) {
		t.Errorf("steps: prefill %d, decode %d, all %d (%v tokens)", pre.GetSampleCount(), dec.GetSampleCount(), all.GetSampleCount(), all.GetSampleSum())
	}
}

// A request's first and last events carry the step that produced them, and every Stats
// taken after step S counts exactly the requests whose first event's step is above S as
// waiting and those between their first and last events as decoding: the comparison a
// router makes between a load report and the events it has seen is exact, whatever order
// it meets them in (docs/routing.md, "A report against the events the router has seen").
func TestStepNumbersMatchStats(t *testing.T) {
	m, be := loadStories(t)
	e, err := New(m, be, Config{MaxSeqs: 2, KVBlocks: 256})
	if err != nil {
		t.Fatal(err)
	}
	held := runHeld(t, e, true) // every request queued before the first step

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prompt := m.Tokenizer.Encode("Once upon a time, there was a little girl named Lily.", true, false)
	maxTokens := []int{1, 5, 2, 9, 1, 4}
	streams := make([]llm.Stream, len(maxTokens))
	for i, n := range maxTokens {
		p := append(slices.Clone(prompt), int32(10+i)) // no two prompts alike
		if streams[i], err = e.Generate(ctx, &llm.Request{Prompt: p, MaxTokens: n, IgnoreEOS: true}); err != nil {
			t.Fatal(err)
		}
	}
	type snap struct {
		step              uint64
		waiting, decoding int
	}
	var snaps []snap
	var reads atomic.Int64
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			reads.Add(1)
			st := e.Stats()
			l := st.Census.Load(kvcache.Stats{})
			s := snap{st.Step, l.Waiting, l.Running}
			if len(snaps) == 0 || snaps[len(snaps)-1] != s {
				snaps = append(snaps, s)
			}
		}
	}()
	// One pass at a time, each once the last one's events are out and the next pass waits
	// (its census published), and the reader has looked a few times since: it sees the
	// states between the passes however the machine schedules it.
	pacerDone := make(chan struct{})
	go func() {
		defer close(pacerDone)
		wait := func(cond func() bool, d time.Duration) {
			for deadline := time.Now().Add(d); !cond() && time.Now().Before(deadline); {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Microsecond):
				}
			}
		}
		for {
			wait(held.parked, 200*time.Millisecond)
			from := reads.Load()
			wait(func() bool { return reads.Load() >= from+3 }, time.Second)
			select {
			case <-stop:
				return
			default:
				held.step()
			}
		}
	}()
	first := make([]uint64, len(streams))
	last := make([]uint64, len(streams))
	for i, s := range streams {
		for k := 0; ; k++ {
			ev, err := s.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case k == 0:
				first[i] = ev.Step
			case ev.Finish == "" && ev.Step != 0:
				t.Errorf("request %d: token %d carries step %d", i, k, ev.Step)
			}
			if ev.Finish != "" {
				last[i] = ev.Step
			}
		}
		// One token per step: a request of n tokens ends n-1 steps after its first at least.
		if n := uint64(maxTokens[i]); first[i] < 2 || last[i] < first[i]+n-1 || n == 1 && last[i] != first[i] {
			t.Errorf("request %d (%d tokens): first event at step %d, last at %d", i, maxTokens[i], first[i], last[i])
		}
	}
	waitIdle(t, e)
	for deadline := time.Now().Add(10 * time.Second); e.Stats().Step < slices.Max(last); {
		if time.Now().After(deadline) {
			t.Fatalf("no census after the last event's step %d: %+v", slices.Max(last), e.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // a few more snapshots of the idle engine
	close(stop)
	<-polled
	<-pacerDone
	held.hold(false)
	if len(snaps) < 8 {
		t.Fatalf("only %d distinct snapshots: %v", len(snaps), snaps)
	}
	for _, s := range snaps {
		var waiting, decoding int
		for i := range streams {
			switch {
			case s.step < first[i]:
				waiting++
			case s.step < last[i]:
				decoding++
			}
		}
		if s.waiting != waiting || s.decoding != decoding {
			t.Errorf("after step %d: %d waiting, %d decoding; the events say %d and %d (first steps %v, last %v)",
				s.step, s.waiting, s.decoding, waiting, decoding, first, last)
		}
	}
}
