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

// LiveCost is a CostModel kept current from the engine's own steps, over a base model
// (the profile: fitted by `tandem profile`, or by the engine at start):
//
//   - a prefill-only or decode-only step is the base's prediction times a correction
//     factor of its kind: the exponentially weighted geometric mean of measured ÷
//     predicted over the last steps of that kind (about LiveCostMemory of them);
//   - a mixed step is its decode part, so corrected, plus its prompt part: the base's
//     prefill prediction plus a linear term in the step's prompt tokens and Σ nᵢ·ctxᵢ
//     (and a constant) fitted to what mixed steps measured beyond their decode part, by
//     exponentially weighted least squares over the last LiveCostMemory mixed steps,
//     relative errors, drawn slightly towards the base's prediction (priorSteps). The
//     prompt part counts as at least a quarter of the corrected prefill-only prediction.
//
// So it follows a machine whose speed drifts (other processes on its cores, thermal
// limits) within a few seconds, while a single outlier (a page fault, a stall of the
// process) moves it little: for a factor, one step's ratio to the prediction counts as at
// most maxStepRatio either way; in the fit, a step weighs the inverse square of its time.
// The prompt part is fitted, not scaled, for two reasons: a mixed
// step costs less than its parts alone (the weights are read once for both: a negative
// constant), and a profile taken while other work ran on the cores may have the shape of
// its prefill cost wrong (a quadratic term many times too large), which no factor mends;
// decode-only steps, which come at every batch size the engine runs, need only their
// scale. It is not safe for concurrent use.
type LiveCost struct {
	base  CostModel
	logf  [2]float64 // log of the correction factor of prefill-only and decode-only steps
	steps [2]int     // steps of each kind observed (saturating at LiveCostMemory)

	// The prompt part's fit: coefficients of promptFeatures added to the base's prefill
	// prediction (ms), and the weighted sums they solve, decayed by 1 - 1/LiveCostMemory.
	coef  [3]float64
	sxx   [3][3]float64
	sxy   [3]float64
	mixes int // mixed steps observed (saturating at LiveCostMemory)
}

// Kinds of steps.
const (
	prefillOnly = iota
	decodeOnly
	mixed
)

// LiveCostMemory is the number of recent steps of a kind that a LiveCost weighs: each new
// one weighs 1/LiveCostMemory (more while fewer have been seen).
const LiveCostMemory = 32

// maxStepRatio bounds how far one measured step can pull a correction factor: its time
// counts as at most this many times the prediction (or at least its inverse).
const maxStepRatio = 4

// priorSteps is how many mixed steps' worth the base's prediction of the prompt part
// weighs in its fit, in the scale of each term: a hundredth of a step, enough to keep the
// fit defined when the steps do not tell its terms apart (chunks all of one size), little
// enough not to bias what they do (chunks' sizes and contexts vary together, so the terms
// are nearly collinear and a heavier prior pulls far).
const priorSteps = 0.01

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

// promptFeatures are what the prompt part's fit is linear in: a constant, the prompt
// tokens and Σ nᵢ·ctxᵢ, scaled to about 1 for a 256-token chunk.
func promptFeatures(s StepShape) [3]float64 {
	return [3]float64{1, float64(s.PrefillTokens) / 256, s.PrefillQuad / (256 * 256)}
}

// Step is the prediction for the shape (see LiveCost).
func (c *LiveCost) Step(s StepShape) time.Duration {
	return time.Duration(c.predict(s) * float64(time.Millisecond))
}

// predict is Step in milliseconds.
func (c *LiveCost) predict(s StepShape) float64 {
	switch kindOf(s) {
	case prefillOnly:
		return ms(c.base.Step(s)) * math.Exp(c.logf[prefillOnly])
	case decodeOnly:
		return ms(c.base.Step(s)) * math.Exp(c.logf[decodeOnly])
	}
	return c.decodePart(s) + c.promptPart(s)
}

func (c *LiveCost) decodePart(s StepShape) float64 {
	return ms(c.base.Step(s.decodePart())) * math.Exp(c.logf[decodeOnly])
}

