package planner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"tandem/sla"
)

// Bounds limit a pool's size.
type Bounds struct{ Min, Max int }

// Config configures a Planner. Zero values take the defaults noted; docs/planner.md
// explains them.
type Config struct {
	SLA  sla.Targets // TTFT and ITL (per request: its mean inter-token latency) targets
	Goal float64     // the fraction of requests that should meet both (0: 0.95)
	// Disaggregated sizes a prefill and a decode pool; otherwise one aggregated pool.
	Disaggregated bool
	Perf          Perf     // one worker's speed (required)
	Capacity      Capacity // one worker's KV, token budget and sequence cap
	// MinRemoteTokens: in a disaggregated deployment prompts with fewer uncached tokens are
	// prefilled by their decode worker (the router's --disagg-min-tokens; 0: 256).
	MinRemoteTokens int

	Interval     time.Duration // throughput loop: predict and size every Interval (0: 60 s)
	LoadInterval time.Duration // load loop: correct from measured latency this often (0: 5 s)
	LoadWindow   time.Duration // the latency the load loop reads: the last LoadWindow (0: 3 load intervals)
	Predictor    string        // constant, holt or kalman ("": kalman)

	Bounds   [NumPools]Bounds // per pool (Max 0: 64; Min 0: 1)
	MaxTotal int              // most workers over all pools (0: no limit)
	// Startup is how long a new replica takes to serve, until State.Startup says what was
	// measured: the throughput loop sizes for the load expected when replicas asked for
	// now are up, and until the next ones could be.
	Startup time.Duration
	// DownCooldown: a pool that grew does not shrink for this long after its new
	// replicas serve, the start-up time after they were asked for (0: one Interval).
	DownCooldown time.Duration
	// DownMargin: the throughput loop shrinks a pool only to the size that would still
	// meet the targets at this much more load (0: 0.1), so that a load near a size's edge
	// does not flap; a step removes at most a quarter of the pool (at least one).
	DownMargin float64
	// DownFraction: the load loop removes a replica (down to the throughput loop's size)
	// when the goal's quantile of measured TTFT and ITL is under this fraction of their
	// targets (0: 0.5).
	DownFraction float64
	// MinSamples is the fewest requests a window needs before the load loop or a
	// correction reads its latency (0: 10).
	MinSamples int
	// PrefillRouting says that the router weighs the prefill work queued on each worker
	// when it places a prompt (kv routing with an overlap weight, least-loaded): the
	// pool's prompts then wait far less than behind a heavy-tailed prompt on a worker
	// chosen without regard to it (round robin, random), which is what the model takes
	// otherwise.
	PrefillRouting bool
	// Fixed pools keep the size they have: to compare a planner that scales one pool.
	Fixed [NumPools]bool
	// NoLoadLoop and NoThroughputLoop turn a loop off (for comparisons).
	NoLoadLoop, NoThroughputLoop bool
}

func (c *Config) defaults() {
	if c.Goal == 0 {
		c.Goal = 0.95
	}
	if c.SLA == (sla.Targets{}) {
		c.SLA = sla.Default
	}
	c.MinRemoteTokens = cmpOr(c.MinRemoteTokens, 256)
	c.Interval = cmpOrDur(c.Interval, time.Minute)
	c.LoadInterval = cmpOrDur(c.LoadInterval, 5*time.Second)
	c.LoadWindow = cmpOrDur(c.LoadWindow, 3*c.LoadInterval)
	c.DownCooldown = cmpOrDur(c.DownCooldown, c.Interval)
	if c.DownMargin == 0 {
		c.DownMargin = 0.1
	}
	if c.DownFraction == 0 {
		c.DownFraction = 0.5
	}
	c.MinSamples = cmpOr(c.MinSamples, 10)
	for i := range c.Bounds {
		c.Bounds[i].Min = cmpOr(c.Bounds[i].Min, 1)
		c.Bounds[i].Max = cmpOr(c.Bounds[i].Max, 64)
	}
}

func cmpOrDur(v, d time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return d
}

