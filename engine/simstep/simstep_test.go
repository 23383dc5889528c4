package simstep

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"testing"
	"time"

	"tandem/engine"
	"tandem/gguf"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/modelgen"
	"tandem/sim"
)

// virtualClock advances only when slept on, so profiles of a Step are exact.
type virtualClock struct{ t time.Time }

func (c *virtualClock) Now() time.Time        { return c.t }
func (c *virtualClock) Sleep(d time.Duration) { c.t = c.t.Add(d) }

// TestProfileReproducesTiming is the check: a simulated worker with known
// parameters, profiled and fitted as `tandem profile` does, gives back its parameters
// within 5%, and the fitted model predicts every profiled step within 5%.
func TestProfileReproducesTiming(t *testing.T) {
	cases := []struct {
		name string
		tm   sim.Timing
	}{
		{"gpu", sim.GPUTiming()},
		{"cpu", sim.CPUTiming()},
		{"quadratic", sim.Timing{PrefillBase: 3, PrefillPerToken: 0.4, PrefillPerToken2: 0.002, DecodeBase: 12, DecodePerSeq: 0.7, DecodePerKVToken: 0.001}},
		{"no base", sim.Timing{PrefillPerToken: 0.1, DecodePerSeq: 2, DecodePerKVToken: 0.01}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &virtualClock{t: time.Unix(0, 0)}
			step, err := New(Config{Timing: tc.tm, Vocab: 300, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			plan := DefaultPlan(4096, 512, 64, 2)
			samples, err := Profile(context.Background(), step, 300, 16, plan, clock, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := len(plan.Prefill) + len(plan.Decode); len(samples) != want {
				t.Fatalf("%d samples, want %d", len(samples), want)
			}
			fit, err := sim.Fit(samples, nil, sim.Timing{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("fitted %+v", fit)
			got := []float64{fit.PrefillBase, fit.PrefillPerToken, fit.PrefillPerToken2, fit.DecodeBase, fit.DecodePerSeq, fit.DecodePerKVToken}
			want := []float64{tc.tm.PrefillBase, tc.tm.PrefillPerToken, tc.tm.PrefillPerToken2, tc.tm.DecodeBase, tc.tm.DecodePerSeq, tc.tm.DecodePerKVToken}
			names := []string{"prefill base", "prefill per token", "prefill per token²", "decode base", "decode per seq", "decode per KV token"}
			for i := range got {
				if math.Abs(got[i]-want[i]) > 0.05*want[i]+1e-9 {
					t.Errorf("%s: fitted %g, want %g ± 5%%", names[i], got[i], want[i])
				}
			}
			for _, s := range samples {
				if p := fit.Step(s.Shape); math.Abs(float64(p-s.Time)) > 0.05*float64(s.Time) {
					t.Errorf("shape %+v: fitted model predicts %v, the step took %v", s.Shape, p, s.Time)
				}
			}
		})
	}
}

func TestFitNeedsShapes(t *testing.T) {
	if _, err := sim.Fit([]sim.Sample{{Shape: sim.StepShape{PrefillTokens: 16, PrefillQuad: 256}, Time: time.Millisecond}}, nil, sim.Timing{}); err == nil {
		t.Fatal("a fit from one sample succeeded")
	}
}

func TestShape(t *testing.T) {
	// Sequence 0 computes 3 prompt tokens at 4..6, sequence 1 decodes at 9, sequence 2
	// computes the last token of a cached prompt at 20 (a decode, cost-wise).
	b := &model.Batch{
		Tokens: []int32{1, 2, 3, 4, 5},
		Attn:   hal.AttnBatch{Pos: []int32{4, 5, 6, 9, 20}, SeqOf: []int32{0, 0, 0, 1, 2}, Blocks: make([][]int32, 3)},
	}
	got, _, _ := Shape(b, nil, nil)
	want := sim.StepShape{PrefillTokens: 3, PrefillQuad: 3 * 7, DecodeSeqs: 2, KVTokens: 10 + 21}
	if got != want {
		t.Fatalf("shape %+v, want %+v", got, want)
	}
}

func TestForwardDeterministicAndBatchInvariant(t *testing.T) {
	clock := &virtualClock{}
	skip := func(id int32) bool { return id < 10 }
	s, err := New(Config{Timing: sim.GPUTiming(), Vocab: 50, Skip: skip, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	argmax := func(row []float32) int32 { return int32(slices.Index(row, slices.Max(row))) }
	alone := &model.Batch{Tokens: []int32{7, 8}, Outputs: []int{1},
		Attn: hal.AttnBatch{Pos: []int32{0, 1}, SeqOf: []int32{0, 0}, Blocks: make([][]int32, 1)}}
	l1 := make([]float32, 50)
	if err := s.Forward(alone, l1); err != nil {
		t.Fatal(err)
	}
	batched := &model.Batch{Tokens: []int32{3, 4, 5, 7, 8}, Outputs: []int{2, 4},
		Attn: hal.AttnBatch{Pos: []int32{0, 1, 2, 0, 1}, SeqOf: []int32{0, 0, 0, 1, 1}, Blocks: make([][]int32, 2)}}
	l2 := make([]float32, 100)
	if err := s.Forward(batched, l2); err != nil {
		t.Fatal(err)
	}
	if a, b := argmax(l1), argmax(l2[50:]); a != b || skip(a) {
		t.Fatalf("token alone %d, in a batch %d (skipped tokens are < 10)", a, b)
	}
	if clock.t.IsZero() {
		t.Fatal("the step did not take modelled time")
	}
	if _, err := New(Config{Vocab: 5, Skip: func(int32) bool { return true }}); err == nil {
		t.Fatal("a step that can choose no token was accepted")
	}
	if err := s.Forward(alone, l1[:10]); err == nil {
		t.Fatal("a short logits buffer was accepted")
	}
}

// demoModel is the built-in demo model, its weights unread.
func demoModel(t *testing.T) *model.Model {
	t.Helper()
	data, err := modelgen.DemoGGUF()
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(1)
	t.Cleanup(func() { be.Close() })
	m, err := model.FromGGUF(f, be)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEngineOnSimStep runs the real scheduler and KV cache over a Step: ignore_eos and
// plain requests alike run to max_tokens, outputs repeat, the prefix cache serves a
// repeated prompt, and the pool publishes KV events.
func TestEngineOnSimStep(t *testing.T) {
	m := demoModel(t)
	tok := m.Tokenizer
	step, err := New(Config{Timing: sim.Timing{PrefillPerToken: 0.01, DecodeBase: 0.5}, Vocab: m.Config.VocabSize,
		Skip: func(id int32) bool { return tok.IsEOG(id) || tok.IsControl(id) }})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.NewWithForwarder(m, step, engine.Config{KVBlocks: 64, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	events, cancelSub := e.Pool().Subscribe(1024)
	defer cancelSub()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	go func() { e.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()

	prompt := tok.Encode("a prompt long enough to fill a couple of sixteen-token KV blocks, and then some more", false, false)
	gen := func(ignoreEOS bool) ([]int32, llm.Usage) {
		s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: ignoreEOS})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		var last llm.Event
		for {
			ev, err := s.Next(ctx)
			if errors.Is(err, io.EOF) {
				return ids, last.Usage
			}
			if err != nil {
				t.Fatal(err)
			}
			ids, last = append(ids, ev.Token), ev
		}
	}
	a, ua := gen(true)
	b, ub := gen(false)
	if len(a) != 20 || !slices.Equal(a, b) {
		t.Fatalf("outputs %v and %v, want the same 20 tokens", a, b)
	}
	if ua.CachedTokens != 0 || ub.CachedTokens < 32 {
		t.Fatalf("cached prompt tokens %d then %d, want 0 then ≥ 32", ua.CachedTokens, ub.CachedTokens)
	}
	select {
	case ev := <-events:
		if ev.Kind != kvcache.EventStored || len(ev.Hashes) == 0 {
			t.Fatalf("first KV event %+v, want blocks stored", ev)
		}
	default:
		t.Fatal("no KV events")
	}
}

// TestSimDisaggregation: sim engines hold no KV memory, yet a prompt prefilled on one and
// imported by another through the engine's export/import path (blocks with no payload, in a
// modelled format that still stands for the model's block size) is found cached there, and
// the decode continues as one engine's would.
func TestSimDisaggregation(t *testing.T) {
	m := demoModel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := func() *engine.Engine {
		step, err := New(Config{Timing: sim.Timing{PrefillPerToken: 0.01, DecodeBase: 0.2}, Vocab: m.Config.VocabSize})
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.NewWithForwarder(m, step, engine.Config{KVBlocks: 64, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { e.Run(runCtx); close(done) }()
		t.Cleanup(func() { stop(); <-done })
		return e
	}
	agg, p, d := start(), start(), start()
	prompt := m.Tokenizer.Encode("a prompt of a few blocks, prefilled on one simulated worker and decoded on another one", false, false)
	req := func() *llm.Request { return &llm.Request{Prompt: prompt, MaxTokens: 8} }
	read := func(s llm.Stream) ([]int32, llm.Usage) {
		var ids []int32
		var u llm.Usage
		for {
			ev, err := s.Next(ctx)
			if errors.Is(err, io.EOF) {
				return ids, u
			}
			if err != nil {
				t.Fatal(err)
			}
			ids, u = append(ids, ev.Token), ev.Usage
		}
	}
	s, err := agg.Generate(ctx, req())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := read(s)

	fp, err := p.KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	fd, _ := d.KVFormat()
	if err := fd.Check(fp); err != nil || fp.BlockBytes() != m.KVLayout(1, 16).Layers*2*16*m.Config.KVHeads*m.Config.HeadDim*4 ||
		!fp.Modelled() || fp.WireBytes() != 0 {
		t.Fatalf("formats %v / %v (modelled %v, %d bytes on the wire): %v", fp, fd, fp.Modelled(), fp.WireBytes(), err)
	}
	res, err := p.Prefill(ctx, req(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	im, err := d.BeginImport(prompt)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = p.ExportBlocks(ctx, res.Handle, im.Missing(), func(i int, hash uint64, data []byte) error {
		if len(data) != 0 {
			t.Errorf("block of %d bytes, want no payload", len(data))
		}
		n++
		return im.Write(hash, slices.Clone(data))
	})
	if err != nil || n == 0 || n != len(res.Hashes) {
		t.Fatalf("exported %d of %d blocks: %v", n, len(res.Hashes), err)
	}
	im.Commit()
	p.ReleaseHeld(res.Handle)
	s, err = d.Generate(ctx, req())
	if err != nil {
		t.Fatal(err)
	}
	got, u := read(s)
	if !slices.Equal(got, want) || u.CachedTokens < 16*n {
		t.Fatalf("decode side: %v with %d cached tokens; aggregated %v, %d blocks imported", got, u.CachedTokens, want, n)
	}
}

// BenchmarkForward is the sim step's own cost (zero modelled time) on a 64-sequence decode
// batch of the demo model's vocabulary: what a simulated worker spends per step besides the
// scheduler. It should not allocate.
func BenchmarkForward(b *testing.B) {
	const seqs, vocab = 64, 512
	s, err := New(Config{Vocab: vocab, Clock: &virtualClock{}, Skip: func(id int32) bool { return id < 3 }})
	if err != nil {
		b.Fatal(err)
	}
	batch := &model.Batch{Attn: hal.AttnBatch{Blocks: make([][]int32, seqs)}}
	for i := range seqs {
		batch.Tokens = append(batch.Tokens, int32(i))
		batch.Attn.Pos = append(batch.Attn.Pos, int32(100+i))
		batch.Attn.SeqOf = append(batch.Attn.SeqOf, int32(i))
		batch.Outputs = append(batch.Outputs, i)
	}
	logits := make([]float32, seqs*vocab)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Forward(batch, logits); err != nil {
			b.Fatal(err)
		}
	}
}

// The quick profile an engine takes at start fits a step cost within the model's context
// and the engine's limits, however short the context: a 128-token one (the fixture's) once
// left too few shapes, and the engine fell back to the built-in profile.
func TestQuickPlanFitsWithinLimits(t *testing.T) {
	tm := sim.Timing{PrefillBase: 3, PrefillPerToken: 0.4, PrefillPerToken2: 0.002, DecodeBase: 12, DecodePerSeq: 0.7, DecodePerKVToken: 0.01}
	for _, c := range []struct{ context, batch, seqs int }{{32768, 512, 64}, {2048, 512, 64}, {128, 512, 64}, {128, 48, 4}, {64, 512, 64}} {
		plan := QuickPlan(c.context, c.batch, c.seqs)
		for _, s := range plan.Prefill {
			if s.Tokens < 2 || s.Tokens > c.batch || s.Context+s.Tokens > c.context {
				t.Errorf("%+v: prefill shape %+v outside the limits", c, s)
			}
		}
		for _, s := range plan.Decode {
			if s.Seqs > min(c.seqs, c.batch) || s.Context+1 > c.context {
				t.Errorf("%+v: decode shape %+v outside the limits", c, s)
			}
		}
		clock := &virtualClock{t: time.Unix(0, 0)}
		step, err := New(Config{Timing: tm, Vocab: 300, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		samples, err := Profile(context.Background(), step, 300, 16, plan, clock, nil)
		if err != nil {
			t.Fatal(err)
		}
		fit, err := sim.Fit(samples, nil, sim.CPUTiming())
		if err != nil {
			t.Errorf("%+v: %d prefill and %d decode shapes: %v", c, len(plan.Prefill), len(plan.Decode), err)
			continue
		}
		for _, s := range samples {
			if p := fit.Step(s.Shape); math.Abs(float64(p-s.Time)) > 0.05*float64(s.Time) {
				t.Errorf("%+v: shape %+v: the fit predicts %v, the step took %v", c, s.Shape, p, s.Time)
			}
		}
	}
}
