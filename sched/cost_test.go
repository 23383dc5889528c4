package sched

import (
	"math"
	"testing"
	"time"
)

// scaled is a machine whose steps take what base predicts times a factor per kind: prefill
// only, decode only, and for a mixed step mix times the sum of its scaled parts.
type scaled struct {
	base                 CostModel
	prefill, decode, mix float64
}

func (m scaled) Step(s StepShape) time.Duration {
	p := float64(m.base.Step(s.prefillPart())) * m.prefill
	d := float64(m.base.Step(s.decodePart())) * m.decode
	if s.PrefillTokens > 0 && s.DecodeSeqs > 0 {
		return time.Duration((p + d) * m.mix)
	}
	return time.Duration(p + d)
}

func near(got, want time.Duration, tol float64) bool {
	return math.Abs(float64(got-want)) <= tol*float64(want)
}

// A LiveCost learns each kind's factor from the steps of that kind, and predicts mixed
// steps of other compositions from the three.
func TestLiveCostLearnsTheMachine(t *testing.T) {
	base := linearCost{prefillBase: 10, perToken: 1.4, decodeBase: 20, perSeq: 1.2}
	machine := scaled{base: base, prefill: 0.5, decode: 2, mix: 0.8}
	c := NewLiveCost(base)
	shapes := []StepShape{
		{PrefillTokens: 512, PrefillQuad: 512 * 512},
		{DecodeSeqs: 16, KVTokens: 16 * 300},
		{PrefillTokens: 64, PrefillQuad: 64 * 64, DecodeSeqs: 16, KVTokens: 16 * 300},
	}
	for i := range 200 {
		sh := shapes[i%len(shapes)]
		sh.DecodeSeqs += i % 5 // the batch changes
		c.Observe(sh, machine.Step(sh))
	}
	for _, sh := range []StepShape{
		{PrefillTokens: 100, PrefillQuad: 100 * 100},
		{DecodeSeqs: 3, KVTokens: 900},
		{PrefillTokens: 200, PrefillQuad: 200 * 200, DecodeSeqs: 4, KVTokens: 4000},
	} {
		if got, want := c.Step(sh), machine.Step(sh); !near(got, want, 0.01) {
			t.Errorf("%+v: predicted %v, the machine takes %v", sh, got, want)
		}
	}
	p, d, m := c.Correction()
	if math.Abs(p-0.5) > 0.01 || math.Abs(d-2) > 0.02 || math.Abs(m-0.8) > 0.01 {
		t.Errorf("corrections %.3f %.3f %.3f, want 0.5 2 0.8", p, d, m)
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