func (c *LiveCost) promptPart(s StepShape) float64 {
	x := promptFeatures(s)
	p := ms(c.base.Step(s.prefillPart()))
	floor := p * math.Exp(c.logf[prefillOnly]) / minPromptPart
	return max(floor, p+c.coef[0]*x[0]+c.coef[1]*x[1]+c.coef[2]*x[2])
}

// minPromptPart bounds the prompt part of a mixed step from below: at least the
// prefill-only prediction (the profile times its correction) over this. Few mixed steps,
// or steps of one chunk size, leave the fit free to extrapolate; one that predicted a
// 511-token chunk free (fitted on an 11-token one) let it into a step with a stream, which
// waited 0.9 s. Predicting too much only cuts chunks smaller.
const minPromptPart = 4

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Observe records that a step of shape s took d, and moves the model of its kind towards
// it. An empty shape or a non-positive time is ignored.
func (c *LiveCost) Observe(s StepShape, d time.Duration) {
	if s.PrefillTokens == 0 && s.DecodeSeqs == 0 || d <= 0 {
		return
	}
	pred := c.predict(s)
	if pred <= 0 {
		return
	}
	y := ms(d)
	k := kindOf(s)
	if k != mixed {
		if c.steps[k] < LiveCostMemory {
			c.steps[k]++
		}
		e := min(max(math.Log(y/pred), -math.Log(maxStepRatio)), math.Log(maxStepRatio))
		c.logf[k] += e / float64(c.steps[k])
		return
	}
	// What the prompt part took beyond the base's prefill prediction, weighted for the
	// relative error of the step: a step slowed by a stall weighs the less, the more it
	// was slowed.
	x := promptFeatures(s)
	r := y - c.decodePart(s) - ms(c.base.Step(s.prefillPart()))
	w := 1 / (y * y)
	decay := 1.0 // plain sums until the memory is full
	if c.mixes == LiveCostMemory {
		decay = 1 - 1/float64(LiveCostMemory)
	} else {
		c.mixes++
	}
	for i := range 3 {
		for j := range 3 {
			c.sxx[i][j] = decay*c.sxx[i][j] + w*x[i]*x[j]
		}
		c.sxy[i] = decay*c.sxy[i] + w*x[i]*r
	}
	// Ridge towards the base (coefficients 0): each coefficient as sure of 0 as priorSteps
	// of the steps seen are of its value (a ridge in the features' own scale).
	var a [3][4]float64
	for i := range 3 {
		for j := range 3 {
			a[i][j] = c.sxx[i][j]
		}
		a[i][i] += priorSteps * c.sxx[i][i] / float64(c.mixes)
		a[i][3] = c.sxy[i]
	}
	if coef, ok := solve3(a); ok {
		c.coef = coef
	}
}

// solve3 solves the 3×3 system a (augmented with its right-hand side) by Gaussian
// elimination with partial pivoting; false when it is singular.
func solve3(a [3][4]float64) ([3]float64, bool) {
	var x [3]float64
	for col := range 3 {
		p := col
		for r := col + 1; r < 3; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		if a[p][col] == 0 || math.IsNaN(a[p][col]) {
			return x, false
		}
		a[col], a[p] = a[p], a[col]
		for r := col + 1; r < 3; r++ {
			f := a[r][col] / a[col][col]
			for k := col; k < 4; k++ {
				a[r][k] -= f * a[col][k]
			}
		}
	}
	for i := 2; i >= 0; i-- {
		v := a[i][3]
		for k := i + 1; k < 3; k++ {
			v -= a[i][k] * x[k]
		}
		x[i] = v / a[i][i]
	}
	return x, true
}

// refChunk is the mixed step Correction reports on: a 64-token prompt chunk at the start
// of its prompt.
var refChunk = StepShape{PrefillTokens: 64, PrefillQuad: 64 * 64}

// Correction returns the factors of the base's predictions: for prefill-only steps, for
// decode-only steps, and for the prompt part of a mixed step (a 64-token chunk's, fitted
// over the base's prefill-only prediction of it).
func (c *LiveCost) Correction() (prefill, decode, mix float64) {
	prefill, decode = math.Exp(c.logf[prefillOnly]), math.Exp(c.logf[decodeOnly])
	if b := ms(c.base.Step(refChunk)); b > 0 {
		mix = c.promptPart(refChunk) / b
	}
	return prefill, decode, mix
}
