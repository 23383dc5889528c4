// Package simstep is the sim backend's forward step (sleeps sim.Timing's time, writes deterministic
// logits) and the profiler that times any forward step over batch shapes for `tandem profile`.
package simstep

import (
	"fmt"
	"time"

	"tandem/model"
	"tandem/sim"
)

// Clock is what the step waits on; real time by default. Tests use a virtual
// clock, so that a profile of the step is exact and does not depend on load.
type Clock interface {
	Now() time.Time
	Sleep(time.Duration)
}

type realClock struct{}

func (realClock) Now() time.Time        { return time.Now() }
func (realClock) Sleep(d time.Duration) { time.Sleep(d) }

// RealClock is the wall clock.
func RealClock() Clock { return realClock{} }

// Config configures a Step.
type Config struct {
	Timing sim.Timing
	Vocab  int // the model's vocabulary size: the width of a logits row
	// Skip reports tokens never chosen (end-of-generation and control tokens), so that
	// a simulated sequence runs to its max_tokens as an ignore_eos one would; nil skips none.
	Skip  func(id int32) bool
	Seed  uint64
	Clock Clock // nil: the wall clock
}

// Step is a timed stand-in for a model's forward pass (an engine.Forwarder). A step
// takes Timing.Step of its shape, counted from when Forward is called; the chosen
// token after a position is a pseudo-random function of that position and the token
// there, so a sequence's output depends on itself alone (batch-invariant) and
// repeats from run to run. Not safe for concurrent use (nor is the engine's step).
type Step struct {
	cfg    Config
	shape  sim.StepShape
	counts []int32 // per sequence of the batch: tokens, and the last position + 1
	ctx    []int32
}

// New returns a Step.
func New(cfg Config) (*Step, error) {
	if cfg.Vocab < 1 {
		return nil, fmt.Errorf("simstep: vocabulary size %d", cfg.Vocab)
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Skip != nil {
		free := false
		for id := range cfg.Vocab {
			if !cfg.Skip(int32(id)) {
				free = true
				break
			}
		}
		if !free {
			return nil, fmt.Errorf("simstep: every token of the vocabulary is skipped")
		}
	}
	return &Step{cfg: cfg}, nil
}

// LastShape is the shape of the last step.
func (s *Step) LastShape() sim.StepShape { return s.shape }

// Shape is the timing model's view of batch b.
func Shape(b *model.Batch, counts, ctx []int32) (sim.StepShape, []int32, []int32) {
	n := len(b.Attn.Blocks)
	counts, ctx = grow(counts, n), grow(ctx, n)
	for i, q := range b.Attn.SeqOf {
		counts[q]++
		ctx[q] = max(ctx[q], b.Attn.Pos[i]+1)
	}
	var sh sim.StepShape
	for i := range n {
		if counts[i] > 0 {
			sh.Add(int(counts[i]), int(ctx[i]))
		}
	}
	return sh, counts, ctx
}

func grow(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// chosenLogit is far enough above the other logits (0) that sampling picks the
// chosen token at any allowed temperature (≤ 100) and logit bias (≤ 100).
const chosenLogit = 1e4

// Forward implements engine.Forwarder.
func (s *Step) Forward(b *model.Batch, logits []float32) error {
	t0 := s.cfg.Clock.Now()
	v := s.cfg.Vocab
	if len(logits) < len(b.Outputs)*v {
		return fmt.Errorf("simstep: %d logits for %d outputs of %d", len(logits), len(b.Outputs), v)
	}
	if len(b.Attn.Pos) != len(b.Tokens) || len(b.Attn.SeqOf) != len(b.Tokens) {
		return fmt.Errorf("simstep: batch of %d tokens with %d positions and %d owners", len(b.Tokens), len(b.Attn.Pos), len(b.Attn.SeqOf))
	}
	s.shape, s.counts, s.ctx = Shape(b, s.counts, s.ctx)
	for o, i := range b.Outputs {
		row := logits[o*v : (o+1)*v]
		clear(row)
		row[s.choose(b.Tokens[i], b.Attn.Pos[i])] = chosenLogit
	}
	if n := len(b.Outputs); b.Hidden != nil && n > 0 {
		// Deterministic hidden states of the token and its position, in [-1, 1).
		width := len(b.Hidden) / n
		for o, i := range b.Outputs {
			seed := s.cfg.Seed ^ uint64(uint32(b.Tokens[i]))<<32 ^ uint64(uint32(b.Attn.Pos[i]))
			for j, row := 0, b.Hidden[o*width:(o+1)*width]; j < width; j++ {
				row[j] = float32(splitmix(seed+uint64(j))>>40)/(1<<23) - 1
			}
		}
	}
	if d := s.cfg.Timing.Step(s.shape) - s.cfg.Clock.Now().Sub(t0); d > 0 {
		s.cfg.Clock.Sleep(d)
	}
	return nil
}

// choose is the token that follows tok at pos.
func (s *Step) choose(tok, pos int32) int32 {
	v := uint64(s.cfg.Vocab)
	id := int32(splitmix(s.cfg.Seed^uint64(uint32(tok))<<32^uint64(uint32(pos))) % v)
	for s.cfg.Skip != nil && s.cfg.Skip(id) { // New checked that some token is not skipped
		id = int32((uint64(id) + 1) % v)
	}
	return id
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