// Validate reports a configuration the planner cannot run with.
func (c Config) Validate() error {
	c.defaults()
	var bad []string
	if c.Perf == nil {
		bad = append(bad, "a performance model is needed (a tandem profile)")
	}
	if err := c.SLA.Check(); err != nil {
		bad = append(bad, err.Error())
	}
	if !(c.Goal > 0 && c.Goal < 1) {
		bad = append(bad, fmt.Sprintf("goal %v must be between 0 and 1", c.Goal))
	}
	if _, err := NewPredictor(c.Predictor); err != nil {
		bad = append(bad, err.Error())
	}
	for _, p := range Pools(c.Disaggregated) {
		if b := c.Bounds[p]; b.Min < 1 || b.Max < b.Min {
			bad = append(bad, fmt.Sprintf("%s pool bounds [%d, %d]: want 1 ≤ min ≤ max", p, b.Min, b.Max))
		}
	}
	if c.MaxTotal < 0 || c.Startup < 0 || c.DownMargin < 0 || c.DownFraction < 0 || c.DownFraction >= 1 {
		bad = append(bad, "the total bound, start-up time and down margin must be ≥ 0 and the down fraction in [0, 1)")
	}
	if c.LoadInterval > c.Interval {
		bad = append(bad, fmt.Sprintf("the load interval %v is longer than the adjustment interval %v", c.LoadInterval, c.Interval))
	}
	if len(bad) > 0 {
		return errors.New("planner: " + strings.Join(bad, "; "))
	}
	return nil
}

// State is what the caller knows when it calls Step.
type State struct {
	Now      time.Duration // time since any fixed origin, never going back
	Counters *Counters     // cumulative since the start (the same value, kept updated)
	Replicas [NumPools]int // replicas asked for and not draining: starting and serving
	Ready    [NumPools]int // of those, serving
	// Startup is the start-up time measured of recent replicas (0: unknown; Config.Startup).
	Startup time.Duration
}

// Measured is a pool's latency over the load loop's window: the fractions of first
// tokens and of requests' inter-token latencies within target, the goal's quantiles, and
// how many of each there were.
type Measured struct {
	TTFT, TPOT   float64
	TTFTq, TPOTq time.Duration
	NTTFT, NTPOT int64
}

// A Decision is one run of a loop: the size each pool should have, and why.
type Decision struct {
	At     time.Duration
	Loop   string        // "throughput" or "load"
	Was    [NumPools]int // State.Replicas
	Target [NumPools]int // what each pool should have
	Reason [NumPools]string
	// Held says why a pool's target is less than the pool needs ("": it is not): "max",
	// its upper bound (the targets are not met within it), or "budget", the total bound
	// over all pools. A held pool misses its targets: the caller counts and reports it.
	Held [NumPools]string
	// Observed is the last adjustment interval's load and Predicted the load sized for:
	// the largest forecast over Horizon intervals (the start-up time and one interval).
	Observed, Predicted Workload
	Horizon             int
	// Pred is the model's verdict on each pool at its target under the predicted load.
	Pred     [NumPools]Prediction
	Measured [NumPools]Measured
	// Correction multiplies the model's prefill work and decode step, learned from
	// measured latency against the model's.
	Correction [2]float64
	Startup    time.Duration
}

// Changed reports whether some pool's target differs from what it has.
func (d *Decision) Changed() bool { return d.Target != d.Was }

// Planner sizes pools with two loops, as Dynamo's planner does: every Interval the
// throughput loop predicts the next intervals' load and sizes each pool with the
// performance model (so prefill meets the TTFT target and decode the ITL target); every
// LoadInterval the load loop reads measured latency and adds a replica to a pool that
// misses its target, or removes one the throughput loop did not ask for from a pool well
// under it. It is not safe for concurrent use.
type Planner struct {
	cfg   Config
	m     *model
	pools []Pool
	pred  [4]Predictor // rate, mean input, mean output, mean uncached tokens

	started          bool
	lastTP, lastLoad time.Duration
	tpPrev           Counters
	ring             []snap
	target, need     [NumPools]int
	ready            [NumPools]int
	lastUp, changed  [NumPools]time.Duration
	overSince        [NumPools]time.Duration // when the load loop found the pool over target, -1: it is not
	missed           [NumPools]miss
	longUncached     decayed // the uncached tokens' distribution over the last intervals
	longOutputs      decayed // the output lengths'
	shape, outShape  []Weighted
	rateErr          float64 // by how much the rate's forecasts fell short lately, smoothed
	rateVar          float64 // their squares, smoothed
	tpRuns           int     // throughput loop runs
	predicted        Workload
	observed         Workload
	horizon          int
}

type snap struct {
	at time.Duration
	c  Counters
}

