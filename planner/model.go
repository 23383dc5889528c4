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
	// Outputs is the distribution of output lengths (nil: all at Output): a short answer
	// is far more exposed to the prefill chunks its steps share than a long one.
	Outputs []Weighted
}

// A Prediction is the model's verdict on a pool of Workers under a workload.
type Prediction struct {
	Workers int
	// TTFT is the mean time to first token of the requests prefilled in the pool, and
	// TTFTAttainment the fraction of them within the TTFT target (1 for a decode pool).
	TTFT           time.Duration
	TTFTAttainment float64
	// ITL is the mean inter-token latency of the tokens decoded in the pool, ITLTail the
	// requests' mean inter-token latency at the goal's quantile, and ITLAttainment the
	// fraction of requests within the ITL target (0, 0 and 1 for a prefill pool).
	ITL, ITLTail  time.Duration
	ITLAttainment float64
	// Utilization is the share of the workers' time spent prefilling.
	Utilization float64
	// OK says whether the pool meets its targets at the goal: in an aggregated pool the
	// requests that miss either target are at most those the goal allows; in a
	// disaggregated deployment each pool has its share of them.
	OK bool
}

// model evaluates pools of workers with a Perf, corrected by the factors the planner
// measures (multipliers of the modelled prefill work and decode step).
type model struct {
	perf                Perf
	cap                 Capacity
	sla                 [2]float64 // TTFT and ITL targets, seconds
	goal                float64    // the quantile the load loop reports (each target's half of the misses)
	goalBoth            float64    // the fraction of requests that should meet both targets
	z                   float64    // the goal's quantile of a standard normal
	minRemote           int
	balanced            bool // the router weighs the prefill work queued (Config.PrefillRouting)
	corrPrefill, corrDC float64
	scratch             [2 * (itlGrid + 1)]float64
}

