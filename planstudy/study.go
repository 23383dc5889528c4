// Package planstudy is the study behind tandem plan (docs/planner.md): over the simulator,
// the smallest fixed pools that meet an SLA, the SLA planner in the loop, start-up sweeps,
// and a verdict on aggregated against disaggregated serving.
package planstudy

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"tandem/bench"
	"tandem/planner"
	"tandem/router"
	"tandem/sim"
	"tandem/sla"
)

// Config is what a Study plans for.
type Config struct {
	Requests   []sim.Request
	Targets    sla.Targets
	Goal       float64       // the fraction of requests that should meet both targets
	Window     time.Duration // attainment is judged per window too
	MaxWorkers int
	Base       sim.Config     // the workers, router and timing every simulation starts from
	Planner    planner.Config // the planner's configuration (bounds, intervals, predictor)
	Log        io.Writer      // progress lines
}

// New returns a study of c.
func New(c Config) *Study {
	return &Study{reqs: c.Requests, targets: c.Targets, goal: c.Goal, window: c.Window, max: c.MaxWorkers,
		base: c.Base, pcfg: c.Planner, stderr: c.Log, cache: map[string]*outcome{}}
}

// Sims is how many simulations the study ran.
func (p *Study) Sims() int { return p.sims }

// Ramp is tandem plan's synthetic ramp: a Poisson rate at BaseRate for Hold, up to
// BaseRate×Factor over Up, back over Up, then BaseRate for Hold again; prompts share one
// of Groups system prompts of SystemLen tokens and vary ±50 % around InputLen, as outputs
// do around OutputLen.
type Ramp struct {
	BaseRate, Factor               float64
	Hold, Up                       time.Duration
	InputLen, OutputLen, SystemLen int
	Groups                         int
}

func (r Ramp) rate(t time.Duration) float64 {
	b, f := r.BaseRate, r.Factor
	switch {
	case t < r.Hold || t >= r.Hold+2*r.Up:
		return b
	case t < r.Hold+r.Up:
		return b + b*(f-1)*float64(t-r.Hold)/float64(r.Up)
	default:
		return b*f - b*(f-1)*float64(t-r.Hold-r.Up)/float64(r.Up)
	}
}

// Requests draws the ramp's requests.
func (r Ramp) Requests(seed int64) ([]sim.Request, error) {
	if !(r.BaseRate > 0) || !(r.Factor >= 1) || r.Hold < 0 || r.Up <= 0 || r.InputLen < 2 || r.OutputLen < 1 || r.SystemLen < 0 || r.SystemLen >= r.InputLen || r.Groups < 1 {
		return nil, errors.New("ramp: --ramp-base-rate and --ramp-up must be positive, --ramp-factor ≥ 1, --ramp-system-len below --ramp-input-len")
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7a4b))
	peak := r.BaseRate * r.Factor
	end := 2*r.Hold + 2*r.Up
	jitter := func(n int) int { return max(1, int(float64(n)*(0.5+rng.Float64()))) }
	var reqs []sim.Request
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / peak * float64(time.Second))
		if t >= end {
			return reqs, nil
		}
		if rng.Float64()*peak > r.rate(t) { // thinning: a Poisson process of rate r.rate(t)
			continue
		}
		sys := r.SystemLen
		own := max(1, jitter(r.InputLen)-sys)
		segs := []bench.Segment{{Seed: uint64(rng.IntN(r.Groups)) + 1, Len: sys}, {Seed: rng.Uint64() | 1<<40, Len: own}}
		if sys == 0 {
			segs = segs[1:]
		}
		reqs = append(reqs, sim.Request{At: t, Segments: segs, OutputLen: jitter(r.OutputLen)})
	}
}

// Study runs the simulations of tandem plan; New makes one.
type Study struct {
	reqs    []sim.Request
	targets sla.Targets
	goal    float64
	window  time.Duration
	max     int
	base    sim.Config
	pcfg    planner.Config
	stderr  io.Writer

	mu    sync.Mutex
	cache map[string]*outcome
	sims  int
}

