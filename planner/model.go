package planner

import (
	"math"
	"sort"
	"time"
)

// Perf is the performance model of one worker: how long a step computing newTokens prompt
// tokens takes (quad is Σ nᵢ·ctxᵢ over the step's sequences, each computing nᵢ tokens with
// ctxᵢ tokens of context after the step), and how long a decode step of batch sequences
// reading kvTokens tokens of KV takes. sim.Timing, which tandem profile fits, is one; the
// planner assumes a decode step's time is linear in the batch and in the KV it reads.
type Perf interface {
	Prefill(newTokens int, quad float64) time.Duration
	Decode(batch, kvTokens int) time.Duration
}

// Capacity is what one worker holds besides its speed.
type Capacity struct {
	KVTokens    int // KV cache in tokens (0: unbounded)
	TokenBudget int // tokens computed in one step: prompts longer than it take several (0: 8192)
	MaxSeqs     int // sequences running at once (0: 256)
}

// A Workload is a load to size for: requests per second, their mean prompt and output
// lengths, and the distribution of the prompt tokens each must compute (not found in a
// prefix cache). A workload without a distribution has every request's uncached tokens
// at the mean prompt.
type Workload struct {
	Rate     float64
	Input    float64
	Output   float64
	Uncached []Weighted
}

// A Prediction is the model's verdict on a pool of Workers under a workload.
type Prediction struct {
	Workers int
	// TTFT is the mean time to first token of the requests prefilled in the pool, and
	// TTFTAttainment the fraction of them within the TTFT target (1 for a decode pool).
	TTFT           time.Duration
	TTFTAttainment float64
	// ITL is the mean inter-token latency of the requests decoded in the pool, ITLTail its
	// value at the goal's quantile (0 for a prefill pool).
	ITL, ITLTail time.Duration
	// Utilization is the share of the workers' time spent prefilling.
	Utilization float64
	// OK says whether the pool meets its targets at the goal.
	OK bool
}

// model evaluates pools of workers with a Perf, corrected by the factors the planner
// measures (multipliers of the modelled prefill work and decode step).
type model struct {
	perf                Perf
	cap                 Capacity
	sla                 [2]float64 // TTFT and ITL targets, seconds
	goal                float64    // each target's share of requests: both must hold
	z                   float64    // the goal's quantile of a standard normal
	minRemote           int
	corrPrefill, corrDC float64
}

func newModel(perf Perf, c Capacity, ttft, itl time.Duration, goal float64, minRemote int) *model {
	c.TokenBudget = cmpOr(c.TokenBudget, 8192)
	c.MaxSeqs = cmpOr(c.MaxSeqs, 256)
	each := 1 - (1-goal)/2 // a request meets both: give each target half the misses
	return &model{perf: perf, cap: c, sla: [2]float64{ttft.Seconds(), itl.Seconds()}, goal: each,
		z: math.Sqrt2 * math.Erfinv(2*each-1), minRemote: minRemote, corrPrefill: 1, corrDC: 1}
}