// miss is the load loop's evidence that a pool of size workers missed its goal, at a
// predicted rate: the throughput loop does not shrink it back to that size while the
// load is no lower, for missMemory intervals, so that a model that is a little
// optimistic does not have the two loops take turns.
type miss struct {
	size int
	rate float64
	at   time.Duration
}

// missMemory is how many adjustment intervals a measured miss holds a pool's size.
const missMemory = 10

// shapeKeep is the weight an interval's distributions of uncached and output tokens
// keep per interval after it: their shape is estimated over the last few intervals
// (about 1/(1 − shapeKeep)), their means by the predictors.
const shapeKeep = 0.8

// errKeep is the weight of the latest interval's forecast error (measured less
// forecast) in the smoothed one the throughput loop adds when it is positive.
const errKeep = 0.3

// loadZ is how many standard deviations (binomial, at the goal's rate) the misses of a
// load window must exceed what the goal allows by before the load loop adds a replica:
// a window of a few dozen requests misses more than its share by chance alone often.
const loadZ = 2

// New returns a Planner; it validates cfg.
func New(cfg Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	p := &Planner{cfg: cfg, pools: Pools(cfg.Disaggregated),
		m: modelOf(&cfg)}
	for i := range p.pred {
		p.pred[i], _ = NewPredictor(cfg.Predictor)
	}
	return p, nil
}

// Config returns the configuration, defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// Step runs the loops due at s.Now and returns the decision of the one that ran (the
// throughput loop when both are due), false when neither was. The first call only starts
// the clocks: the pools' targets start at their replicas, within bounds.
func (p *Planner) Step(s State) (Decision, bool) {
	if !p.started {
		p.started = true
		p.lastTP, p.lastLoad = s.Now, s.Now
		p.tpPrev = *s.Counters
		for _, pool := range p.pools {
			p.target[pool] = p.clamp(pool, s.Replicas[pool])
			p.need[pool] = p.target[pool]
			p.ready[pool] = s.Ready[pool]
			p.changed[pool] = s.Now
			p.overSince[pool] = -1
		}
		p.push(s)
		return Decision{}, false
	}
	for _, pool := range p.pools {
		if s.Ready[pool] != p.ready[pool] {
			p.ready[pool] = s.Ready[pool]
			p.changed[pool] = s.Now // the window before holds latency of another size
		}
	}
	before := p.target
	d := Decision{At: s.Now, Was: s.Replicas, Startup: p.startup(s)}
	switch {
	case !p.cfg.NoThroughputLoop && s.Now-p.lastTP >= p.cfg.Interval:
		d.Loop = "throughput"
		p.throughput(s, &d)
		p.lastLoad = s.Now
	case !p.cfg.NoLoadLoop && s.Now-p.lastLoad >= p.cfg.LoadInterval:
		d.Loop = "load"
		p.load(s, &d)
		p.lastLoad = s.Now
	default:
		return Decision{}, false
	}
	p.push(s)
	p.budget(&d)
	for _, pool := range p.pools {
		if p.target[pool] != before[pool] {
			p.changed[pool] = s.Now
		}
	}
	d.Target = p.target
	d.Observed, d.Predicted, d.Horizon = p.observed, p.predicted, p.horizon
	d.Observed.Uncached, d.Predicted.Uncached = nil, nil
	d.Observed.Outputs, d.Predicted.Outputs = nil, nil
	d.Correction = [2]float64{p.m.corrPrefill, p.m.corrDC}
	for _, pool := range p.pools {
		d.Pred[pool] = p.m.evalTail(pool, p.target[pool], p.predicted)
		if d.Reason[pool] == "" {
			d.Reason[pool] = "hold"
		}
	}
	return d, true
}

func (p *Planner) startup(s State) time.Duration {
	if s.Startup > 0 {
		return s.Startup
	}
	return p.cfg.Startup
}

func (p *Planner) clamp(pool Pool, n int) int {
	b := p.cfg.Bounds[pool]
	return min(max(n, b.Min), b.Max)
}

// push keeps the load loop's snapshots: enough to reach LoadWindow back.
func (p *Planner) push(s State) {
	p.ring = append(p.ring, snap{at: s.Now, c: *s.Counters})
	for len(p.ring) > 2 && s.Now-p.ring[1].at >= p.cfg.LoadWindow {
		p.ring = p.ring[1:]
	}
}