// outcome is one simulation's figures.
type outcome struct {
	Name          string  `json:"name"`
	Pools         string  `json:"pools"`
	Prefill       int     `json:"prefill_workers,omitempty"` // fixed pools: their sizes
	Decode        int     `json:"decode_workers,omitempty"`
	Both          int     `json:"workers,omitempty"`
	WorkerSeconds float64 `json:"worker_seconds"`
	Attainment    float64 `json:"attainment"`
	Worst         float64 `json:"worst_window_attainment"`
	TTFTp50       float64 `json:"ttft_p50_ms"`
	TTFTp95       float64 `json:"ttft_p95_ms"`
	TPOTp50       float64 `json:"tpot_p50_ms"`
	TPOTp95       float64 `json:"tpot_p95_ms"`
	TTFTMean      float64 `json:"ttft_mean_ms"`
	Failed        int     `json:"failed"`
	Startup       float64 `json:"startup_s"`
	Planner       bool    `json:"planner"`
	// Hindsight: the pools sized per window knowing the whole workload (a bound on what
	// any sizing policy can save), not a deployment one could run.
	Hindsight    bool `json:"hindsight,omitempty"`
	MeanReplicas []float64
	PeakReplicas []int
	res          *sim.Result
	wins         []window // per window, by arrival
	fine         []window // per adjustment interval (the planner's), by arrival
	peak         bool     // the smallest fixed pools meeting the SLA at peak: the reference
}

// window is one window's requests and those that met the SLA.
type window struct{ n, good int }

// tally counts a request, which met the SLA or not, in window k of ws, which it grows to
// hold k.
func tally(ws []window, k int, met bool) []window {
	for len(ws) <= k {
		ws = append(ws, window{})
	}
	ws[k].n++
	if met {
		ws[k].good++
	}
	return ws
}

// meets says whether o meets the SLA overall (a planner's test) and in every window
// (a fixed pool's "at peak").
func (p *Study) meetsOverall(o *outcome) bool { return o.Attainment >= p.goal }
func (p *Study) meetsPeak(o *outcome) bool    { return o.Attainment >= p.goal && o.Worst >= p.goal }

