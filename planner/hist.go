package planner

import (
	"math"
	"time"
)

// Histogram buckets: bucket 0 holds values below histBase, bucket i ≥ 1 the values in
// [histBase·2^((i−1)/perOctave), histBase·2^(i/perOctave)); the last one everything above.
// With a base of 1e-4 and 40 doublings the same buckets hold latencies from 100 µs to
// 30 hours in seconds and token counts up to 10⁸, at 9 % resolution.
const (
	histBase      = 1e-4
	histPerOctave = 8
	histBuckets   = 40*histPerOctave + 2
)

// A Hist is a histogram of non-negative values over fixed log-spaced buckets, cumulative
// as Prometheus's are: a window is the difference of two copies (Sub). The zero value is
// empty and ready to use.
type Hist struct {
	Count   int64
	Sum     float64
	Buckets [histBuckets]int64
}

func bucketOf(x float64) int {
	if !(x >= histBase) { // NaN and negatives too
		return 0
	}
	i := 1 + int(math.Floor(math.Log2(x/histBase)*histPerOctave))
	return min(i, histBuckets-1)
}

// bucketBounds returns bucket i's lower and upper bound.
func bucketBounds(i int) (lo, hi float64) {
	if i == 0 {
		return 0, histBase
	}
	lo = histBase * math.Exp2(float64(i-1)/histPerOctave)
	return lo, lo * math.Exp2(1.0/histPerOctave)
}

// Observe adds x.
func (h *Hist) Observe(x float64) {
	if math.IsNaN(x) || x < 0 {
		x = 0
	}
	h.Count++
	h.Sum += x
	h.Buckets[bucketOf(x)]++
}

// Sub returns h less prev: the observations between the two.
func (h *Hist) Sub(prev *Hist) Hist {
	d := Hist{Count: h.Count - prev.Count, Sum: h.Sum - prev.Sum}
	for i := range d.Buckets {
		d.Buckets[i] = h.Buckets[i] - prev.Buckets[i]
	}
	return d
}

// Mean is the mean of the observations (0 when there are none).
func (h *Hist) Mean() float64 {
	if h.Count <= 0 {
		return 0
	}
	return h.Sum / float64(h.Count)
}

// Below returns the fraction of observations at or below x, interpolating within x's
// bucket (1 when there are none).
func (h *Hist) Below(x float64) float64 {
	if h.Count <= 0 {
		return 1
	}
	b := bucketOf(x)
	n := 0.0
	for i := 0; i < b; i++ {
		n += float64(h.Buckets[i])
	}
	lo, hi := bucketBounds(b)
	if b == histBuckets-1 {
		n += float64(h.Buckets[b])
	} else {
		n += float64(h.Buckets[b]) * min(1, max(0, (x-lo)/(hi-lo)))
	}
	return n / float64(h.Count)
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1), interpolating linearly within its bucket
// (0 when there are no observations).
func (h *Hist) Quantile(q float64) float64 {
	if h.Count <= 0 {
		return 0
	}
	rank := q * float64(h.Count)
	n := 0.0
	for i, c := range h.Buckets {
		if c == 0 {
			continue
		}
		if n+float64(c) >= rank {
			lo, hi := bucketBounds(i)
			if i == histBuckets-1 {
				return lo
			}
			return lo + (hi-lo)*min(1, max(0, (rank-n)/float64(c)))
		}
		n += float64(c)
	}
	lo, _ := bucketBounds(histBuckets - 1)
	return lo
}

// Dist returns the observations as a distribution: one point per non-empty bucket at
// the bucket's mean (the buckets' midpoints, scaled so that the points' mean is Mean),
// weights summing to 1.
func (h *Hist) Dist() []Weighted {
	var b [histBuckets]float64
	for i, c := range h.Buckets {
		b[i] = float64(c)
	}
	return dist(&b, float64(h.Count), h.Sum)
}

func dist(b *[histBuckets]float64, count, sum float64) []Weighted {
	if count <= 0 {
		return nil
	}
	var d []Weighted
	mean := 0.0
	for i, c := range b {
		if c <= 0 {
			continue
		}
		lo, hi := bucketBounds(i)
		w := c / count
		d = append(d, Weighted{Value: (lo + hi) / 2, Weight: w})
		mean += w * (lo + hi) / 2
	}
	if mean > 0 {
		k := sum / count / mean
		for i := range d {
			d[i].Value *= k
		}
	}
	return d
}

// A decayed histogram adds each interval's observations to the past's, weighed down by
// keep: the shape of a heavy-tailed distribution (a few prompts of 100k tokens among
// thousands of short ones) from more samples than one interval has, which would swing
// the sizes with the handful of long prompts each interval happens to draw.
type decayed struct {
	buckets    [histBuckets]float64
	count, sum float64
}