// throughput is the throughput loop: observe the interval, predict, size.
func (p *Planner) throughput(s State, d *Decision) {
	w := s.Counters.sub(&p.tpPrev)
	dt := (s.Now - p.lastTP).Seconds()
	p.tpPrev, p.lastTP = *s.Counters, s.Now
	obs := Workload{Rate: float64(w.Arrived) / dt, Input: p.observed.Input, Output: p.observed.Output, Uncached: p.shape, Outputs: p.outShape}
	if p.tpRuns > 0 {
		e := obs.Rate - p.pred[0].Forecast(1)
		p.rateErr += errKeep * (e - p.rateErr)
		p.rateVar += errKeep * (e*e - p.rateVar)
	}
	p.tpRuns++
	p.pred[0].Observe(obs.Rate)
	if w.Finished > 0 {
		f := float64(w.Finished)
		obs.Input, obs.Output = w.Input/f, w.Output/f
		// The interval's own distributions, for the corrections; the sizing reads their
		// shapes over the last intervals.
		obs.Uncached, obs.Outputs = w.Uncached.Dist(), coarsen(w.Outputs.Dist())
		p.longUncached.add(&w.Uncached, shapeKeep)
		p.longOutputs.add(&w.Outputs, shapeKeep)
		p.shape, p.outShape = p.longUncached.dist(), coarsen(p.longOutputs.dist())
		p.pred[1].Observe(obs.Input)
		p.pred[2].Observe(obs.Output)
		p.pred[3].Observe(w.Uncached.Mean())
	}
	prevRate := p.observed.Rate
	p.observed = obs
	p.correct(&w, obs, s.Ready, prevRate)

	// Size for the most the next intervals may bring, by the predictor, plus what its
	// forecasts fell short by lately (a rise that its trend is still catching up with),
	// and never less than the interval just measured; shrink only to what would hold
	// that, too (with the down margin): a falling trend's forecast undershoots, and
	// replicas removed on it would be asked for again. The lengths are the predictors':
	// an interval's mean of heavy-tailed prompts is noise that would swing the sizes.
	h := max(1, int(math.Ceil(float64(p.startup(s)+p.cfg.Interval)/float64(p.cfg.Interval))))
	var f [4]float64
	for k := 1; k <= h; k++ {
		for i := range f {
			f[i] = max(f[i], p.pred[i].Forecast(k))
		}
	}
	// A forecast is an interval's mean; a rising load is highest at the interval's end,
	// half an interval's trend further.
	f[0] = max(f[0], (p.pred[0].Forecast(h)+p.pred[0].Forecast(h+1))/2)
	// Replicas asked for now serve only after the start-up time: the pool must carry
	// what the load may rise by meanwhile, by the forecasts' errors lately.
	up := p.startup(s).Seconds() / p.cfg.Interval.Seconds()
	f[0] = max(obs.Rate, f[0]+max(0, p.rateErr)+math.Sqrt(p.rateVar*up))
	if f[1] == 0 {
		f[1], f[2], f[3] = obs.Input, obs.Output, obs.Input
	}
	pred := Workload{Rate: f[0], Input: f[1], Output: f[2], Uncached: scaled(p.shape, f[3]), Outputs: scaled(p.outShape, f[2])}
	p.predicted, p.horizon = pred, h

	for _, pool := range p.pools {
		if p.cfg.Fixed[pool] {
			p.target[pool], p.need[pool] = s.Replicas[pool], s.Replicas[pool]
			d.Reason[pool] = "hold: fixed"
			continue
		}
		b := p.cfg.Bounds[pool]
		need, ok := p.m.size(pool, pred, b.Min, b.Max)
		p.need[pool] = need
		cur := p.target[pool]
		more := pred
		more.Rate = max(pred.Rate, obs.Rate) * (1 + p.cfg.DownMargin)
		down, _ := p.m.size(pool, more, b.Min, b.Max)
		floor := p.floor(pool, pred.Rate, s.Now)
		down = max(down, min(floor, cur))
		switch {
		case need > cur:
			p.target[pool] = need
			p.lastUp[pool] = s.Now
			d.Reason[pool] = fmt.Sprintf("up: %.3g req/s predicted needs %d", pred.Rate, need)
			if !ok {
				d.Reason[pool] += " (at most: the targets are not met within bounds)"
				d.Held[pool] = "max"
			}
		case down < cur && p.cooled(pool, s):
			step := max(1, cur/4)
			p.target[pool] = max(down, cur-step)
			d.Reason[pool] = fmt.Sprintf("down: %.3g req/s predicted needs %d (%d at +%.0f%%)", pred.Rate, need, down, 100*p.cfg.DownMargin)
		case down < cur:
			d.Reason[pool] = "hold: in the cooldown after growing"
		case floor > need && floor >= cur:
			d.Reason[pool] = fmt.Sprintf("hold: %.3g req/s predicted needs %d, but %d missed the goal at %v", pred.Rate, need, floor-1, p.missed[pool].at.Round(time.Second))
		default:
			d.Reason[pool] = fmt.Sprintf("hold: %.3g req/s predicted needs %d", pred.Rate, need)
		}
		if !ok && p.target[pool] >= b.Max {
			d.Held[pool] = "max"
		}
	}
}