// modelOf is the model of a configuration, defaults filled in.
func modelOf(c *Config) *model {
	capa := c.Capacity
	capa.TokenBudget = cmpOr(capa.TokenBudget, 8192)
	capa.MaxSeqs = cmpOr(capa.MaxSeqs, 256)
	each := 1 - (1-c.Goal)/2 // a request meets both: give each target half the misses
	return &model{perf: c.Perf, cap: capa, sla: [2]float64{c.SLA.TTFT.Seconds(), c.SLA.ITL.Seconds()}, goal: each, goalBoth: c.Goal,
		z: math.Sqrt2 * math.Erfinv(2*each-1), minRemote: c.MinRemoteTokens, balanced: c.PrefillRouting, corrPrefill: 1, corrDC: 1}
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

// queue is a pool's prefill queue: c workers, prompts arriving at rate lambda (the
// pool's), each taking its point's work plus extra per chunk. How long they wait depends
// on the router. One that places prompts without regard to the prefill work queued on
// each worker (round robin, random, a cost of decode load alone) makes c separate M/G/1
// queues, and a heavy-tailed prompt stalls those behind it on its worker. One that weighs
// it (kv routing with an overlap weight, least-loaded) balances about as well as a
// choice between two workers does: measured in the simulator on the Mooncake trace, its
// waits lie between c M/G/1 queues' and one M/G/c queue's, close to (a little under) c/2
// M/G/2 queues', each with its share of the prompts. So the pool is taken for c/g M/G/g
// queues, g = 1 or 2. It returns the utilisation, the mean time to first token, and the
// fraction of first tokens within target t: a prompt waits with the Erlang-C
// probability, and then exponentially; the mean wait is the Allen–Cunneen
// approximation (M/M/g's, times (1 + C²)/2 for the work's coefficient of variation C;
// for g = 1 it is the Pollaczek–Khinchine mean).
func queue(ps []point, lambda float64, c, g int, extraPerChunk, t float64) (rho, mean, att float64) {
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
	c = max(c, 1)
	g = min(c, max(g, 1))
	a := lambda * ew * float64(g) / float64(c)
	rho = a / float64(g)
	if rho >= 0.99 {
		return rho, math.Inf(1), 0
	}
	pw := erlangC(g, a)
	wq := 0.0
	if ew > 0 {
		wq = pw * ew2 / (2 * ew * float64(g) * (1 - rho))
	}
	mean = ew + wq
	for _, p := range ps {
		w := p.w + extraPerChunk*float64(p.chunks)
		if w > t {
			continue
		}
		miss := 0.0
		if wq > 0 && pw > 0 {
			miss = pw * math.Exp(-pw*(t-w)/wq)
		}
		att += p.weight / wsum * (1 - miss)
	}
	return rho, mean, att
}

// group is how many workers the router's choice balances a prompt over, in effect (see
// queue).
func (m *model) group() int {
	if m.balanced {
		return 2
	}
	return 1
}

// erlangC is the probability that a request waits in an M/M/c queue of offered load a
// (in servers), by the stable recursion of Erlang's B formula.
func erlangC(c int, a float64) float64 {
	if a <= 0 {
		return 0
	}
	b := 1.0
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	den := float64(c) - a*(1-b)
	if den <= 0 {
		return 1
	}
	return min(1, float64(c)*b/den)
}

// attainable is the fraction of prompts whose prefill alone (on an idle worker) fits the
// TTFT target: no pool size gets more.
func (m *model) attainable(ps []point) float64 {
	_, _, att := queue(ps, 0, 1, 1, m.decodeAlone(), m.sla[0])
	return att
}

func (m *model) decodeAlone() float64 { return m.perf.Decode(1, 1).Seconds() * m.corrDC }

// allowed is the fraction of requests that may miss a target: the goal's, or, when more
// prompts than half of that can never meet the TTFT target (their prefill alone takes
// longer), those and half the goal's, so that the misses no size can help do not ask
// for endless workers.
func (m *model) allowed(unattainable float64) float64 {
	return max(1-m.goalBoth, unattainable+(1-m.goalBoth)/2)
}

// shares splits what a disaggregated deployment may miss between its pools: the prefill
// pool's TTFT misses (those no size helps and half the rest) and the decode pool's ITL
// misses (the other half).
func (m *model) shares(unattainable float64) (prefill, decode float64) {
	rest := (m.allowed(unattainable) - unattainable) / 2
	return unattainable + rest, rest
}

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

// decode evaluates n decode workers for wl's requests, with prefill work of utilisation
// rho per worker sharing their steps: the token-weighted mean inter-token latency
// ITL = (a + b·B)/(1 − ρ), with B = λ·O·ITL sequences per worker (Little), the batch B,
// and the decode step of a request at the batch's Poisson spread (B + √B), which its
// tail is judged at; false when the batch outgrows the sequence cap or the KV.
func (m *model) decode(n int, wl Workload, rho float64) (itl, batch, step float64, ok bool) {
	lw := wl.Rate / float64(n)
	out := max(wl.Output, 1)
	ctx := wl.Input + out/2
	a, b := m.decodeLine(ctx)
	den := 1 - rho - b*lw*out
	if den <= 0.02 {
		return math.Inf(1), math.Inf(1), math.Inf(1), false
	}
	itl = a / den
	batch = lw * out * itl
	step = a + b*(batch+math.Sqrt(batch))
	ok = batch+m.z*math.Sqrt(batch) <= float64(m.cap.MaxSeqs) && (m.cap.KVTokens <= 0 || m.kvHigh(wl, batch) <= 0.9*float64(m.cap.KVTokens))
	return itl, batch, step, ok
}

// kvZ is how many standard deviations over its mean the KV a worker's batch holds is
// kept under its capacity: one that overflows preempts and recomputes, and a worker near
// its KV does so again and again.
const kvZ = 3

// kvHigh is the KV tokens a batch of batch sequences of wl holds, kvZ standard
// deviations over the mean: a Poisson number of sequences, each its prompt and output.
// Prompts are as heavy-tailed as the uncached tokens' distribution (its second moment
// relative to its mean's square), so a few long ones can fill a worker's KV that the
// mean prompt would not.
func (m *model) kvHigh(wl Workload, batch float64) float64 {
	out := max(wl.Output, 1)
	k2, mean := 1.0, 0.0
	if len(wl.Uncached) > 0 {
		m2, ws := 0.0, 0.0
		for _, x := range wl.Uncached {
			mean += x.Weight * x.Value
			m2 += x.Weight * x.Value * x.Value
			ws += x.Weight
		}
		if mean > 0 && ws > 0 {
			k2 = m2 * ws / (mean * mean)
		}
	}
	in := wl.Input
	ctx2 := k2*in*in + 2*in*out + out*out
	return batch*(in+out) + kvZ*math.Sqrt(batch*ctx2)
}

// queuedBehind is the share of a worker's arrivals that the router still sends it while
// a prompt it holds waits for its first token: that work is prefilled in the steps the
// prompt then decodes in. The router steers new prompts to the least loaded worker,
// which the one holding pending prefill work seldom is (with round robin it would be 1).
const queuedBehind = 0.5

// itlGrid is the resolution of the prefill work a request's decode steps share, in steps
// of its slack: the compound Poisson distribution is computed on this many points.
const itlGrid = 96

// steps is what a pool's requests decode in: steps of step seconds, shared with the
// prefill chunks of ps's prompts (each its work plus extra per chunk), which arrive at lw
// per worker and take a share rho of its time; a request waits ttft seconds for its first
// token, and outs is the distribution of output lengths.
type steps struct {
	ps                         []point
	extra, lw, rho, step, ttft float64
	outs                       []Weighted
}

// itlAttainment is the fraction of requests whose mean inter-token latency meets target
// t. A request of o output tokens decodes o − 1 steps of step seconds each, and
// shares them with the prefill chunks of the prompts its worker computes meanwhile (ps's
// work, plus extra per chunk): those that arrive while it decodes, over a life of
// (o−1)·step/(1 − ρ), and those queued behind it while it waited its ttft seconds for
// its first token (queuedBehind of the worker's arrivals). Prompts arrive at lw per
// worker, so that work is compound Poisson; the request misses when it exceeds its slack,
// (o−1)·(t − step). A short answer is thus far more exposed than a long one, whose
// steps average out one prompt's chunks: the output lengths' distribution matters, not
// only their mean, and so does the prompts' tail.
func (m *model) itlAttainment(s *steps, t float64) float64 {
	att, wsum := 0.0, 0.0
	for _, o := range s.outs {
		wsum += o.Weight
		k := math.Round(o.Value) - 1
		if k < 1 {
			att += o.Weight // one token: no inter-token latency to miss
			continue
		}
		slack := k * (t - s.step)
		if slack <= 0 || s.rho >= 1 {
			continue
		}
		arrivals := s.lw * (queuedBehind*s.ttft + k*s.step/(1-s.rho))
		att += o.Weight * m.cpBelow(s.ps, s.extra, arrivals, slack)
	}
	if wsum <= 0 {
		return 1
	}
	return att / wsum
}

// itlQuantile is the requests' mean inter-token latency at the goal's quantile (each
// target's half of the misses), by bisection on the target of itlAttainment; +Inf beyond
// a hundred times the target.
func (m *model) itlQuantile(s *steps) float64 {
	lo, hi := s.step, 100*m.sla[1]
	if m.itlAttainment(s, hi) < m.goal {
		return math.Inf(1)
	}
	for range 12 {
		if mid := math.Sqrt(lo * hi); m.itlAttainment(s, mid) >= m.goal {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// cpBelow is the probability that the work of a Poisson number (mean n) of prompts drawn
// from ps (each its work plus extra per chunk) is at most x: Panjer's recursion on a
// grid of x/itlGrid, the normal approximation when n is large.
func (m *model) cpBelow(ps []point, extra, n, x float64) float64 {
	if n <= 0 {
		return 1
	}
	h := x / itlGrid
	f := m.scratch[:itlGrid+1]
	clear(f)
	ew, ew2, wsum := 0.0, 0.0, 0.0
	for _, p := range ps {
		w := p.w + extra*float64(p.chunks)
		wsum += p.weight
		ew += p.weight * w
		ew2 += p.weight * w * w
		if j := math.Round(w / h); j <= itlGrid {
			f[int(j)] += p.weight
		}
	}
	if wsum <= 0 {
		return 1
	}
	if n > 200 {
		mean, sd := n*ew/wsum, math.Sqrt(n*ew2/wsum)
		return 0.5 * math.Erfc((mean-x)/(sd*math.Sqrt2))
	}
	for j := range f {
		f[j] /= wsum
	}
	g := m.scratch[itlGrid+1 : 2*(itlGrid+1)]
	g[0] = math.Exp(-n * (1 - f[0]))
	below := g[0]
	for s := 1; s <= itlGrid; s++ {
		v := 0.0
		for j := 1; j <= s; j++ {
			v += float64(j) * f[j] * g[s-j]
		}
		g[s] = n / float64(s) * v
		below += g[s]
	}
	return min(1, below)
}

// evalPrefill evaluates a disaggregated prefill pool of n workers: it queues the
// prompts at or over the disaggregation threshold.
func (m *model) evalPrefill(n int, wl Workload) Prediction {
	remote, _, share := m.split(m.points(wl))
	p := Prediction{Workers: n, TTFTAttainment: 1, ITLAttainment: 1, OK: true}
	if len(remote) == 0 || wl.Rate*share <= 0 {
		return p
	}
	rho, mean, att := queue(remote, wl.Rate*share, n, m.group(), 0, m.sla[0])
	p.TTFT, p.TTFTAttainment, p.Utilization = seconds(mean), att, rho
	mine, _ := m.shares(1 - m.attainable(remote))
	p.OK = 1-att <= mine
	return p
}

// evalDecode evaluates a disaggregated decode pool of n workers, which also prefills the
// prompts below the disaggregation threshold.
func (m *model) evalDecode(n int, wl Workload, tail bool) Prediction {
	remote, local, share := m.split(m.points(wl))
	lw := wl.Rate / float64(n)
	rho := 0.0
	for _, p := range local {
		rho += lw * p.weight * p.w
	}
	itl, _, step, ok := m.decode(n, wl, rho)
	p := Prediction{Workers: n, TTFTAttainment: 1, ITL: seconds(itl), Utilization: rho}
	if math.IsInf(itl, 1) {
		p.ITLTail = p.ITL
		return p
	}
	if len(local) > 0 && 1-share > 0 {
		// Short prompts wait behind the decode steps they share.
		_, mean, att := queue(local, wl.Rate*(1-share), n, m.group(), m.decodeAlone(), m.sla[0])
		p.TTFT, p.TTFTAttainment = seconds(mean), att
	}
	// A remotely prefilled request decodes as soon as its KV is in: only local prompts
	// arriving while it decodes share its steps.
	st := steps{ps: local, lw: lw, rho: rho, step: step, outs: outputs(wl)}
	p.ITLAttainment = m.itlAttainment(&st, m.sla[1])
	if tail {
		p.ITLTail = seconds(m.itlQuantile(&st))
	}
	_, mine := m.shares(1 - m.attainable(remote))
	p.OK = ok && 1-p.ITLAttainment <= mine
	return p
}

// evalAggregated evaluates n workers that prefill and decode: prefill chunks share steps
// with the decode batch, which lengthens both, and the misses of the two targets together
// are held to what the goal allows.
func (m *model) evalAggregated(n int, wl Workload, tail bool) Prediction {
	ps := m.points(wl)
	lw := wl.Rate / float64(n)
	p := Prediction{Workers: n}
	rho := 0.0
	for _, x := range ps {
		rho += lw * x.weight * x.w
	}
	itl, batch, step, ok := m.decode(n, wl, rho)
	if math.IsInf(itl, 1) {
		p.ITL, p.ITLTail, p.TTFT = seconds(itl), seconds(itl), seconds(itl)
		return p
	}
	// Each prefill chunk shares its step with the decode batch.
	a, b := m.decodeLine(wl.Input + max(wl.Output, 1)/2)
	extra := a + b*batch
	rhoP, mean, att := queue(ps, wl.Rate, n, m.group(), extra, m.sla[0])
	p.TTFT, p.TTFTAttainment, p.ITL, p.Utilization = seconds(mean), att, seconds(itl), rhoP
	if math.IsInf(mean, 1) {
		return p
	}
	st := steps{ps: ps, extra: extra, lw: lw, rho: rho, step: step, ttft: mean, outs: outputs(wl)}
	p.ITLAttainment = m.itlAttainment(&st, m.sla[1])
	if tail {
		p.ITLTail = seconds(m.itlQuantile(&st))
	}
	p.OK = ok && (1-att)+(1-p.ITLAttainment) <= m.allowed(1-m.attainable(ps))
	return p
}

// outputs is wl's distribution of output lengths, all at the mean without one.
func outputs(wl Workload) []Weighted {
	if len(wl.Outputs) > 0 {
		return wl.Outputs
	}
	return []Weighted{{Value: max(wl.Output, 1), Weight: 1}}
}

func seconds(s float64) time.Duration {
	if math.IsInf(s, 0) || s > 1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// eval evaluates n workers of pool p.
func (m *model) eval(p Pool, n int, wl Workload) Prediction { return m.evalPool(p, n, wl, false) }

// evalTail is eval with the ITL's tail (Prediction.ITLTail), which takes a search.
func (m *model) evalTail(p Pool, n int, wl Workload) Prediction { return m.evalPool(p, n, wl, true) }

func (m *model) evalPool(p Pool, n int, wl Workload, tail bool) Prediction {
	n = max(n, 1)
	switch p {
	case Prefill:
		return m.evalPrefill(n, wl)
	case Decode:
		return m.evalDecode(n, wl, tail)
	}
	return m.evalAggregated(n, wl, tail)
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
	m := modelOf(&cfg)
	n, ok := m.size(p, wl, 1, max)
	return n, m.eval(p, n, wl), ok
}
