package sched

import (
	"math"
	"testing"
	"time"
)

// machine is how a test's steps take: prefill-only and decode-only steps as linearCost
// says, and a mixed step its decode part plus its prompt part less what the two share (the
// weights read once).
type machine struct {
	cost   linearCost
	shared float64 // ms
}

func (m machine) Step(s StepShape) time.Duration {
	p, d := m.cost.Step(s.prefillPart()), m.cost.Step(s.decodePart())
	if s.PrefillTokens > 0 && s.DecodeSeqs > 0 {
		return p + d - time.Duration(m.shared*float64(time.Millisecond))
	}
	return p + d
}

func near(got, want time.Duration, tol float64) bool {
	return math.Abs(float64(got-want)) <= tol*float64(want)
}

// A LiveCost learns a machine unlike its profile: decode steps twice as slow, prefill
// twice as fast with a quadratic term 30 times smaller than the profile's, and mixed steps
// 15 ms cheaper than their parts. After steps of a few shapes it predicts other shapes of
// each kind.
func TestLiveCostLearnsTheMachine(t *testing.T) {
	profile := linearCost{prefillBase: 10, perToken: 1.4, perQuad: 0.03, decodeBase: 20, perSeq: 1.2}
	real := machine{cost: linearCost{prefillBase: 5, perToken: 0.7, perQuad: 0.001, decodeBase: 40, perSeq: 2.4}, shared: 15}
	c := NewLiveCost(profile)
	for i := range 300 {
		var sh StepShape
		switch i % 3 {
		case 0:
			sh.Add(32<<(i%4), 32<<(i%4)) // prefill alone
		case 1:
			for range 4 + i%13 {
				sh.Add(1, 300)
			}
		default: // decodes and a chunk of 16 to 128 tokens, on 0 to 600 tokens of context
			for range 4 + i%13 {
				sh.Add(1, 300)
			}
			n := 16 << (i % 4)
			sh.Add(n, n+200*(i%4))
		}
		c.Observe(sh, real.Step(sh))
	}
	// Other batches, and chunks among those seen (the fit is linear in the tokens and
	// Σ nᵢ·ctxᵢ, which chunks tell apart as their sizes and contexts vary together).
	for _, sh := range []StepShape{
		{DecodeSeqs: 3, KVTokens: 900},
		{DecodeSeqs: 30, KVTokens: 9000},
		{PrefillTokens: 128, PrefillQuad: 128 * 728, DecodeSeqs: 10, KVTokens: 3000},
		{PrefillTokens: 48, PrefillQuad: 48 * 348, DecodeSeqs: 10, KVTokens: 3000},
		{PrefillTokens: 20, PrefillQuad: 20 * 60, DecodeSeqs: 6, KVTokens: 1800},
	} {
		if got, want := c.Step(sh), real.Step(sh); !near(got, want, 0.05) {
			t.Errorf("%+v: predicted %v, the machine takes %v (profile %v)", sh, got, want, profile.Step(sh))
		}
	}
	// Chunks all of one size: the fit cannot tell its terms apart, and stays defined.
	one := NewLiveCost(profile)
	sh := StepShape{PrefillTokens: 64, PrefillQuad: 64 * 64, DecodeSeqs: 8, KVTokens: 2400}
	for range 100 {
		one.Observe(sh, real.Step(sh))
	}
	other := StepShape{PrefillTokens: 32, PrefillQuad: 32 * 500, DecodeSeqs: 8, KVTokens: 2400}
	if got, want := one.Step(sh), real.Step(sh); !near(got, want, 0.01) {
		t.Errorf("one shape: predicted %v, the machine takes %v", got, want)
	}
	if got := one.Step(other); got < one.Step(StepShape{DecodeSeqs: 8, KVTokens: 2400}) || got > profile.Step(other) {
		t.Errorf("another shape: predicted %v, between its decodes' %v and the profile's %v", got, real.Step(other), profile.Step(other))
	}
	// The prefill-only factor is a scale: it cannot mend the profile's quadratic term, and
	// the policy does not need it to (a step without decodes is not timed).
	if _, d, m := c.Correction(); math.Abs(d-2) > 0.05 || m > 0.6 {
		t.Errorf("corrections: decode %.3f, mixed %.3f; want 2, and a mixed step's prompt part under 0.6 of the profile's", d, m)
	}
}

// One step far off (a stall of the process) moves the prediction by a few percent, and the
// correction follows a lasting change within a few times LiveCostMemory steps.
func TestLiveCostOutliersAndDrift(t *testing.T) {
	base := linearCost{decodeBase: 20, perSeq: 1}
	sh := StepShape{DecodeSeqs: 8, KVTokens: 8 * 100}
	c := NewLiveCost(base)
	for range 100 {
		c.Observe(sh, base.Step(sh))
	}
	c.Observe(sh, 100*base.Step(sh))
	if got := c.Step(sh); !near(got, base.Step(sh), 0.05) || got == base.Step(sh) {
		t.Errorf("after one step 100× slower: %v, base %v", got, base.Step(sh))
	}
	slow := 3 * base.Step(sh)
	for range 4 * LiveCostMemory {
		c.Observe(sh, slow)
	}
	if got := c.Step(sh); !near(got, slow, 0.05) {
		t.Errorf("after a lasting slow-down: %v, want %v", got, slow)
	}
	before := c.Step(sh)
	c.Observe(StepShape{}, time.Second)
	c.Observe(sh, 0)
	if c.Step(sh) != before {
		t.Errorf("an empty step or a zero time moved the prediction")
	}
}

// After a single mixed step with a small chunk that cost next to nothing beyond its
// decodes (the weights read once for both), a large chunk is not predicted free: the fit
// may extrapolate anywhere from one step, and the prompt part keeps a quarter of the
// prefill-only prediction.
func TestLiveCostFewMixedSteps(t *testing.T) {
	profile := linearCost{prefillBase: 30, perToken: 2.9, perQuad: 0.003, decodeBase: 56, perSeq: 3}
	c := NewLiveCost(profile)
	small := StepShape{PrefillTokens: 11, PrefillQuad: 11 * 11, DecodeSeqs: 1, KVTokens: 257}
	c.Observe(small, 39*time.Millisecond) // its decode alone is predicted at 59 ms
	large := StepShape{PrefillTokens: 511, PrefillQuad: 511 * 511, DecodeSeqs: 1, KVTokens: 258}
	prefill := large
	prefill.DecodeSeqs, prefill.KVTokens = 0, 0
	if got, floor := c.Step(large), profile.Step(prefill)/4; got < floor {
		t.Errorf("a 511-token chunk beside a decode: predicted %v, want at least %v", got, floor)
	}
}
