package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Arrival names an arrival process.
type Arrival string

const (
	Poisson  Arrival = "poisson"  // exponential gaps (gamma with Burstiness ≠ 1), vLLM's default
	Constant Arrival = "constant" // equal gaps of 1/rate
	Trace    Arrival = "trace"    // the workload's own timestamps, divided by a speed-up
)

// Schedule returns the send offsets of n sessions: for Poisson and Constant
// at rate requests per second (+Inf: all at once), for Trace the sessions'
// timestamps divided by speedup. Poisson gaps are gamma distributed with
// shape burstiness and mean 1/rate (burstiness 1 is exponential), as in vLLM.
func Schedule(kind Arrival, sessions []Session, rate, burstiness, speedup float64, seed int64) ([]time.Duration, error) {
	n := len(sessions)
	out := make([]time.Duration, n)
	switch kind {
	case Trace:
		if !(speedup > 0) || math.IsInf(speedup, 1) {
			return nil, fmt.Errorf("bench: trace speed-up must be positive and finite, got %v", speedup)
		}
		for i, s := range sessions {
			out[i] = time.Duration(float64(s.At) / speedup)
		}
		return out, nil
	case Poisson, Constant:
	default:
		return nil, fmt.Errorf("bench: unknown arrival process %q (want poisson, constant or trace)", kind)
	}
	if !(rate > 0) {
		return nil, fmt.Errorf("bench: request rate must be positive, got %v", rate)
	}
	if math.IsInf(rate, 1) {
		return out, nil
	}
	if kind == Poisson && !(burstiness > 0) {
		return nil, fmt.Errorf("bench: burstiness must be positive, got %v", burstiness)
	}
	r := rand.New(rand.NewPCG(uint64(seed), 5))
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		gap := 1 / rate
		if kind == Poisson {
			gap = gamma(r, burstiness) / (rate * burstiness)
		}
		t += gap
	}
	return out, nil
}

// gamma draws from Gamma(shape, 1) (Marsaglia and Tsang).
func gamma(r *rand.Rand, shape float64) float64 {
	if shape == 1 {
		return r.ExpFloat64()
	}
	if shape < 1 {
		return gamma(r, shape+1) * math.Pow(r.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
