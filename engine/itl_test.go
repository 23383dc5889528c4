package engine

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"tandem/llm"
	"tandem/sched"
	"tandem/sim"
)

// stoppedClock never moves: the engine measures every step as taking no time, which its
// live correction ignores, so the profile alone cuts the prompt chunks.
type stoppedClock struct{}

func (stoppedClock) Now() time.Time { return time.Unix(0, 0) }

// Under an ITL target, prompts that arrive while a stream decodes are read in chunks cut
// to the target, and every output is what the prompt gives alone (batch invariance).
func TestITLTargetKeepsOutputs(t *testing.T) {
	m, be := loadStories(t)
	// 1 ms a prompt token, 1 ms + 1 ms a sequence for decodes: with a 12 ms target and
	// a few streams, a step reads well under 10 prompt tokens.
	cost := sim.Timing{PrefillPerToken: 1, DecodeBase: 1, DecodePerSeq: 1}
	cut := 0
	e, err := New(m, be, Config{KVBlocks: 256, ITLTarget: 12 * time.Millisecond, Cost: cost, StepClock: stoppedClock{},
		OnPlan: func(p fmt.Stringer) {
			plan := p.(*sched.Plan[*sequence])
			if !slices.ContainsFunc(plan.Chunks, sched.Chunk[*sequence].Decode) {
				return
			}
			for _, c := range plan.Chunks {
				if c.N > 1 && c.From+c.N < len(c.Seq.Tokens) {
					cut++ // the budget of 512 holds every prompt: the target cut it
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	want := solo(t, m, 20)
	streams := make([]llm.Stream, len(prompts))
	submit := func(i int) {
		s, err := e.Generate(context.Background(), &llm.Request{Prompt: m.Tokenizer.Encode(prompts[i], true, false), MaxTokens: 20})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	submit(0)
	// Step by hand: the first prompt decodes when the others arrive.
	for step := 0; step < 2000 && (step < 3 || !e.sched.Idle()); step++ {
		if step == 2 {
			for i := 1; i < len(prompts); i++ {
				submit(i)
			}
		}
		e.intake()
		e.reap()
		if _, err := e.step(); err != nil {
			t.Fatal(err)
		}
	}
	if !e.sched.Idle() {
		t.Fatal("the engine did not finish the requests")
	}
	for i, s := range streams {
		if got, _ := collect(t, s); !slices.Equal(got, want[i]) {
			t.Errorf("prompt %d: under the target %v, alone %v", i, got, want[i])
		}
	}
	if cut == 0 {
		t.Error("no prompt chunk was cut to the target; the test does not test it")
	}
}

// The engine corrects its step cost with the steps it measures: a profile a thousand
// times too slow is brought down by orders of magnitude within a few requests, and the
// engine says once that the profile is off. The correction allocates nothing.
func TestEngineCorrectsItsStepCost(t *testing.T) {
	m, be := loadStories(t)
	var logs bytes.Buffer
	cost := sim.Timing{PrefillBase: 1000, PrefillPerToken: 10, DecodeBase: 1000, DecodePerSeq: 10}
	e, err := New(m, be, Config{KVBlocks: 256, ITLTarget: time.Second, Cost: cost,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	for i := range 4 {
		s, err := e.Generate(ctx, &llm.Request{Prompt: m.Tokenizer.Encode(prompts[i], true, false), MaxTokens: 30, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		collect(t, s)
	}
	cancel()
	<-done // the correction and the log are Run's
	decode := sched.StepShape{DecodeSeqs: 1, KVTokens: 20}
	if got, base := e.cost.Step(decode), cost.Step(decode); got > base/100 {
		t.Errorf("a decode step is predicted %v after 120 decodes measured, the profile says %v", got, base)
	}
	if n := strings.Count(logs.String(), "steps=decode"); n != 1 {
		t.Errorf("the profile's decode cost is off by %d× and was reported %d times, want once:\n%s",
			int(cost.Step(decode)/max(e.Stats().LastStep, 1)), n, logs.String())
	}
	if n := testing.AllocsPerRun(100, func() { e.cost.Observe(decode, time.Millisecond); e.costDrift() }); n != 0 {
		t.Errorf("%v allocations per correction", n)
	}
}
