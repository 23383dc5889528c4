package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// A Sample is one timed forward step: its shape and how long it took.
type Sample struct {
	Shape StepShape     `json:"shape"`
	Time  time.Duration `json:"time_ns"`
}

// A TransferSample is one timed KV transfer of Bytes bytes.
type TransferSample struct {
	Bytes int64         `json:"bytes"`
	Time  time.Duration `json:"time_ns"`
}

// Fit finds the Timing that best predicts steps: the prefill parameters from
// the steps with prefill tokens only, the decode parameters from the steps
// with decode sequences only, and the transfer parameters from transfers (left
// at base's values when there are none). Each fit minimises the squared
// relative error (a 2 ms step matters as much as a 2 s one) with every
// parameter ≥ 0. It needs at least three pure-prefill and three pure-decode
// steps of different shapes.
func Fit(steps []Sample, transfers []TransferSample, base Timing) (Timing, error) {
	var pre, dec [][4]float64 // features..., ms
	for _, s := range steps {
		ms := float64(s.Time) / float64(time.Millisecond)
		if ms <= 0 {
			continue
		}
		sh := s.Shape
		switch {
		case sh.PrefillTokens > 0 && sh.DecodeSeqs == 0:
			pre = append(pre, [4]float64{1, float64(sh.PrefillTokens), sh.PrefillQuad, ms})
		case sh.DecodeSeqs > 0 && sh.PrefillTokens == 0:
			dec = append(dec, [4]float64{1, float64(sh.DecodeSeqs), float64(sh.KVTokens), ms})
		}
	}
	if len(pre) < 3 || len(dec) < 3 {
		return Timing{}, fmt.Errorf("sim: fitting needs ≥ 3 prefill-only and ≥ 3 decode-only steps, got %d and %d", len(pre), len(dec))
	}
	t := base
	p, err := nnls(pre)
	if err != nil {
		return Timing{}, fmt.Errorf("sim: prefill fit: %w", err)
	}
	t.PrefillBase, t.PrefillPerToken, t.PrefillPerToken2 = p[0], p[1], p[2]
	d, err := nnls(dec)
	if err != nil {
		return Timing{}, fmt.Errorf("sim: decode fit: %w", err)
	}
	t.DecodeBase, t.DecodePerSeq, t.DecodePerKVToken = d[0], d[1], d[2]
	if len(transfers) >= 2 {
		var rows [][4]float64
		for _, x := range transfers {
			if ms := float64(x.Time) / float64(time.Millisecond); ms > 0 {
				rows = append(rows, [4]float64{1, float64(x.Bytes) / (1 << 20), 0, ms})
			}
		}
		if tr, err := nnls(rows); err == nil {
			t.TransferBase, t.TransferPerMiB = tr[0], tr[1]
		}
	}
	return t, t.validate()
}

// nnls fits y ≈ β·x over rows {x0, x1, x2, y} by least squares on relative
// errors with β ≥ 0. With three unknowns it simply solves every subset of
// free parameters (the others held at 0) and keeps the feasible one with the
// least residual, which is the exact non-negative solution.
func nnls(rows [][4]float64) ([3]float64, error) {
	best, bestSSE := [3]float64{}, math.Inf(1)
	scale := [3]float64{1, 1, 1}
	for _, r := range rows {
		for j := range 3 {
			scale[j] = max(scale[j], math.Abs(r[j]))
		}
	}
	for mask := 1; mask < 8; mask++ {
		var idx []int
		for j := range 3 {
			if mask&(1<<j) != 0 {
				idx = append(idx, j)
			}
		}
		// Normal equations of the problem divided through by y (relative
		// errors), with each column scaled to a largest value of 1 so that
		// a constant, a token count and a squared one stay comparable.
		n := len(idx)
		var a [3][4]float64
		for _, r := range rows {
			for i := range n {
				xi := r[idx[i]] / r[3] / scale[idx[i]]
				for k := range n {
					a[i][k] += xi * r[idx[k]] / r[3] / scale[idx[k]]
				}
				a[i][n] += xi
			}
		}
		sol, ok := solve(a, n)
		if !ok {
			continue
		}
		var beta [3]float64
		feasible := true
		for i, j := range idx {
			if sol[i] < 0 {
				feasible = false
			}
			beta[j] = sol[i] / scale[j]
		}
		if !feasible {
			continue
		}
		sse := 0.0
		for _, r := range rows {
			e := (beta[0]*r[0] + beta[1]*r[1] + beta[2]*r[2] - r[3]) / r[3]
			sse += e * e
		}
		if sse < bestSSE {
			best, bestSSE = beta, sse
		}
	}
	if math.IsInf(bestSSE, 1) {
		return best, errors.New("no non-negative solution (are the samples all of one shape?)")
	}
	return best, nil
}

// solve does Gaussian elimination with partial pivoting on the n×(n+1)
// augmented matrix a; false when it is singular.
func solve(a [3][4]float64, n int) ([3]float64, bool) {
	var x [3]float64
	scale := 0.0
	for i := range n {
		scale = max(scale, math.Abs(a[i][i]))
	}
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) <= 1e-12*scale {
			return x, false
		}
		a[c], a[p] = a[p], a[c]
		for r := c + 1; r < n; r++ {
			f := a[r][c] / a[c][c]
			for k := c; k <= n; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	for i := n - 1; i >= 0; i-- {
		s := a[i][n]
		for k := i + 1; k < n; k++ {
			s -= a[i][k] * x[k]
		}
		x[i] = s / a[i][i]
	}
	return x, true
}
