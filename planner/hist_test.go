package planner

import (
	"math"
	"testing"
	"time"
)

func TestHist(t *testing.T) {
	var h Hist
	for i := 1; i <= 1000; i++ {
		h.Observe(float64(i) / 1000) // 1 ms … 1 s, uniform
	}
	tests := []struct {
		name      string
		got, want float64
		tol       float64 // relative
	}{
		{"mean", h.Mean(), 0.5005, 1e-9},
		{"below 0.25", h.Below(0.25), 0.25, 0.05},
		{"below 0.9", h.Below(0.9), 0.9, 0.05},
		{"below 2 (all)", h.Below(2), 1, 0},
		{"below 0.0005 (none)", h.Below(0.0005), 0, 0.01},
		{"p50", h.Quantile(0.5), 0.5, 0.09},
		{"p95", h.Quantile(0.95), 0.95, 0.09},
	}
	for _, tc := range tests {
		if d := math.Abs(tc.got - tc.want); d > tc.tol*math.Max(tc.want, 1e-3)+1e-12 {
			t.Errorf("%s = %v, want %v ± %v", tc.name, tc.got, tc.want, tc.tol)
		}
	}
	var prev Hist
	prev = h
	for range 10 {
		h.Observe(3)
	}
	w := h.Sub(&prev)
	if w.Count != 10 || w.Mean() != 3 || w.Below(2.5) != 0 || w.Below(3.5) != 1 {
		t.Errorf("window: count %d mean %v below(2.5) %v below(3.5) %v; want 10 3 0 1", w.Count, w.Mean(), w.Below(2.5), w.Below(3.5))
	}
	d := w.Dist()
	if len(d) != 1 || d[0].Weight != 1 || math.Abs(d[0].Value-3) > 1e-9 {
		t.Errorf("dist of ten 3s = %v", d)
	}
	var empty Hist
	if empty.Below(1) != 1 || empty.Quantile(0.5) != 0 || empty.Mean() != 0 || empty.Dist() != nil {
		t.Error("an empty histogram should read as all within any target, quantiles and mean 0")
	}
	// Out of range values land in the end buckets, NaN and negatives at 0.
	var x Hist
	x.Observe(math.NaN())
	x.Observe(-1)
	x.Observe(1e12)
	if x.Count != 3 || x.Buckets[0] != 2 || x.Buckets[histBuckets-1] != 1 {
		t.Errorf("edges: %d observations, bucket 0 %d, last %d", x.Count, x.Buckets[0], x.Buckets[histBuckets-1])
	}
}

func TestCounters(t *testing.T) {
	var c Counters
	c.Arrive()
	c.FirstToken(Prefill, 200*time.Millisecond)
	c.Finish(Decode, 1000, 400, 50, 20*time.Millisecond)
	c.Finish(Decode, 100, 0, 1, 0) // one token: no TPOT
	prev := c
	c.Arrive()
	c.Finish(Aggregated, 10, 0, 3, 5*time.Millisecond)
	w := c.sub(&prev)
	if c.Arrived != 2 || c.Finished != 3 || c.Pools[Decode].TPOT.Count != 1 || c.Pools[Prefill].TTFT.Count != 1 {
		t.Errorf("counters %+v", c)
	}
	if w.Arrived != 1 || w.Finished != 1 || w.Input != 10 || w.Uncached.Count != 1 || w.Pools[Aggregated].TPOT.Count != 1 || w.Pools[Decode].TPOT.Count != 0 {
		t.Errorf("window %+v", w)
	}
	if got := c.Uncached.Mean(); math.Abs(got-(600+100+10)/3.0) > 1e-9 {
		t.Errorf("uncached mean %v", got)
	}
}