// scaled returns shape with its mean moved to mean.
func scaled(shape []Weighted, mean float64) []Weighted {
	m := 0.0
	for _, x := range shape {
		m += x.Value * x.Weight
	}
	if m <= 0 || mean <= 0 {
		return shape
	}
	out := slices.Clone(shape)
	for i := range out {
		out[i].Value *= mean / m
	}
	return out
}

// correct learns the factors by which the model's prefill work and decode steps differ
// from what the interval measured: the factor that makes the model's mean TTFT (and ITL)
// at the pools' ready sizes under the observed load equal the measured mean. A pool the
// model takes for saturated, or too few samples, teach nothing.
func (p *Planner) correct(w *Counters, obs Workload, ready [NumPools]int, prevRate float64) {
	if obs.Rate <= 0 || w.Finished < int64(p.cfg.MinSamples) {
		return
	}
	// While the load moves, latency is a transient's (a queue building up behind a rise),
	// which the model's steady state does not describe: learn only from steady intervals.
	if prevRate <= 0 || math.Abs(obs.Rate-prevRate) > 0.2*prevRate {
		return
	}
	// Nor while a backlog builds up or drains (a pool that was short, or replicas that
	// were starting): fewer or more requests finish than arrive, and their latency is the
	// backlog's, not the pool's.
	if f, a := float64(w.Finished), float64(w.Arrived); f < 0.8*a || f > 1.25*a {
		return
	}
	ttftPool, tpotPool := Aggregated, Aggregated
	if p.cfg.Disaggregated {
		ttftPool, tpotPool = Prefill, Decode
	}
	// The decode factor from the mean gap by token, which the model's mean ITL is: the
	// mean of requests' TPOT is swayed by a few short answers that shared a step with a
	// prompt's chunk (which the model's attainment counts, not its mean).
	if pc := &w.Pools[tpotPool]; pc.TPOT.Count >= int64(p.cfg.MinSamples) && pc.Gaps > 0 && ready[tpotPool] > 0 {
		p.m.corrDC = p.fit(&p.m.corrDC, pc.GapTime/pc.Gaps, func() float64 { return p.m.eval(tpotPool, ready[tpotPool], obs).ITL.Seconds() })
	}
	if h := &w.Pools[ttftPool].TTFT; h.Count >= int64(p.cfg.MinSamples) && ready[ttftPool] > 0 {
		p.m.corrPrefill = p.fit(&p.m.corrPrefill, h.Mean(), func() float64 { return p.m.eval(ttftPool, ready[ttftPool], obs).TTFT.Seconds() })
	}
}

// fit finds the value of *factor (in [1/2, 2]) at which modelled equals measured, by
// bisection (the model's latency grows with the factor), and returns the geometric mean
// of it and the old value; the old value when the model is saturated at 1.
func (p *Planner) fit(factor *float64, measured float64, modelled func() float64) float64 {
	old := *factor
	defer func() { *factor = old }()
	*factor = 1
	if v := modelled(); math.IsInf(v, 0) || v > 1e6 || measured <= 0 {
		return old
	}
	lo, hi := 0.5, 2.0
	for range 40 {
		*factor = math.Sqrt(lo * hi)
		if modelled() < measured {
			lo = *factor
		} else {
			hi = *factor
		}
	}
	return math.Sqrt(old * math.Sqrt(lo*hi))
}

