package sim

// The SLA planner in the loop. Every LoadInterval of virtual time the simulator gives the
// planner what the live router would (its counters of arrivals, first tokens and
// finished requests, the replicas asked for and those serving) and applies its decision:
// new workers are asked for and serve Config.Startup later (they are paid for from the
// moment they are asked for); the workers to remove are chosen by planner.Victims from
// the router's view (starting ones first, then the fewest in flight, the least load, the
// least wanted cache), are marked unhealthy at once (the router sends them nothing new,
// as a draining engine's report says), finish their requests, and leave.

import (
	"fmt"
	"time"

	"tandem/planner"
	"tandem/router"
	"tandem/sched"
)

// PlanResult is what the planner did in a simulation.
type PlanResult struct {
	Config    planner.Config
	Decisions []planner.Decision // every throughput loop run, and the load loop's that changed a target
	Loops     int                // loop runs
	Timeline  []PoolSizes        // the pools at every tick
	// MeanReplicas and PeakReplicas are the replicas paid for (starting, serving or
	// draining) per pool, time-averaged and at most.
	MeanReplicas [planner.NumPools]float64
	PeakReplicas [planner.NumPools]int
	Removed      int // workers removed, each after its last request ended
}

// PoolSizes are the pools at one moment: workers paid for, and of those serving.
type PoolSizes struct {
	At          time.Duration // from the first arrival
	Paid, Ready [planner.NumPools]int
	Starting    [planner.NumPools]int // of Paid, not serving yet (the others draining)
	Target      [planner.NumPools]int
	Decided     bool // a decision changed a target at this tick
}

func (p *PlanResult) finish(dur time.Duration) {
	if len(p.Timeline) == 0 || dur <= 0 {
		return
	}
	var sum [planner.NumPools]float64
	for i, pt := range p.Timeline {
		next := dur
		if i+1 < len(p.Timeline) {
			next = p.Timeline[i+1].At
		}
		for k := range sum {
			sum[k] += float64(pt.Paid[k]) * max(0, next-pt.At).Seconds()
			p.PeakReplicas[k] = max(p.PeakReplicas[k], pt.Paid[k])
		}
	}
	for k := range sum {
		p.MeanReplicas[k] = sum[k] / dur.Seconds()
	}
}

// addWorker adds a worker of role; serving at once (the first ones), or after the
// start-up time.
func (s *sim) addWorker(role string, now bool) (*worker, error) {
	cfg := s.cfg
	w := &worker{id: len(s.workers), role: role, pool: s.newPool(), born: s.now}
	w.events, _ = w.pool.Subscribe(1 << 16)
	var err error
	sc := sched.Config{MaxBatchTokens: cfg.TokenBudget, MaxSeqs: cfg.MaxSeqs, Salt: s.salt}
	if cfg.ITLTarget > 0 || cfg.ITLDecodes > 0 {
		sc.ITLTarget, sc.ITLDecodes, sc.Cost = cfg.ITLTarget, cfg.ITLDecodes, cfg.Timing
	}
	if w.sched, err = sched.New[*sreq](sc, w.pool); err != nil {
		return nil, err
	}
	s.workers = append(s.workers, w)
	if now || cfg.Startup == 0 {
		return w, s.ready(w)
	}
	s.push(event{t: s.now + cfg.Startup, kind: evReady, w: w.id})
	return w, nil
}

// ready registers a started worker with the router.
func (s *sim) ready(w *worker) error {
	if w.state != starting {
		return nil // removed while starting
	}
	card := s.card
	card.Role = w.role
	if err := s.state.AddWorker(router.WorkerID(w.id), card); err != nil {
		return err
	}
	w.state = ready
	return nil
}

// retire removes w: at once if it has not started, else after its requests end.
func (s *sim) retire(w *worker) {
	switch w.state {
	case starting:
		w.state, w.goneAt = gone, s.now
		s.plan.Removed++
	case ready:
		w.state = draining
		s.state.SetHealthy(router.WorkerID(w.id), false)
		s.drained(w)
	}
}

// drained lets a draining worker go once nothing is left on it.
func (s *sim) drained(w *worker) {
	if w.state != draining || w.stepping || w.imports > 0 || len(w.sched.Waiting()) > 0 || len(w.sched.Running()) > 0 {
		return
	}
	s.drain(w)
	w.state, w.goneAt = gone, s.now
	s.state.RemoveWorker(router.WorkerID(w.id))
	s.plan.Removed++
}

// waitForWorkers says whether a request that found no healthy worker should wait: the
// planner may have some starting.
func (s *sim) waitForWorkers() bool {
	for _, w := range s.workers {
		if w.state == starting || w.state == ready {
			return true
		}
	}
	return false
}

// A sizer decides the pools' sizes at each tick: a planner.Planner, or a script.
type sizer interface {
	Step(planner.State) (planner.Decision, bool)
}

