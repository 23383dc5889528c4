package sched

import (
	"math"
	"time"
)

// A StepShape is what one forward step computes, in the terms of a step's cost: the
// engine's profile (sim.Timing, which names this type sim.StepShape) and the scheduler's
// inter-token latency target both read it.
type StepShape struct {
	PrefillTokens int     // N: prompt tokens computed by sequences with more than one token in the step
	PrefillQuad   float64 // Σ nᵢ·ctxᵢ over those sequences
	DecodeSeqs    int     // B: sequences computing one token
	KVTokens      int     // K: Σ ctxᵢ over those sequences
}

// Add counts a sequence that computes n tokens and has ctx tokens of context
// after the step. A single token is a decode (it costs what a decode costs,
// whether or not it was sampled: a fully cached prompt's last token is one).
func (s *StepShape) Add(n, ctx int) {
	if n == 1 {
		s.DecodeSeqs++
		s.KVTokens += ctx
		return
	}
	s.PrefillTokens += n
	s.PrefillQuad += float64(n) * float64(ctx)
}

// prefillPart and decodePart split a mixed step into what each kind of work would cost
// alone.
func (s StepShape) prefillPart() StepShape {
	return StepShape{PrefillTokens: s.PrefillTokens, PrefillQuad: s.PrefillQuad}
}

func (s StepShape) decodePart() StepShape {
	return StepShape{DecodeSeqs: s.DecodeSeqs, KVTokens: s.KVTokens}
}

// A CostModel predicts how long a forward step of a given shape takes. sim.Timing (the
// fit `tandem profile` makes) is one; a LiveCost keeps one current from measured steps.
// Step must not decrease when a shape's counts grow.
type CostModel interface {
	Step(StepShape) time.Duration
}

// Kinds of steps a LiveCost corrects separately.
const (
	prefillOnly = iota
	decodeOnly
	mixed
)

// LiveCost is a CostModel kept current from the engine's own steps: a base model (the
// profile: fitted by `tandem profile`, or by the engine at start) whose prediction is
// multiplied by a correction factor for the step's kind (prefill only, decode only, or
// both). Each factor is an exponentially weighted geometric mean of measured ÷ predicted
// over the last steps of its kind (about LiveCostMemory of them), so it follows a machine
// whose speed drifts (other processes on its cores, thermal limits, a different memory
// placement) within a few seconds, while a single outlier (a page fault, a stall of the
// process) moves it by a few percent at most. Kinds are kept apart because a mixed step
// costs less than its parts alone (the weights are read once for both), which no factor
// of a part can express; the mixed prediction applies the parts' own factors first, so
// that what a prefill-only or decode-only step taught carries over.
//
// It is the correction, not a refit, because live steps come in few shapes (the batch
// changes slowly, prefill chunks are cut to the target), which pins a scale well and the
// profile's six parameters poorly. It is not safe for concurrent use.
type LiveCost struct {
	base  CostModel
	logf  [3]float64 // log of each kind's correction factor
	steps [3]int     // steps of each kind observed (saturating at LiveCostMemory)
}

// LiveCostMemory is the number of recent steps of a kind that a LiveCost's correction
// weighs: each new one weighs 1/LiveCostMemory (more while fewer have been seen).
const LiveCostMemory = 32

// maxStepRatio bounds how far one measured step can pull a correction: the ratio of
// measured to predicted time counts as at most this (or at least its inverse).
const maxStepRatio = 4

// NewLiveCost returns base corrected by nothing yet.
func NewLiveCost(base CostModel) *LiveCost { return &LiveCost{base: base} }

func kindOf(s StepShape) int {
	switch {
	case s.DecodeSeqs == 0:
		return prefillOnly
	case s.PrefillTokens == 0:
		return decodeOnly
	}
	return mixed
}

// Step is the base model's prediction times the correction of the shape's kind.
func (c *LiveCost) Step(s StepShape) time.Duration {
	return time.Duration(c.predict(s))
}

// predict is Step in nanoseconds, unrounded.
func (c *LiveCost) predict(s StepShape) float64 {
	switch kindOf(s) {
	case prefillOnly:
		return float64(c.base.Step(s)) * math.Exp(c.logf[prefillOnly])
	case decodeOnly:
		return float64(c.base.Step(s)) * math.Exp(c.logf[decodeOnly])
	}
	p := float64(c.base.Step(s.prefillPart())) * math.Exp(c.logf[prefillOnly])
	d := float64(c.base.Step(s.decodePart())) * math.Exp(c.logf[decodeOnly])
	return (p + d) * math.Exp(c.logf[mixed])
}

// Observe records that a step of shape s took d, and moves the correction of its kind
// towards it. An empty shape or a non-positive time is ignored.
func (c *LiveCost) Observe(s StepShape, d time.Duration) {
	if s.PrefillTokens == 0 && s.DecodeSeqs == 0 || d <= 0 {
		return
	}
	pred := c.predict(s)
	if pred <= 0 {
		return
	}
	k := kindOf(s)
	if c.steps[k] < LiveCostMemory {
		c.steps[k]++
	}
	e := math.Log(float64(d) / pred)
	e = max(-math.Log(maxStepRatio), min(e, math.Log(maxStepRatio)))
	c.logf[k] += e / float64(c.steps[k])
}

// Correction returns the factors the base model's predictions are multiplied by, for
// prefill-only, decode-only and mixed steps (a mixed step's is on top of the other two).
func (c *LiveCost) Correction() (prefill, decode, mix float64) {
	return math.Exp(c.logf[prefillOnly]), math.Exp(c.logf[decodeOnly]), math.Exp(c.logf[mixed])
}