// load is the load loop: measured latency over the last LoadWindow.
func (p *Planner) load(s State, d *Decision) {
	w := s.Counters.sub(&p.ring[0].c)
	t := p.cfg.SLA
	wl := p.windowLoad(&w, s.Now)
	allowed := p.allowed(wl)
	for _, pool := range p.pools {
		var ttft, tpot *Hist
		switch pool {
		case Aggregated:
			ttft, tpot = &w.Pools[Aggregated].TTFT, &w.Pools[Aggregated].TPOT
		case Prefill:
			ttft = &w.Pools[Prefill].TTFT
		case Decode:
			ttft, tpot = &w.Pools[Decode].TTFT, &w.Pools[Decode].TPOT
		}
		m := &d.Measured[pool]
		missed, n := 0.0, int64(0) // the fraction of requests over a target, of n
		well, any := true, false
		if ttft != nil && ttft.Count >= int64(p.cfg.MinSamples) {
			any = true
			m.NTTFT, m.TTFT, m.TTFTq = ttft.Count, ttft.Below(t.TTFT.Seconds()), seconds(ttft.Quantile(p.m.goal))
			if pool != Decode { // a decode pool's own prefills are short
				missed, n = missed+1-m.TTFT, ttft.Count
			}
			well = well && m.TTFTq.Seconds() < p.cfg.DownFraction*t.TTFT.Seconds()
		}
		if tpot != nil && tpot.Count >= int64(p.cfg.MinSamples) {
			any = true
			m.NTPOT, m.TPOT, m.TPOTq = tpot.Count, tpot.Below(t.ITL.Seconds()), seconds(tpot.Quantile(p.m.goal))
			missed += 1 - m.TPOT
			if n == 0 || tpot.Count < n {
				n = tpot.Count
			}
			well = well && m.TPOTq.Seconds() < p.cfg.DownFraction*t.ITL.Seconds()
		}
		allow := allowed[pool]
		// Over target: more misses than the goal allows, by more than chance would give a
		// window of n requests.
		over := n > 0 && missed > allow+loadZ*math.Sqrt(allow*(1-allow)/float64(n))
		// Misses come in bursts: one long prompt's chunks stall every request decoding on
		// its worker, and a window can hold little else. Unless the window's load explains
		// them, only a pool over target for a whole window more (every check of it) is
		// short of replicas.
		switch {
		case !over || !any || s.Now-p.changed[pool] < p.cfg.LoadWindow:
			p.overSince[pool] = -1
		case p.overSince[pool] < 0:
			p.overSince[pool] = s.Now
		}
		sustained := over && p.overSince[pool] >= 0 && s.Now-p.overSince[pool] >= p.cfg.LoadWindow
		short := 0
		if over {
			short, _ = p.m.size(pool, wl, p.cfg.Bounds[pool].Min, p.cfg.Bounds[pool].Max)
		}
		// A miss the window's load explains (the model sizes it above the target) is a
		// rise, met at once.
		risen := short > p.target[pool]
		floor := p.floor(pool, max(wl.Rate, p.predicted.Rate), s.Now)
		switch {
		case p.cfg.Fixed[pool]:
			d.Reason[pool] = "hold: fixed"
		case !any || s.Now-p.changed[pool] < p.cfg.LoadWindow:
			// Nothing measured, or the window predates the pool's last change.
		case over && !sustained && !risen:
			d.Reason[pool] = fmt.Sprintf("hold: over target since %v (%.1f%% missed of %d requests, the goal allows %.1f%%)", p.overSince[pool].Round(time.Second), 100*missed, n, 100*allow)
		case over && s.Replicas[pool] > s.Ready[pool]:
			d.Reason[pool] = "hold: over target, replicas are starting"
		case over && p.target[pool] < p.cfg.Bounds[pool].Max:
			// One more, or what the model sizes for the load of the window if that is more:
			// a sudden rise is met within a window, not an interval.
			up := max(p.target[pool]+1, short)
			p.missed[pool] = miss{size: s.Ready[pool], rate: wl.Rate, at: s.Now}
			p.overSince[pool] = -1
			p.target[pool] = up
			p.lastUp[pool] = s.Now
			var parts []string
			if m.NTTFT > 0 {
				parts = append(parts, fmt.Sprintf("TTFT %.1f%%", 100*m.TTFT))
			}
			if m.NTPOT > 0 {
				parts = append(parts, fmt.Sprintf("ITL %.1f%%", 100*m.TPOT))
			}
			d.Reason[pool] = fmt.Sprintf("up: measured %s within target of %d requests: %.1f%% missed, the goal allows %.1f%%", strings.Join(parts, ", "), n, 100*missed, 100*allow)
		case over:
			// Over target and the pool at its bound.
			d.Reason[pool] = fmt.Sprintf("hold: over target at the pool's maximum of %d", p.cfg.Bounds[pool].Max)
			d.Held[pool] = "max"
		case well && p.target[pool] > max(p.need[pool], p.cfg.Bounds[pool].Min, floor) && p.cooled(pool, s):
			p.target[pool]--
			d.Reason[pool] = fmt.Sprintf("down: measured TTFT p%.1f %v, ITL %v: well under target", 100*p.m.goal, m.TTFTq.Round(time.Millisecond), m.TPOTq.Round(time.Millisecond))
		}
	}
}