// simulate runs one configuration (cached by name).
func (p *Study) simulate(name string, cfg sim.Config) (*outcome, error) {
	p.mu.Lock()
	if o, ok := p.cache[name]; ok {
		p.mu.Unlock()
		return o, nil
	}
	p.mu.Unlock()
	t0 := time.Now()
	res, err := sim.Run(cfg, p.reqs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	o := p.measure(name, res)
	o.Startup = cfg.Startup.Seconds()
	o.Planner = cfg.Planner != nil
	o.Hindsight = cfg.Scripted != nil
	p.mu.Lock()
	p.cache[name] = o
	p.sims++
	p.mu.Unlock()
	fmt.Fprintf(p.stderr, "  %-44s %-22s %8.2f worker-h  attainment %.3f (worst window %.3f)  %.0f s\n", name, o.Pools,
		o.WorkerSeconds/3600, o.Attainment, o.Worst, time.Since(t0).Seconds())
	return o, nil
}

func (p *Study) measure(name string, res *sim.Result) *outcome {
	o := &outcome{Name: name, res: res}
	for _, s := range res.WorkerSeconds {
		o.WorkerSeconds += s
	}
	slo := bench.SLO{TTFT: p.targets.TTFT, TPOT: p.targets.ITL}
	good := 0
	var ttft, tpot []float64
	for i := range res.Bench.Requests {
		r := &res.Bench.Requests[i]
		met := slo.Meets(r)
		o.wins = tally(o.wins, int(r.Start/p.window), met)
		o.fine = tally(o.fine, int(r.Start/p.pcfg.Interval), met)
		if !r.OK() {
			o.Failed++
			continue
		}
		ttft = append(ttft, float64(r.TTFT)/1e6)
		if r.OutputLen > 1 {
			tpot = append(tpot, float64(r.TPOT())/1e6)
		}
		if met {
			good++
		}
	}
	o.Attainment = float64(good) / float64(len(res.Bench.Requests))
	o.Worst = 1
	for _, w := range o.wins {
		if w.n >= 20 { // a window of a handful of requests says little
			o.Worst = min(o.Worst, float64(w.good)/float64(w.n))
		}
	}
	st := bench.ComputeStats(ttft, []float64{50, 95})
	o.TTFTp50, o.TTFTp95, o.TTFTMean = pct(st, 50), pct(st, 95), st.Mean
	st = bench.ComputeStats(tpot, []float64{50, 95})
	o.TPOTp50, o.TPOTp95 = pct(st, 50), pct(st, 95)
	if res.Plan != nil {
		o.MeanReplicas = res.Plan.MeanReplicas[:]
		o.PeakReplicas = res.Plan.PeakReplicas[:]
	}
	return o
}

func pct(s bench.Stats, p float64) float64 { return s.Percentiles[p] }

func (p *Study) aggregated(n int) (*outcome, error) {
	cfg := p.base
	cfg.Workers = n
	o, err := p.simulate(fmt.Sprintf("fixed aggregated ×%d", n), cfg)
	if err == nil {
		o.Pools, o.Both = fmt.Sprint(n), n
	}
	return o, err
}

func (p *Study) disaggregated(np, nd int) (*outcome, error) {
	cfg := p.base
	cfg.PrefillWorkers, cfg.DecodeWorkers = np, nd
	o, err := p.simulate(fmt.Sprintf("fixed disaggregated %dP+%dD", np, nd), cfg)
	if err == nil {
		o.Pools, o.Prefill, o.Decode = fmt.Sprintf("%dP + %dD", np, nd), np, nd
	}
	return o, err
}

// hindsight sizes the aggregated pool knowing the whole workload, from fixed pools of
// each size below peak (the smallest meeting the SLA in every window) down to one with
// no window that meets the goal. Two schedules: each window at its smallest size that
// meets the goal there (every), and the cheapest sizes per adjustment interval that
// meet it overall (cheapest: greedily, one worker more to the interval where it meets
// the most requests per second of it, from the smallest size up), a bound on what a
// planner that resizes every interval can save. Each is replayed in the simulator, a
// size asked for the start-up time before it is due, for what it costs and attains
// with the transitions. It also returns the smallest fixed pool that meets the goal
// overall, not in every window.
func (p *Study) hindsight(peak int, startup time.Duration) (overall, every, cheapest *outcome, err error) {
	outs := map[int]*outcome{}
	lo := peak
	for n := peak; n >= 1; n-- {
		if outs[n], err = p.aggregated(n); err != nil {
			return nil, nil, nil, err
		}
		lo = n
		if p.meetsOverall(outs[n]) {
			overall = outs[n]
		}
		if !slices.ContainsFunc(outs[n].wins, func(w window) bool { return w.n > 0 && p.windowMeets(w) }) {
			break
		}
	}
	overall = rename(overall, "fixed aggregated, smallest meeting the SLA overall")
	stat := func(fine bool, n, k int) window {
		w := outs[n].wins
		if fine {
			w = outs[n].fine
		}
		if k < len(w) {
			return w[k]
		}
		return window{}
	}
	each := make([]int, len(outs[peak].wins))
	for k := range each {
		each[k] = peak
		for n := lo; n < peak; n++ {
			if p.windowMeets(stat(false, n, k)) {
				each[k] = n
				break
			}
		}
	}
	// The greedy fill: an interval's worker-seconds are its length (the last one ends
	// with the last arrival).
	step := p.pcfg.Interval
	last := p.reqs[len(p.reqs)-1].At - p.reqs[0].At
	length := func(k int) float64 {
		return max(1, min(step, last-time.Duration(k)*step).Seconds())
	}
	cheap := make([]int, len(outs[peak].fine))
	good, all := 0, 0
	for k := range cheap {
		cheap[k] = lo
		good += stat(true, lo, k).good
		all += stat(true, lo, k).n
	}
	for float64(good) < p.goal*float64(all) {
		best, gain := -1, math.Inf(-1)
		for k, n := range cheap {
			if n < peak {
				if g := float64(stat(true, n+1, k).good-stat(true, n, k).good) / length(k); g > gain {
					best, gain = k, g
				}
			}
		}
		if best < 0 {
			break
		}
		good += stat(true, cheap[best]+1, best).good - stat(true, cheap[best], best).good
		cheap[best]++
	}
	replay := func(name string, sizes []int, per time.Duration) (*outcome, error) {
		at := func(t time.Duration) int { return sizes[min(len(sizes)-1, int(t/per))] }
		cfg := p.base
		cfg.Workers, cfg.Startup = sizes[0], startup
		cfg.Scripted = func(t time.Duration) (n [planner.NumPools]int) {
			n[planner.Aggregated] = max(at(t), at(t+startup))
			return n
		}
		o, err := p.simulate(fmt.Sprintf("%s, start-up %v", name, startup), cfg)
		if err != nil {
			return nil, err
		}
		o = rename(o, name)
		o.Pools = fmt.Sprintf("%d–%d (mean %.1f)", slices.Min(sizes), slices.Max(sizes), o.res.Plan.MeanReplicas[planner.Aggregated])
		return o, nil
	}
	if every, err = replay(fmt.Sprintf("hindsight: each %v window's smallest size", p.window), each, p.window); err != nil {
		return nil, nil, nil, err
	}
	if cheapest, err = replay(fmt.Sprintf("hindsight: cheapest %v sizes meeting it overall", step), cheap, step); err != nil {
		return nil, nil, nil, err
	}
	return overall, every, cheapest, nil
}

// windowMeets says whether a window's requests met the goal (an empty one does).
func (p *Study) windowMeets(w window) bool { return float64(w.good) >= p.goal*float64(w.n) }

// smallest finds the smallest n in [1, p.max] for which ok(run(n)) holds, from a first
// guess: halving below a guess that passes, doubling above one that fails, then bisecting.
// It returns p.max+1 when even p.max fails.
func (p *Study) smallest(guess int, run func(int) (*outcome, error), ok func(*outcome) bool) (int, error) {
	test := func(n int) (bool, error) {
		o, err := run(n)
		if err != nil {
			return false, err
		}
		return ok(o), nil
	}
	guess = min(max(guess, 1), p.max)
	lo, hi := 0, p.max+1 // lo fails (0: none), hi passes
	pass, err := test(guess)
	if err != nil {
		return 0, err
	}
	if pass {
		hi = guess
		for n := guess / 2; n >= 1; n /= 2 {
			if pass, err = test(n); err != nil {
				return 0, err
			}
			if !pass {
				lo = n
				break
			}
			hi = n
		}
	} else {
		lo = guess
		for n := min(guess*2, p.max); ; n = min(n*2, p.max) {
			if pass, err = test(n); err != nil {
				return 0, err
			}
			if pass {
				hi = n
				break
			}
			lo = n
			if n == p.max {
				return p.max + 1, nil
			}
		}
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if pass, err = test(mid); err != nil {
			return 0, err
		}
		if pass {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// loadOf is the workload of the requests arriving in [from, to), for the model's first
// guesses: their rate, mean lengths, and the distributions of their prompt lengths (all
// taken as uncached: the guess does not know the cache) and output lengths, whose tails
// a mean alone would miss.
func (p *Study) loadOf(from, to time.Duration) planner.Workload {
	var c planner.Counters
	for _, r := range p.reqs {
		if r.At < from || r.At >= to {
			continue
		}
		in := 0
		for _, s := range r.Segments {
			in += s.Len
		}
		c.Arrive()
		c.Finish(planner.Aggregated, in, 0, r.OutputLen, 0)
	}
	if c.Finished == 0 {
		return planner.Workload{}
	}
	n := float64(c.Finished)
	return planner.Workload{Rate: n / (to - from).Seconds(), Input: c.Input / n, Output: c.Output / n,
		Uncached: c.Uncached.Dist(), Outputs: c.Outputs.Dist()}
}

func (p *Study) peakLoad() planner.Workload {
	var best planner.Workload
	end := p.reqs[len(p.reqs)-1].At
	for t := time.Duration(0); t <= end; t += p.window / 2 {
		if wl := p.loadOf(t, t+p.window); wl.Rate > best.Rate {
			best = wl
		}
	}
	return best
}

func (p *Study) guess(pool planner.Pool, wl planner.Workload) int {
	cfg := p.pcfg
	cfg.Perf = p.base.Timing
	cfg.Disaggregated = pool != planner.Aggregated
	cfg.MinRemoteTokens = p.base.Disagg.MinRemoteTokens
	cfg.Capacity = planner.Capacity{KVTokens: p.base.KVBlocks * p.base.BlockSize, TokenBudget: p.base.TokenBudget, MaxSeqs: p.base.MaxSeqs}
	cfg.PrefillRouting = p.base.Router.WeighsPrefill()
	n, _, _ := planner.Size(cfg, pool, wl, p.max)
	return n
}

// withPlanner runs the planner in the loop, starting from the sizes the model gives the
// first interval's load; fixed pools (nil: none) keep the sizes given.
func (p *Study) withPlanner(name string, disagg bool, startup time.Duration, fixed map[planner.Pool]int) (*outcome, error) {
	cfg := p.base
	pc := p.pcfg
	cfg.Planner, cfg.Startup = &pc, startup
	first := p.loadOf(p.reqs[0].At, p.reqs[0].At+pc.Interval)
	if disagg {
		cfg.PrefillWorkers, cfg.DecodeWorkers = p.guess(planner.Prefill, first), p.guess(planner.Decode, first)
		for pool, n := range fixed {
			pc.Fixed[pool] = true
			if pool == planner.Prefill {
				cfg.PrefillWorkers = n
			} else {
				cfg.DecodeWorkers = n
			}
		}
	} else {
		cfg.Workers = p.guess(planner.Aggregated, first)
	}
	o, err := p.simulate(name, cfg)
	if err != nil {
		return nil, err
	}
	o.Pools = plannerPools(o, disagg)
	return o, nil
}

func plannerPools(o *outcome, disagg bool) string {
	if o.res == nil || o.res.Plan == nil {
		return ""
	}
	pl := o.res.Plan
	lohi := func(pool planner.Pool) (int, int) {
		lo, hi := math.MaxInt, 0
		for _, pt := range pl.Timeline {
			lo, hi = min(lo, pt.Paid[pool]), max(hi, pt.Paid[pool])
		}
		return lo, hi
	}
	if !disagg {
		lo, hi := lohi(planner.Aggregated)
		return fmt.Sprintf("%d–%d (mean %.1f)", lo, hi, pl.MeanReplicas[planner.Aggregated])
	}
	plo, phi := lohi(planner.Prefill)
	dlo, dhi := lohi(planner.Decode)
	return fmt.Sprintf("%d–%dP + %d–%dD (%.1f+%.1f)", plo, phi, dlo, dhi, pl.MeanReplicas[planner.Prefill], pl.MeanReplicas[planner.Decode])
}

// Report is what tandem plan prints (Write) and writes as JSON (JSON).
type Report struct {
	p        *Study
	rows     []*outcome
	startups []*outcome
	timeline *outcome // the planner run whose pools are shown over time
	verdict  string
	kvSaves  float64 // TTFT saved by kv routing against round robin at the fixed aggregated size
	fixedAgg *outcome
}

// Run compares the deployments of mode (both, aggregated or disaggregated), the planner
// with each start-up time of ups (the first for the main comparison), and gives a verdict.
func (p *Study) Run(mode string, ups []time.Duration) (*Report, error) {
	rep := &Report{p: p}
	peak := p.peakLoad()
	fmt.Fprintf(p.stderr, "tandem plan: %d requests; busiest %v window %.2f req/s (mean prompt %.0f, output %.0f tokens)\n",
		len(p.reqs), p.window, peak.Rate, peak.Input, peak.Output)
	var agg, aggMean, aggPlan, dis, disMean, disPlan *outcome
	var aggOverall, hindEvery, hindCheap *outcome
	var nAgg, nP, nD int
	var err error
	s0 := ups[0]
	if mode != "disaggregated" {
		if nAgg, err = p.smallest(p.guess(planner.Aggregated, peak), p.aggregated, p.meetsPeak); err != nil {
			return nil, err
		}
		if nAgg <= p.max {
			agg, _ = p.aggregated(nAgg)
			agg = rename(agg, "fixed aggregated, smallest meeting the SLA at peak")
			agg.peak = true
			rep.fixedAgg = agg
			// KV-aware routing against round robin at that size.
			cfg := p.base
			cfg.Workers = nAgg
			cfg.Router.Mode = router.ModeRoundRobin
			rr, err := p.simulate(fmt.Sprintf("fixed aggregated ×%d, round robin", nAgg), cfg)
			if err != nil {
				return nil, err
			}
			if rr.TTFTMean > 0 {
				rep.kvSaves = 1 - agg.TTFTMean/rr.TTFTMean
			}
			if aggOverall, hindEvery, hindCheap, err = p.hindsight(nAgg, s0); err != nil {
				return nil, err
			}
		}
		if aggPlan, err = p.withPlanner("planner, aggregated", false, s0, nil); err != nil {
			return nil, err
		}
		m := int(math.Ceil(aggPlan.MeanReplicas[planner.Aggregated] - 1e-9))
		if aggMean, err = p.aggregated(max(m, 1)); err != nil {
			return nil, err
		}
		aggMean = rename(aggMean, "fixed aggregated, the planner's mean size")
	}
	if mode != "aggregated" {
		gp, gd := p.guess(planner.Prefill, peak), p.guess(planner.Decode, peak)
		big := min(p.max, 2*gp+2)
		if nD, err = p.smallest(gd, func(n int) (*outcome, error) { return p.disaggregated(big, n) }, p.meetsPeak); err != nil {
			return nil, err
		}
		if nD <= p.max {
			if nP, err = p.smallest(gp, func(n int) (*outcome, error) { return p.disaggregated(n, nD) }, p.meetsPeak); err != nil {
				return nil, err
			}
			if nP <= p.max {
				// Fewer prefill workers can raise the decode pool's share of prefills (a busy
				// prefill pool): check the decode size again.
				if nD, err = p.smallest(nD, func(n int) (*outcome, error) { return p.disaggregated(nP, n) }, p.meetsPeak); err != nil {
					return nil, err
				}
			}
		}
		// A larger decode pool takes what a busy prefill pool hands back (short prompts,
		// conditional disaggregation), and a smaller prefill pool may then do: try one
		// decode worker more at a time while the total falls.
		for nP > 2 && nP <= p.max && nD < p.max {
			// Only a prefill pool two smaller lowers the total: if that does not meet the
			// SLA, none smaller does.
			o, err := p.disaggregated(nP-2, nD+1)
			if err != nil {
				return nil, err
			}
			if !p.meetsPeak(o) {
				break
			}
			np, err := p.smallest(nP-2, func(n int) (*outcome, error) { return p.disaggregated(n, nD+1) }, p.meetsPeak)
			if err != nil {
				return nil, err
			}
			nP, nD = np, nD+1
		}
		if nP <= p.max && nD <= p.max {
			dis, _ = p.disaggregated(nP, nD)
			dis = rename(dis, "fixed disaggregated, smallest meeting the SLA at peak")
			dis.peak = true
		}
		if disPlan, err = p.withPlanner("planner, disaggregated", true, s0, nil); err != nil {
			return nil, err
		}
		mp := max(1, int(math.Ceil(disPlan.MeanReplicas[planner.Prefill]-1e-9)))
		md := max(1, int(math.Ceil(disPlan.MeanReplicas[planner.Decode]-1e-9)))
		if disMean, err = p.disaggregated(mp, md); err != nil {
			return nil, err
		}
		disMean = rename(disMean, "fixed disaggregated, the planner's mean sizes")
	}
	var onlyP, onlyD *outcome
	if dis != nil {
		// A planner that scales one pool, the other fixed at its peak size.
		var wg sync.WaitGroup
		var e1, e2 error
		par := runtime.GOMAXPROCS(0) > 1
		run1 := func() {
			onlyP, e1 = p.withPlanner("planner, prefill pool only", true, s0, map[planner.Pool]int{planner.Decode: nD})
		}
		run2 := func() {
			onlyD, e2 = p.withPlanner("planner, decode pool only", true, s0, map[planner.Pool]int{planner.Prefill: nP})
		}
		if par {
			wg.Go(run1)
			wg.Go(run2)
			wg.Wait()
		} else {
			run1()
			run2()
		}
		if err := errors.Join(e1, e2); err != nil {
			return nil, err
		}
	}
	for _, o := range []*outcome{agg, aggOverall, hindEvery, hindCheap, aggMean, aggPlan, dis, disMean, disPlan, onlyP, onlyD} {
		if o != nil {
			rep.rows = append(rep.rows, o)
		}
	}

	// The verdict, and the deployment whose planner the start-up sweep and timeline use.
	aggCost, disCost := math.Inf(1), math.Inf(1)
	if agg != nil {
		aggCost = agg.WorkerSeconds
	}
	if aggPlan != nil && p.meetsOverall(aggPlan) {
		aggCost = min(aggCost, aggPlan.WorkerSeconds)
	}
	if dis != nil {
		disCost = dis.WorkerSeconds
	}
	if disPlan != nil && p.meetsOverall(disPlan) {
		disCost = min(disCost, disPlan.WorkerSeconds)
	}
	best, bestDis := aggPlan, false
	switch {
	case agg != nil && nAgg == 1 && !(disCost < 0.95*aggCost):
		rep.verdict = fmt.Sprintf("one engine is enough: a single engine meets the SLA for %.1f%% of requests (%.1f%% in the worst %v window; goal %.0f%%); "+
			"the router, more engines and disaggregation would add cost and moving parts for nothing", 100*agg.Attainment, 100*agg.Worst, p.window, 100*p.goal)
	case disCost < 0.95*aggCost:
		best, bestDis = disPlan, true
		what := "no aggregated pool within the bounds does"
		if !math.IsInf(aggCost, 1) {
			what = fmt.Sprintf("%.0f%% lower cost than the cheapest aggregated deployment that does (%.2f against %.2f worker-hours)", 100*(1-disCost/aggCost), disCost/3600, aggCost/3600)
		}
		rep.verdict = fmt.Sprintf("disaggregate: %d prefill and %d decode workers meet the SLA at peak (%.1f%% attainment), at %s", nP, nD, 100*dis.Attainment, what)
		if disPlan != nil && p.meetsOverall(disPlan) {
			rep.verdict += fmt.Sprintf("; with the planner, %.2f worker-hours (%.0f%% of the fixed pools') at %.1f%% attainment", disPlan.WorkerSeconds/3600, 100*disPlan.WorkerSeconds/dis.WorkerSeconds, 100*disPlan.Attainment)
		}
	case agg != nil:
		rep.verdict = fmt.Sprintf("several aggregated engines behind the router: %d meet the SLA at peak (%.1f%% attainment); KV-aware routing saves %.0f%% of mean TTFT against round robin at that size",
			nAgg, 100*agg.Attainment, math.Round(100*rep.kvSaves)+0) // +0: no "-0 %"
		if aggPlan != nil && p.meetsOverall(aggPlan) {
			rep.verdict += fmt.Sprintf("; with the planner, %.2f worker-hours (%.0f%% of the fixed pool's) at %.1f%% attainment", aggPlan.WorkerSeconds/3600, 100*aggPlan.WorkerSeconds/agg.WorkerSeconds, 100*aggPlan.Attainment)
		}
		if dis != nil {
			rep.verdict += fmt.Sprintf("; disaggregation (%dP + %dD) costs %.0f%% %s", nP, nD, 100*math.Abs(disCost/aggCost-1), map[bool]string{true: "more", false: "less, too little to pay for its moving parts"}[disCost >= aggCost])
		}
	default:
		rep.verdict = fmt.Sprintf("the SLA is not met within %d workers a pool: ", p.max)
		if aggPlan != nil {
			rep.verdict += fmt.Sprintf("the planner reaches %.1f%% aggregated", 100*aggPlan.Attainment)
		}
		if disPlan != nil {
			rep.verdict += fmt.Sprintf(", %.1f%% disaggregated", 100*disPlan.Attainment)
		}
		rep.verdict += " (prompts that alone take longer than the TTFT target cannot meet it at any size)"
		if best == nil {
			best, bestDis = disPlan, true
		}
	}
	if best == nil {
		best, bestDis = disPlan, true
	}
	rep.timeline = best
	// The start-up sweep, for the chosen deployment.
	name := "planner, aggregated"
	if bestDis {
		name = "planner, disaggregated"
	}
	rep.startups = append(rep.startups, best)
	var wg sync.WaitGroup
	outs := make([]*outcome, len(ups))
	errs := make([]error, len(ups))
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	for i, u := range ups[1:] {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			outs[i+1], errs[i+1] = p.withPlanner(fmt.Sprintf("%s, start-up %v", name, u), bestDis, u, nil)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	rep.startups = append(rep.startups, outs[1:]...)
	return rep, nil
}

func rename(o *outcome, name string) *outcome {
	c := *o
	c.Name = name
	return &c
}

// Write prints the report's tables and verdict.
func (r *Report) Write(w io.Writer) error {
	p := r.p
	var b strings.Builder
	n, dur := 0, time.Duration(0)
	if len(r.rows) > 0 {
		n, dur = len(r.rows[0].res.Bench.Requests), r.rows[0].res.Bench.Summary.Duration
	}
	fmt.Fprintf(&b, "Workload: %d requests over %v; SLA: TTFT ≤ %v and mean ITL ≤ %v for %.0f%% of requests\n\n",
		n, dur.Round(time.Second), p.targets.TTFT, p.targets.ITL, 100*p.goal)
	ref := r.fixedPeak()
	fmt.Fprintf(&b, "%-54s %-26s %12s %10s %7s %14s %14s %8s\n", "deployment", "workers", "worker-hours", "attainment", "worst", "TTFT p50/p95", "TPOT p50/p95", "vs peak")
	for _, o := range r.rows {
		b.WriteString(r.row(o, o.Name, ref))
	}
	if len(r.startups) > 0 {
		fmt.Fprintf(&b, "\nStart-up time of a new replica (%s):\n", r.startups[0].Name)
		for _, o := range r.startups {
			b.WriteString(r.row(o, fmt.Sprintf("  start-up %v", time.Duration(o.Startup*float64(time.Second))), ref))
		}
	}
	if t := r.timeline; t != nil && t.res != nil && t.res.Plan != nil {
		fmt.Fprintf(&b, "\nRecommended pool sizes over time (%s):\n", t.Name)
		b.WriteString(timelineTable(t.res.Plan, p.pcfg.Interval))
	}
	fmt.Fprintf(&b, "\nVerdict: %s\n", r.verdict)
	_, err := io.WriteString(w, b.String())
	return err
}

// fixedPeak is the cheapest fixed deployment that meets the SLA at peak: what the
// planner's worker-hours are compared with.
func (r *Report) fixedPeak() *outcome {
	var best *outcome
	for _, o := range r.rows {
		if o.peak && (best == nil || o.WorkerSeconds < best.WorkerSeconds) {
			best = o
		}
	}
	return best
}

func (r *Report) row(o *outcome, name string, ref *outcome) string {
	vs := ""
	if ref != nil && ref.WorkerSeconds > 0 {
		vs = fmt.Sprintf("%.0f%%", 100*o.WorkerSeconds/ref.WorkerSeconds)
	}
	mark := ""
	if o.Failed > 0 {
		mark = fmt.Sprintf(" (%d failed)", o.Failed)
	}
	return fmt.Sprintf("%-54s %-26s %12.2f %9.1f%% %6.1f%% %6.0f/%-7.0f %6.1f/%-7.1f %8s%s\n", name, o.Pools, o.WorkerSeconds/3600,
		100*o.Attainment, 100*o.Worst, o.TTFTp50, o.TTFTp95, o.TPOTp50, o.TPOTp95, vs, mark)
}

// timelineTable shows the pools once per adjustment interval, a line each time they
// change.
func timelineTable(pl *sim.PlanResult, interval time.Duration) string {
	var b strings.Builder
	disagg := pl.Config.Disaggregated
	if disagg {
		b.WriteString("       t   req/s obs → predicted   prefill  decode   (serving)\n")
	} else {
		b.WriteString("       t   req/s obs → predicted   workers   (serving)\n")
	}
	dec := 0
	last := ""
	for _, pt := range pl.Timeline {
		if pt.At%interval != 0 {
			continue
		}
		for dec < len(pl.Decisions) && pl.Decisions[dec].At <= pt.At {
			dec++
		}
		obs, pred := 0.0, 0.0
		for i := dec - 1; i >= 0; i-- {
			if pl.Decisions[i].Loop == "throughput" {
				obs, pred = pl.Decisions[i].Observed.Rate, pl.Decisions[i].Predicted.Rate
				break
			}
		}
		var line string
		if disagg {
			line = fmt.Sprintf("%7.2f → %-9.2f   %7d %7d   (%d+%d)", obs, pred, pt.Paid[planner.Prefill], pt.Paid[planner.Decode], pt.Ready[planner.Prefill], pt.Ready[planner.Decode])
		} else {
			line = fmt.Sprintf("%7.2f → %-9.2f   %7d   (%d)", obs, pred, pt.Paid[planner.Aggregated], pt.Ready[planner.Aggregated])
		}
		if line == last {
			continue
		}
		last = line
		fmt.Fprintf(&b, "%8s %s\n", pt.At.Round(time.Second), line)
	}
	return b.String()
}

// JSON is the report as a JSON value.
func (r *Report) JSON() map[string]any {
	m := map[string]any{"verdict": r.verdict, "goal": r.p.goal, "sla_ttft_ms": millis(r.p.targets.TTFT), "sla_itl_ms": millis(r.p.targets.ITL),
		"requests": len(r.p.reqs), "kv_routing_ttft_saving": r.kvSaves}
	m["runs"] = r.rows
	m["startups"] = r.startups
	if t := r.timeline; t != nil && t.res != nil && t.res.Plan != nil {
		var pts []map[string]any
		for _, pt := range t.res.Plan.Timeline {
			pts = append(pts, map[string]any{"t_s": pt.At.Seconds(), "paid": pt.Paid, "ready": pt.Ready, "target": pt.Target})
		}
		m["timeline"] = map[string]any{"run": t.Name, "points": pts}
		var decs []map[string]any
		for _, d := range t.res.Plan.Decisions {
			decs = append(decs, map[string]any{"t_s": d.At.Seconds(), "loop": d.Loop, "was": d.Was, "target": d.Target,
				"reason": slices.Clone(d.Reason[:]), "observed_rate": d.Observed.Rate, "predicted_rate": d.Predicted.Rate,
				"correction": d.Correction})
		}
		m["decisions"] = decs
	}
	return m
}

func millis(d time.Duration) float64 { return float64(d) / 1e6 }