func cmpOr(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// work is a prompt's prefill, alone on a worker: its uncached tokens u in chunks of the
// token budget on top of its cached ones, in seconds, and its number of chunks.
func (m *model) work(u, input float64) (sec float64, chunks int) {
	u = max(1, math.Round(u))
	cached := max(0, math.Round(input)-u)
	budget := float64(m.cap.TokenBudget)
	for done := 0.0; done < u; chunks++ {
		n := min(budget, u-done)
		done += n
		sec += m.perf.Prefill(int(n), n*(cached+done)).Seconds()
	}
	return sec * m.corrPrefill, chunks
}

// decodeLine is a decode step's time as a + b·B for B sequences of ctx tokens of context.
func (m *model) decodeLine(ctx float64) (a, b float64) {
	const probe = 64
	a = m.perf.Decode(0, 0).Seconds() * m.corrDC
	full := m.perf.Decode(probe, int(probe*ctx)).Seconds() * m.corrDC
	return a, max(0, (full-a)/probe)
}

// points is a workload's uncached distribution with each point's work and chunks.
type point struct {
	u, w, weight float64
	chunks       int
}

func (m *model) points(wl Workload) []point {
	d := wl.Uncached
	if len(d) == 0 {
		d = []Weighted{{Value: wl.Input, Weight: 1}}
	}
	ps := make([]point, len(d))
	for i, x := range d {
		w, c := m.work(x.Value, wl.Input)
		ps[i] = point{u: x.Value, w: w, weight: x.Weight, chunks: c}
	}
	return ps
}

// queue is an M/G/1 view of one worker's prefill queue: requests arriving at rate lambda,
// each taking its point's work plus extra per chunk. It returns the utilisation, the mean
// time to first token, and the fraction of first tokens within target t, with the wait
// taken as 0 with probability 1−ρ and exponential otherwise (its mean the
// Pollaczek–Khinchine mean wait over ρ).
func queue(ps []point, lambda, extraPerChunk, t float64) (rho, mean, att float64) {
	ew, ew2, wsum := 0.0, 0.0, 0.0
	for _, p := range ps {
		w := p.w + extraPerChunk*float64(p.chunks)
		ew += p.weight * w
		ew2 += p.weight * w * w
		wsum += p.weight
	}
	if wsum <= 0 {
		return 0, 0, 1
	}
	ew, ew2 = ew/wsum, ew2/wsum
	rho = lambda * ew
	if rho >= 0.99 {
		return rho, math.Inf(1), 0
	}
	wq := lambda * ew2 / (2 * (1 - rho))
	mean = ew + wq
	for _, p := range ps {
		w := p.w + extraPerChunk*float64(p.chunks)
		if w > t {
			continue
		}
		miss := 0.0
		if wq > 0 && rho > 0 {
			miss = rho * math.Exp(-rho*(t-w)/wq)
		}
		att += p.weight / wsum * (1 - miss)
	}
	return rho, mean, att
}

// attainable is the fraction of prompts whose prefill alone (on an idle worker) fits the
// TTFT target: no pool size gets more.
func (m *model) attainable(ps []point) float64 {
	_, _, att := queue(ps, 0, m.decodeAlone(), m.sla[0])
	return att
}

func (m *model) decodeAlone() float64 { return m.perf.Decode(1, 1).Seconds() * m.corrDC }

// split divides ps at the disaggregation threshold: prompts computed remotely (at least
// minRemote uncached tokens) and locally, with the remote share of the weight.
func (m *model) split(ps []point) (remote, local []point, share float64) {
	for _, p := range ps {
		if p.u >= float64(max(m.minRemote, 1)) {
			remote = append(remote, p)
			share += p.weight
		} else {
			local = append(local, p)
		}
	}
	return remote, local, share
}

// decode evaluates n decode workers for wl's requests, with local prefill work of
// utilisation rhoLocal (per worker) and variance of prefill work per second varLocal: the
// mean inter-token latency ITL = (a + b·B)/(1 − ρ) with B = λ·O·ITL sequences per worker
// (Little), and its tail at the goal from the batch's Poisson spread and the prefill work
// a request's life shares its steps with.
func (m *model) decode(n int, wl Workload, rhoLocal, varLocal float64) (itl, tail float64, ok bool) {
	lw := wl.Rate / float64(n)
	out := max(wl.Output, 1)
	ctx := wl.Input + out/2
	a, b := m.decodeLine(ctx)
	den := 1 - rhoLocal - b*lw*out
	if den <= 0.02 {
		return math.Inf(1), math.Inf(1), false
	}
	itl = a / den
	batch := lw * out * itl
	life := out * itl
	tail = (a+b*(batch+math.Sqrt(batch)))/(1-rhoLocal) + m.z*math.Sqrt(lw*life*varLocal)/out
	ok = tail <= m.sla[1] &&
		batch+m.z*math.Sqrt(batch) <= float64(m.cap.MaxSeqs) &&
		(m.cap.KVTokens <= 0 || (batch+m.z*math.Sqrt(batch))*(wl.Input+out) <= 0.9*float64(m.cap.KVTokens))
	return itl, tail, ok
}

// ttftGoal is the TTFT attainment to require: the goal, or a little under what an idle
// pool attains when prompts alone take longer than the target.
func (m *model) ttftGoal(att float64) float64 { return min(m.goal, att-0.005) }

// evalPrefill evaluates a disaggregated prefill pool of n workers.
func (m *model) evalPrefill(n int, wl Workload) Prediction {
	remote, _, share := m.split(m.points(wl))
	p := Prediction{Workers: n, TTFTAttainment: 1, OK: true}
	if len(remote) == 0 || wl.Rate*share <= 0 {
		return p
	}
	rho, mean, att := queue(remote, wl.Rate*share/float64(n), 0, m.sla[0])
	p.TTFT, p.TTFTAttainment, p.Utilization = seconds(mean), att, rho
	p.OK = att >= m.ttftGoal(m.attainable(remote))
	return p
}

// evalDecode evaluates a disaggregated decode pool of n workers, which also prefills the
// prompts below the disaggregation threshold.
func (m *model) evalDecode(n int, wl Workload) Prediction {
	_, local, share := m.split(m.points(wl))
	lw := wl.Rate / float64(n)
	rho, v := 0.0, 0.0
	for _, p := range local {
		rho += lw * p.weight * p.w
		v += lw * p.weight * p.w * p.w
	}
	itl, tail, ok := m.decode(n, wl, rho, v)
	p := Prediction{Workers: n, TTFTAttainment: 1, ITL: seconds(itl), ITLTail: seconds(tail), Utilization: rho, OK: ok}
	if len(local) > 0 && 1-share > 0 {
		// Short prompts wait behind the decode steps they share.
		_, mean, att := queue(local, lw*(1-share), m.decodeAlone(), m.sla[0])
		p.TTFT, p.TTFTAttainment = seconds(mean), att
	}
	return p
}

// evalAggregated evaluates n workers that prefill and decode: prefill chunks share steps
// with the decode batch, which lengthens both.
func (m *model) evalAggregated(n int, wl Workload) Prediction {
	ps := m.points(wl)
	lw := wl.Rate / float64(n)
	p := Prediction{Workers: n}
	rho, v := 0.0, 0.0
	for _, x := range ps {
		rho += lw * x.weight * x.w
		v += lw * x.weight * x.w * x.w
	}
	itl, tail, ok := m.decode(n, wl, rho, v)
	if !ok && math.IsInf(itl, 1) {
		p.ITL, p.ITLTail, p.TTFT = seconds(itl), seconds(tail), seconds(itl)
		return p
	}
	// Each prefill chunk shares its step with the decode batch.
	a, b := m.decodeLine(wl.Input + max(wl.Output, 1)/2)
	batch := lw * max(wl.Output, 1) * itl
	rhoP, mean, att := queue(ps, lw, a+b*batch, m.sla[0])
	p.TTFT, p.TTFTAttainment, p.ITL, p.ITLTail, p.Utilization = seconds(mean), att, seconds(itl), seconds(tail), rhoP
	p.OK = ok && att >= m.ttftGoal(m.attainable(ps))
	return p
}

func seconds(s float64) time.Duration {
	if math.IsInf(s, 0) || s > 1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// eval evaluates n workers of pool p.
func (m *model) eval(p Pool, n int, wl Workload) Prediction {
	n = max(n, 1)
	switch p {
	case Prefill:
		return m.evalPrefill(n, wl)
	case Decode:
		return m.evalDecode(n, wl)
	}
	return m.evalAggregated(n, wl)
}

// size returns the fewest workers of pool p, within [lo, hi], that meet the targets under
// wl, and false (with hi) when even hi does not.
func (m *model) size(p Pool, wl Workload, lo, hi int) (int, bool) {
	lo, hi = max(lo, 1), max(hi, 1)
	if wl.Rate <= 0 {
		return lo, true
	}
	i := sort.Search(hi-lo+1, func(i int) bool { return m.eval(p, lo+i, wl).OK })
	if i > hi-lo {
		return hi, false
	}
	return lo + i, true
}

// Size returns the fewest workers of pool p, up to max, that meet the targets under wl by
// perf and capacity: the throughput loop's sizing without its corrections, for tools that
// size a workload offline (tandem plan's first guess). False: not even max do.
func Size(cfg Config, p Pool, wl Workload, max int) (int, Prediction, bool) {
	cfg.defaults()
	m := newModel(cfg.Perf, cfg.Capacity, cfg.SLA.TTFT, cfg.SLA.ITL, cfg.Goal, cfg.MinRemoteTokens)
	n, ok := m.size(p, wl, 1, max)
	return n, m.eval(p, n, wl), ok
}