// cooled says whether pool may shrink: the cooldown after it last grew has passed since
// the replicas it asked for then serve (a replica cancelled while it starts was asked for
// in vain, and the miss that asked for it is not yet answered).
func (p *Planner) cooled(pool Pool, s State) bool {
	return s.Now-p.lastUp[pool] >= p.startup(s)+p.cfg.DownCooldown
}

// floor is the fewest workers the loops may shrink pool to under a load of rate: one
// more than the size the load loop last measured a miss at, for missMemory intervals
// while the load is no lower (less the down margin) than it was then; 0 otherwise. It
// corrects a model a little optimistic, by a worker over what the model needs: a miss
// far above that (a backlog from a pool that was far too small) says nothing of the
// size the load needs.
func (p *Planner) floor(pool Pool, rate float64, now time.Duration) int {
	ms := p.missed[pool]
	if ms.size > 0 && now-ms.at < missMemory*p.cfg.Interval && rate >= (1-p.cfg.DownMargin)*ms.rate {
		return min(ms.size, p.need[pool]) + 1
	}
	return 0
}

// allowed is the fraction of requests each pool may have miss a target under wl: all
// together in an aggregated pool, and the prefill and decode pools' shares in a
// disaggregated one. Prompts that alone take longer than the TTFT target miss it at any
// size: they are allowed for, and must not ask for replicas that cannot help.
func (p *Planner) allowed(wl Workload) (a [NumPools]float64) {
	ps := p.m.points(wl)
	if p.cfg.Disaggregated {
		ps, _, _ = p.m.split(ps)
	}
	u := 0.0
	if len(ps) > 0 && wl.Rate > 0 {
		u = 1 - p.m.attainable(ps)
	}
	a[Aggregated] = p.m.allowed(u)
	a[Prefill], a[Decode] = p.m.shares(u)
	return a
}

// windowLoad is the load the load loop's window saw: its arrival rate less its Poisson
// noise (a window of a few seconds is a small sample), with the lengths and shapes the
// throughput loop predicted (or the window's, before it has).
func (p *Planner) windowLoad(w *Counters, now time.Duration) Workload {
	wl := p.predicted
	if dt := (now - p.ring[0].at).Seconds(); dt > 0 {
		wl.Rate = max(0, float64(w.Arrived)-math.Sqrt(float64(w.Arrived))) / dt
	}
	if wl.Input == 0 && w.Finished > 0 {
		f := float64(w.Finished)
		wl.Input, wl.Output, wl.Uncached, wl.Outputs = w.Input/f, w.Output/f, w.Uncached.Dist(), coarsen(w.Outputs.Dist())
	}
	return wl
}

// budget holds the pools' total to MaxTotal, taking replicas first from the pools most
// above what the throughput loop sized, then from the largest.
func (p *Planner) budget(d *Decision) {
	if p.cfg.MaxTotal <= 0 {
		return
	}
	for {
		sum := 0
		for _, pool := range p.pools {
			sum += p.target[pool]
		}
		if sum <= p.cfg.MaxTotal {
			return
		}
		best, bestKey := Pool(-1), math.Inf(-1)
		for _, pool := range p.pools {
			if p.cfg.Fixed[pool] || p.target[pool] <= p.cfg.Bounds[pool].Min {
				continue
			}
			key := float64(p.target[pool]-p.need[pool])*1e6 + float64(p.target[pool])
			if key > bestKey {
				best, bestKey = pool, key
			}
		}
		if best < 0 {
			return
		}
		p.target[best]--
		if p.target[best] < p.need[best] || d.Loop == "load" {
			d.Held[best] = "budget"
		}
		if !strings.Contains(d.Reason[best], "held to the budget") {
			d.Reason[best] += fmt.Sprintf("; held to the budget of %d workers", p.cfg.MaxTotal)
		}
	}
}
