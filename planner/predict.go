package planner

import (
	"fmt"
	"math"
)

// A Predictor forecasts a series observed once per adjustment interval (a request rate, a
// mean prompt length): Observe the last interval's value, Forecast h intervals ahead.
type Predictor interface {
	Observe(x float64)
	Forecast(h int) float64 // h ≥ 1; 0 before the first observation
}

// Predictors names the predictors NewPredictor makes.
var Predictors = []string{"constant", "holt", "kalman"}

// NewPredictor returns the predictor named: "constant" (the last value), "holt" (Holt's
// linear exponential smoothing, level and trend) or "kalman" (a Kalman filter over a local
// linear trend, which adapts its gains while it learns).
func NewPredictor(name string) (Predictor, error) {
	switch name {
	case "constant":
		return &constant{}, nil
	case "holt":
		return &holt{alpha: 0.5, beta: 0.3}, nil
	case "", "kalman":
		return newKalman(), nil
	}
	return nil, fmt.Errorf("planner: unknown predictor %q (want constant, holt or kalman)", name)
}

type constant struct{ last float64 }

func (c *constant) Observe(x float64)    { c.last = x }
func (c *constant) Forecast(int) float64 { return c.last }

// holt is double exponential smoothing: level ← αx + (1−α)(level + trend), trend ←
// β(level − previous level) + (1−β)trend; the forecast h ahead is level + the trend
// damped over h intervals.
type holt struct {
	alpha, beta  float64
	level, trend float64
	n            int
}

func (p *holt) Observe(x float64) {
	switch p.n {
	case 0:
		p.level = x
	case 1:
		p.trend = x - p.level
		p.level = x
	default:
		prev := p.level
		p.level = p.alpha*x + (1-p.alpha)*(p.level+p.trend)
		p.trend = p.beta*(p.level-prev) + (1-p.beta)*p.trend
	}
	p.n++
}

func (p *holt) Forecast(h int) float64 { return max(0, p.level+damped(h)*p.trend) }

// damping is the trend's damping per interval ahead (Gardner's damped trend): a trend is
// extrapolated as Σ φⁱ, not h, intervals, so that the step from a load change is not taken
// for a slope that lasts.
const damping = 0.9

func damped(h int) float64 {
	s, f := 0.0, 1.0
	for range h {
		f *= damping
		s += f
	}
	return s
}

// kalman filters the state (level, slope) of x_{t+1} = level + slope + noise. The process
// noise is a fixed fraction of the measurement noise (qLevel, qSlope), so the gains do
// not depend on the series' scale; a new filter starts with a wide uncertainty and
// follows its first observations closely, settling to Holt-like gains after a few.
type kalman struct {
	level, slope   float64
	p              [2][2]float64
	qLevel, qSlope float64
	n              int
}

func newKalman() *kalman {
	return &kalman{qLevel: 0.05, qSlope: 0.01, p: [2][2]float64{{1e6, 0}, {0, 1e6}}}
}

func (k *kalman) Observe(x float64) {
	if k.n == 0 {
		k.level, k.n = x, 1
		k.p = [2][2]float64{{1, 0}, {0, 1e6}}
		return
	}
	k.n++
	// Predict: F = [[1 1] [0 1]].
	l, s := k.level+k.slope, k.slope
	p := k.p
	pp := [2][2]float64{
		{p[0][0] + p[0][1] + p[1][0] + p[1][1] + k.qLevel, p[0][1] + p[1][1]},
		{p[1][0] + p[1][1], p[1][1] + k.qSlope},
	}
	// Update with H = [1 0], R = 1.
	innov := x - l
	sInv := 1 / (pp[0][0] + 1)
	g0, g1 := pp[0][0]*sInv, pp[1][0]*sInv
	k.level, k.slope = l+g0*innov, s+g1*innov
	k.p = [2][2]float64{
		{(1 - g0) * pp[0][0], (1 - g0) * pp[0][1]},
		{pp[1][0] - g1*pp[0][0], pp[1][1] - g1*pp[0][1]},
	}
	if math.IsNaN(k.level) || math.IsNaN(k.slope) {
		*k = *newKalman()
		k.Observe(x)
	}
}

func (k *kalman) Forecast(h int) float64 { return max(0, k.level+damped(h)*k.slope) }