// script sizes the pools by Config.Scripted, at least one worker each.
type script struct {
	sizes func(time.Duration) [planner.NumPools]int
	pools []planner.Pool
}

func (sc script) Step(st planner.State) (planner.Decision, bool) {
	d := planner.Decision{At: st.Now, Loop: "script", Was: st.Replicas, Target: sc.sizes(st.Now)}
	for _, pool := range sc.pools {
		d.Target[pool] = max(d.Target[pool], 1)
	}
	return d, true
}

func (s *sim) startPlanner() error {
	if s.cfg.Scripted != nil {
		s.sizer, s.sizeTick = script{sizes: s.cfg.Scripted, pools: planner.Pools(s.cfg.disaggregated())}, scriptTick
		s.plan = &PlanResult{Config: planner.Config{Disaggregated: s.cfg.disaggregated()}}
		s.push(event{t: s.t0, kind: evPlan})
		return nil
	}
	pc := *s.cfg.Planner
	if pc.Perf == nil {
		pc.Perf = s.cfg.Timing
	}
	if pc.Capacity == (planner.Capacity{}) {
		pc.Capacity = planner.Capacity{KVTokens: s.cfg.KVBlocks * s.cfg.BlockSize, TokenBudget: s.cfg.TokenBudget, MaxSeqs: s.cfg.MaxSeqs}
	}
	pc.Disaggregated = s.cfg.disaggregated()
	if pc.Disaggregated {
		pc.MinRemoteTokens = s.cfg.Disagg.MinRemoteTokens
	}
	if pc.Startup == 0 {
		pc.Startup = s.cfg.Startup
	}
	pc.PrefillRouting = pc.PrefillRouting || s.cfg.Router.WeighsPrefill()
	pl, err := planner.New(pc)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	s.sizer, s.sizeTick = pl, pl.Config().LoadInterval
	s.plan = &PlanResult{Config: pl.Config()}
	s.push(event{t: s.t0, kind: evPlan})
	return nil
}

// scriptTick is how often a scripted deployment (Config.Scripted) is brought to its sizes.
const scriptTick = 5 * time.Second

// planTick runs the planner's loops that are due, or reads the script, and applies the
// decision.
func (s *sim) planTick() {
	if s.left > 0 {
		s.push(event{t: s.now + s.sizeTick, kind: evPlan})
	}
	st := planner.State{Now: s.now - s.t0, Counters: &s.counters, Startup: s.cfg.Startup}
	for _, w := range s.workers {
		switch w.state {
		case starting:
			st.Replicas[poolOf(w.role)]++
		case ready:
			st.Replicas[poolOf(w.role)]++
			st.Ready[poolOf(w.role)]++
		}
	}
	d, ran := s.sizer.Step(st)
	if ran {
		s.plan.Loops++
	}
	changed := ran && d.Changed()
	if changed || ran && d.Loop == "throughput" {
		s.plan.Decisions = append(s.plan.Decisions, d)
	}
	if changed {
		for _, pool := range planner.Pools(s.cfg.disaggregated()) {
			s.resize(pool, st.Replicas[pool], d.Target[pool])
		}
	}
	pt := PoolSizes{At: s.now - s.t0, Decided: changed, Target: d.Target}
	for _, w := range s.workers {
		if w.state != gone {
			pt.Paid[poolOf(w.role)]++
		}
		switch w.state {
		case ready:
			pt.Ready[poolOf(w.role)]++
		case starting:
			pt.Starting[poolOf(w.role)]++
		}
	}
	if !ran && len(s.plan.Timeline) > 0 {
		pt.Target = s.plan.Timeline[len(s.plan.Timeline)-1].Target
	}
	s.plan.Timeline = append(s.plan.Timeline, pt)
	for _, w := range s.workers {
		w.hitsAt = w.stats.CachedTokens
	}
}

// resize brings pool from have workers (starting or serving) to want.
func (s *sim) resize(pool planner.Pool, have, want int) {
	role := pool.String()
	for ; have < want; have++ {
		if _, err := s.addWorker(role, false); err != nil {
			panic(err) // the card is the one every worker has
		}
	}
	if have <= want {
		return
	}
	var cands []planner.Candidate
	byName := map[string]*worker{}
	for _, w := range s.workers {
		if w.role != role || (w.state != starting && w.state != ready) {
			continue
		}
		name := fmt.Sprint(w.id)
		byName[name] = w
		c := planner.Candidate{Name: name, Starting: w.state == starting, Hits: float64(w.stats.CachedTokens - w.hitsAt)}
		if ws, ok := s.state.Worker(router.WorkerID(w.id)); ok {
			c.Inflight, c.Load = ws.Inflight, ws.Load()
		}
		cands = append(cands, c)
	}
	for _, name := range planner.Victims(cands, have-want) {
		s.retire(byName[name])
	}
}