func (d *decayed) add(h *Hist, keep float64) {
	for i, c := range h.Buckets {
		d.buckets[i] = keep*d.buckets[i] + float64(c)
	}
	d.count = keep*d.count + float64(h.Count)
	d.sum = keep*d.sum + h.Sum
}

func (d *decayed) dist() []Weighted { return dist(&d.buckets, d.count, d.sum) }

// perOctave is how many points per octave coarsen keeps of the output lengths'
// distribution: the model goes over every output length for each size it tries, and
// two points an octave are plenty.
const perOctave = 2

// coarsen merges a distribution's points (in increasing order, as dist makes them) into
// one per 1/perOctave of an octave, each at its points' weighted mean: fewer points for
// a computation that goes over all of them, the mean kept.
func coarsen(d []Weighted) []Weighted {
	var out []Weighted
	start, sum := 0.0, 0.0
	closeGroup := func() {
		if n := len(out); n > 0 && out[n-1].Weight > 0 {
			out[n-1].Value = sum / out[n-1].Weight
		}
	}
	for _, x := range d {
		if len(out) == 0 || x.Value >= start*math.Exp2(1/perOctave) {
			closeGroup()
			out = append(out, Weighted{Value: x.Value})
			start, sum = x.Value, 0
		}
		out[len(out)-1].Weight += x.Weight
		sum += x.Weight * x.Value
	}
	closeGroup()
	return out
}

// A Weighted value is one point of a distribution.
type Weighted struct{ Value, Weight float64 }

// Counters are what the planner observes, cumulative from the start as Prometheus
// counters are: the caller updates them as requests arrive, produce their first token and
// finish, and passes them to each Step; the planner takes windows by difference. Pools
// are those of the worker that produced the first token (TTFT) and the one that decoded
// the request (TPOT); in a disaggregated deployment a remote prefill's first token is the
// prefill pool's.
type Counters struct {
	Arrived  int64 // requests received
	Finished int64 // requests finished with output
	// Token sums of the finished requests: prompt, of which served from a prefix cache,
	// and output.
	Input, Cached, Output float64
	Uncached              Hist // uncached prompt tokens per finished request
	Outputs               Hist // output tokens per finished request
	Pools                 [NumPools]PoolCounters
}

// PoolCounters are one pool's latencies, in seconds.
type PoolCounters struct {
	TTFT Hist // time to first token of the first tokens its workers produced
	TPOT Hist // mean inter-token latency of the requests its workers decoded (2+ tokens)
	// Gaps and GapTime count the gaps between tokens of those requests and their time:
	// GapTime/Gaps is the mean inter-token latency by token, which a few short answers
	// with long gaps do not sway as they sway TPOT's mean.
	Gaps, GapTime float64
}

// Arrive counts a request received.
func (c *Counters) Arrive() { c.Arrived++ }

// FirstToken counts a first token produced in pool p, ttft after the request arrived.
func (c *Counters) FirstToken(p Pool, ttft time.Duration) {
	if p >= 0 && p < NumPools {
		c.Pools[p].TTFT.Observe(ttft.Seconds())
	}
}

// Finish counts a request decoded in pool p that ended with output tokens generated
// from a prompt of input tokens, cached of them from a prefix cache, at tpot between
// tokens (unused for a single token).
func (c *Counters) Finish(p Pool, input, cached, output int, tpot time.Duration) {
	c.Finished++
	c.Input += float64(input)
	c.Cached += float64(cached)
	c.Output += float64(output)
	c.Uncached.Observe(float64(max(0, input-cached)))
	c.Outputs.Observe(float64(output))
	if output > 1 && p >= 0 && p < NumPools {
		c.Pools[p].TPOT.Observe(tpot.Seconds())
		c.Pools[p].Gaps += float64(output - 1)
		c.Pools[p].GapTime += float64(output-1) * tpot.Seconds()
	}
}

// sub returns c less prev.
func (c *Counters) sub(prev *Counters) Counters {
	d := Counters{Arrived: c.Arrived - prev.Arrived, Finished: c.Finished - prev.Finished,
		Input: c.Input - prev.Input, Cached: c.Cached - prev.Cached, Output: c.Output - prev.Output,
		Uncached: c.Uncached.Sub(&prev.Uncached), Outputs: c.Outputs.Sub(&prev.Outputs)}
	for i := range d.Pools {
		d.Pools[i].TTFT = c.Pools[i].TTFT.Sub(&prev.Pools[i].TTFT)
		d.Pools[i].TPOT = c.Pools[i].TPOT.Sub(&prev.Pools[i].TPOT)
		d.Pools[i].Gaps = c.Pools[i].Gaps - prev.Pools[i].Gaps
		d.Pools[i].GapTime = c.Pools[i].GapTime - prev.Pools[i].GapTime
	}
	return d
}
