package live

// The SLA planner's loop in the live router (docs/planner.md). The router counts what the
// planner reads (arrivals; first tokens and finished requests with their latency, by the
// pool of the worker that produced them) as it serves; RunPlanner steps the pure planner
// on those counters and on the connector's replicas, and applies its decisions through
// the connector. A scale-down loses nothing: the planner picks the workers that go (those
// still starting, then the fewest requests in flight, the least load, the least wanted
// cache); the router marks them retiring at once (no new requests, whatever their load
// reports say); the connector stops each with the node's ordered drain (SIGTERM: running
// requests finish, the rest migrate when the drain runs out) and only then is it gone.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"tandem/planner"
)

// PlannerConfig configures the planner's loop.
type PlannerConfig struct {
	Planner   planner.Config
	Connector planner.Connector
	// Model is the model whose workers the connector runs ("": the router's only model).
	Model string
}

// livePlanner is the router's side of the planner: its counters and who is retiring.
type livePlanner struct {
	model string

	mu       sync.Mutex
	counters planner.Counters
	hits     map[string]float64 // prompt tokens each worker served from its cache, cumulative
	hitsAt   map[string]float64 // at the last step: the window's hits are the difference
	retiring map[string]planner.Pool
	joined   map[string]time.Time // when each replica (by name) first registered
	startup  time.Duration        // mean measured start-up time (0: none yet)
	measured int

	// Owned by the loop's goroutine: what was last logged, so that a state that lasts is
	// logged once when it begins and once when it ends, not every step.
	held    [planner.NumPools]string
	failing [planner.NumPools]bool
}

func (lp *livePlanner) observes(model string) bool { return lp.model == "" || lp.model == model }

// planArrive counts a request for model arriving.
func (l *Router) planArrive(model string) {
	if lp := l.lp.Load(); lp != nil && lp.observes(model) {
		lp.mu.Lock()
		lp.counters.Arrive()
		lp.mu.Unlock()
	}
}

// planFirst counts a first token of a request for model from a worker of role.
func (l *Router) planFirst(model, role string, ttft time.Duration) {
	if lp := l.lp.Load(); lp != nil && lp.observes(model) {
		pool, _ := planner.PoolOfRole(role)
		lp.mu.Lock()
		lp.counters.FirstToken(pool, ttft)
		lp.mu.Unlock()
	}
}

// planFinish counts a request for model decoded on worker (of role) that ended with
// tokens tokens.
func (l *Router) planFinish(model, role, worker string, prompt, cached, tokens int, tpot time.Duration) {
	if lp := l.lp.Load(); lp != nil && lp.observes(model) {
		pool, _ := planner.PoolOfRole(role)
		lp.mu.Lock()
		lp.counters.Finish(pool, prompt, cached, tokens, tpot)
		lp.hits[worker] += float64(cached)
		lp.mu.Unlock()
	}
}

// retiringPool says whether node is being retired by the planner (and from which pool).
func (l *Router) retiringPool(node string) (planner.Pool, bool) {
	lp := l.lp.Load()
	if lp == nil {
		return 0, false
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	p, ok := lp.retiring[node]
	return p, ok
}

// retire marks the workers named as leaving: they get no new requests from now on (also
// if they register only later). Called without l.mu.
func (l *Router) retire(lp *livePlanner, pool planner.Pool, names []string) {
	lp.mu.Lock()
	for _, n := range names {
		lp.retiring[n] = pool
	}
	lp.mu.Unlock()
	l.mu.Lock()
	for _, n := range names {
		if id, ok := l.byNode[n]; ok {
			if w := l.workers[id]; w != nil {
				w.retiring.Store(true)
				w.model.state.SetHealthy(w.id, false)
			}
		}
	}
	l.mu.Unlock()
}

// retiredLeft records that a retiring worker left the registry with inflight requests
// still on it (0: it drained). Called with l.mu held.
func (l *Router) retiredLeftLocked(w *liveWorker, inflight int) {
	lp := l.lp.Load()
	if lp == nil {
		return
	}
	lp.mu.Lock()
	pool, ok := lp.retiring[w.node]
	delete(lp.retiring, w.node)
	delete(lp.hits, w.node)
	delete(lp.hitsAt, w.node)
	lp.mu.Unlock()
	if !ok {
		return
	}
	result := "drained"
	if inflight > 0 {
		result = "migrated"
	}
	l.planMet.ScaleDowns.WithLabelValues(pool.String(), result).Inc()
	l.log.Info("planner: retired worker left", "worker", w.node, "pool", pool, "result", result, "in_flight", inflight)
}

// CountLocalEngine counts a degraded event of an engine this process supervises
// (tandem_router:local_engine_events_total{event}): local.Supervisor's Count.
func (l *Router) CountLocalEngine(event string) {
	l.met.LocalEngineEvents.WithLabelValues(event).Inc()
}

// CountConnectorReadError counts a connector's failed read of pool's replicas
// (tandem_router:planner_connector_read_errors_total): a connector whose Replicas cannot
// fail silently calls it.
func (l *Router) CountConnectorReadError(pool planner.Pool) {
	l.planMet.ConnectorReadErrors.WithLabelValues(pool.String()).Inc()
}

// RunPlanner runs the SLA planner until ctx is done: every load interval it steps the
// planner on the router's counters and the connector's replicas and applies the decision.
// It returns an error only for a configuration the planner refuses.
func (l *Router) RunPlanner(ctx context.Context, cfg PlannerConfig) error {
	if cfg.Connector == nil {
		return errors.New("router: the planner needs a connector")
	}
	pl, err := planner.New(cfg.Planner)
	if err != nil {
		return err
	}
	lp := &livePlanner{model: cfg.Model, hits: map[string]float64{}, hitsAt: map[string]float64{},
		retiring: map[string]planner.Pool{}, joined: map[string]time.Time{}}
	if !l.lp.CompareAndSwap(nil, lp) {
		return errors.New("router: a planner runs already")
	}
	defer l.lp.Store(nil)
	pc := pl.Config()
	l.log.Info("planner: running", "pools", fmt.Sprint(planner.Pools(pc.Disaggregated)), "sla_ttft", pc.SLA.TTFT, "sla_itl", pc.SLA.ITL,
		"goal", pc.Goal, "interval", pc.Interval, "load_interval", pc.LoadInterval, "predictor", pc.Predictor, "startup", pc.Startup)
	// The pools start at their minimums; from there the planner sizes them.
	for _, pool := range planner.Pools(pc.Disaggregated) {
		have := 0
		for _, r := range cfg.Connector.Replicas(pool) {
			if !r.Draining {
				have++
			}
		}
		if least := pc.Bounds[pool].Min; have < least {
			l.log.Info("planner: starting the pool at its minimum", "pool", pool, "from", have, "to", least)
			l.applyScale(ctx, lp, cfg.Connector, pool, least, nil)
		}
	}
	start := time.Now()
	t := time.NewTicker(pc.LoadInterval)
	defer t.Stop()
	for {
		l.planStep(ctx, pl, lp, cfg.Connector, start)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// planStep is one tick of the planner's loop.
func (l *Router) planStep(ctx context.Context, pl *planner.Planner, lp *livePlanner, conn planner.Connector, start time.Time) {
	pc := pl.Config()
	now := time.Now()
	st := planner.State{Now: now.Sub(start)}
	pools := planner.Pools(pc.Disaggregated)
	var nodes []planNode
	for _, pool := range pools {
		for _, r := range conn.Replicas(pool) {
			nodes = append(nodes, planNode{pool: pool, rep: r})
		}
	}
	draining := map[planner.Pool]int{}
	l.mu.Lock()
	l.drainLocked()
	for i := range nodes {
		n := &nodes[i]
		if n.rep.Draining {
			draining[n.pool]++
			continue
		}
		st.Replicas[n.pool]++
		id, ok := l.byNode[n.rep.Name]
		w := l.workers[id]
		if !ok || w == nil || w.retiring.Load() {
			continue
		}
		if ws, ok := w.model.state.Worker(w.id); ok && ws.Healthy {
			st.Ready[n.pool]++
		}
		lp.mu.Lock()
		if _, seen := lp.joined[n.rep.Name]; !seen && !n.rep.Started.IsZero() {
			lp.joined[n.rep.Name] = w.joined
			if d := w.joined.Sub(n.rep.Started); d > 0 {
				lp.measured++
				lp.startup += (d - lp.startup) / time.Duration(min(lp.measured, 8)) // a running mean, then an 8-sample moving one
			}
		}
		lp.mu.Unlock()
	}
	l.mu.Unlock()
	l.forgetGone(lp, nodes)

	lp.mu.Lock()
	counters := lp.counters
	st.Startup = lp.startup
	lp.mu.Unlock()
	st.Counters = &counters
	d, ran := pl.Step(st)
	for _, pool := range pools {
		l.planMet.Replicas.WithLabelValues(pool.String(), "running").Set(float64(st.Replicas[pool]))
		l.planMet.Replicas.WithLabelValues(pool.String(), "ready").Set(float64(st.Ready[pool]))
		l.planMet.Replicas.WithLabelValues(pool.String(), "draining").Set(float64(draining[pool]))
	}
	if !ran {
		return
	}
	l.planMetrics(&d, pools)
	l.planHeld(lp, &d, pools)
	if !d.Changed() {
		l.log.Debug("planner: hold", "loop", d.Loop, "replicas", fmt.Sprint(d.Was), "observed_rate", d.Observed.Rate, "predicted_rate", d.Predicted.Rate)
		return
	}
	for _, pool := range pools {
		want, have := d.Target[pool], st.Replicas[pool]
		if want == have {
			continue
		}
		attrs := []any{"pool", pool, "loop", d.Loop, "from", have, "to", want, "reason", d.Reason[pool],
			"observed_rate", round3(d.Observed.Rate), "predicted_rate", round3(d.Predicted.Rate), "horizon_intervals", d.Horizon,
			"predicted_ttft", d.Pred[pool].TTFT.Round(time.Millisecond), "predicted_itl", d.Pred[pool].ITL.Round(100 * time.Microsecond),
			"correction_prefill", round3(d.Correction[0]), "correction_decode", round3(d.Correction[1]), "startup", d.Startup.Round(time.Millisecond)}
		var victims []string
		if want < have {
			var inflight []int
			victims, inflight = l.victims(lp, pool, nodes, have-want)
			attrs = append(attrs, "victims", fmt.Sprint(victims), "victims_in_flight", fmt.Sprint(inflight))
			l.retire(lp, pool, victims)
		}
		l.log.Info("planner: scaling", attrs...)
		l.applyScale(ctx, lp, conn, pool, want, victims)
	}
}

// applyScale asks the connector for n workers in pool, counting and logging a refusal or
// a failure (once while it lasts: the next decision asks again).
func (l *Router) applyScale(ctx context.Context, lp *livePlanner, conn planner.Connector, pool planner.Pool, n int, victims []string) {
	err := conn.Scale(ctx, pool, n, victims)
	if err != nil && ctx.Err() != nil {
		return // shutting down
	}
	if err == nil {
		if lp.failing[pool] {
			lp.failing[pool] = false
			l.log.Info("planner: the connector scales again", "pool", pool, "to", n)
		}
		return
	}
	if errors.Is(err, planner.ErrRefused) {
		l.planMet.Refused.WithLabelValues(pool.String(), "connector").Inc()
	} else {
		l.planMet.ConnectorErrors.WithLabelValues(pool.String()).Inc()
	}
	// The workers named to go stay out of rotation only if they are going.
	if len(victims) > 0 {
		l.unretire(lp, conn, pool)
	}
	if !lp.failing[pool] {
		lp.failing[pool] = true
		l.log.Error("planner: the connector did not scale (counted on /metrics; asked again at the next decision)",
			"pool", pool, "to", n, "refused", errors.Is(err, planner.ErrRefused), "err", err)
	}
}

// unretire returns to rotation the retiring workers of pool the connector does not list
// as draining: a scale-down that was refused or failed left them serving.
func (l *Router) unretire(lp *livePlanner, conn planner.Connector, pool planner.Pool) {
	draining := map[string]bool{}
	for _, r := range conn.Replicas(pool) {
		if r.Draining {
			draining[r.Name] = true
		}
	}
	var back []string
	lp.mu.Lock()
	for name, p := range lp.retiring {
		if p == pool && !draining[name] {
			delete(lp.retiring, name)
			back = append(back, name)
		}
	}
	lp.mu.Unlock()
	l.mu.Lock()
	for _, n := range back {
		if id, ok := l.byNode[n]; ok {
			if w := l.workers[id]; w != nil {
				w.retiring.Store(false) // healthy again at its next load report
			}
		}
	}
	l.mu.Unlock()
}

// planHeld counts and logs (once, when it begins) a pool held below what it needs.
func (l *Router) planHeld(lp *livePlanner, d *planner.Decision, pools []planner.Pool) {
	for _, pool := range pools {
		h := d.Held[pool]
		if h != "" {
			l.planMet.Refused.WithLabelValues(pool.String(), h).Inc()
		}
		// The throughput loop sizes against the bounds; a load loop that found nothing to
		// add says nothing about them.
		if h == lp.held[pool] || h == "" && d.Loop != "throughput" {
			continue
		}
		if h != "" {
			l.log.Warn("planner: a pool is held below what it needs (counted on /metrics)", "pool", pool, "bound", h,
				"target", d.Target[pool], "reason", d.Reason[pool])
		} else {
			l.log.Info("planner: the pool is no longer held by a bound", "pool", pool, "bound", lp.held[pool], "target", d.Target[pool])
		}
		lp.held[pool] = h
	}
}

// forgetGone drops the retiring workers that the connector no longer runs and that never
// registered (stopped while starting): they had nothing to drain.
func (l *Router) forgetGone(lp *livePlanner, nodes []planNode) {
	runs := map[string]bool{}
	for _, n := range nodes {
		runs[n.rep.Name] = true
	}
	var gone []string
	lp.mu.Lock()
	for name := range lp.retiring {
		if !runs[name] {
			gone = append(gone, name)
		}
	}
	lp.mu.Unlock()
	for _, name := range gone {
		l.mu.Lock()
		_, registered := l.byNode[name]
		l.mu.Unlock()
		if registered {
			continue // it leaves the registry soon; dropLocked counts it
		}
		lp.mu.Lock()
		pool, ok := lp.retiring[name]
		delete(lp.retiring, name)
		lp.mu.Unlock()
		if ok {
			l.planMet.ScaleDowns.WithLabelValues(pool.String(), "unstarted").Inc()
			l.log.Info("planner: retired worker left", "worker", name, "pool", pool, "result", "unstarted")
		}
	}
}

// planNode is a replica the connector runs, in its pool.
type planNode struct {
	pool planner.Pool
	rep  planner.Replica
}

// victims chooses k workers of pool to remove, and says how many requests each has in
// flight (they finish, or migrate, before it goes).
func (l *Router) victims(lp *livePlanner, pool planner.Pool, nodes []planNode, k int) ([]string, []int) {
	var cands []planner.Candidate
	l.mu.Lock()
	lp.mu.Lock()
	for _, n := range nodes {
		if n.pool != pool || n.rep.Draining {
			continue
		}
		c := planner.Candidate{Name: n.rep.Name, Starting: true, Hits: lp.hits[n.rep.Name] - lp.hitsAt[n.rep.Name]}
		if id, ok := l.byNode[n.rep.Name]; ok {
			if w := l.workers[id]; w != nil {
				if ws, ok := w.model.state.Worker(w.id); ok {
					c.Starting, c.Inflight, c.Load = false, ws.Inflight, ws.Load()
				}
			}
		}
		cands = append(cands, c)
	}
	for name, h := range lp.hits {
		lp.hitsAt[name] = h
	}
	lp.mu.Unlock()
	l.mu.Unlock()
	names := planner.Victims(cands, k)
	inflight := make([]int, len(names))
	for i, n := range names {
		for _, c := range cands {
			if c.Name == n {
				inflight[i] = c.Inflight
			}
		}
	}
	return names, inflight
}

func (l *Router) planMetrics(d *planner.Decision, pools []planner.Pool) {
	m := l.planMet
	for _, pool := range pools {
		p := pool.String()
		m.Replicas.WithLabelValues(p, "target").Set(float64(d.Target[pool]))
		dir := "hold"
		switch {
		case d.Target[pool] > d.Was[pool]:
			dir = "up"
		case d.Target[pool] < d.Was[pool]:
			dir = "down"
		}
		m.Decisions.WithLabelValues(p, d.Loop, dir).Inc()
		pr := d.Pred[pool]
		m.PredictedLatency.WithLabelValues(p, "ttft").Set(finite(pr.TTFT.Seconds()))
		m.PredictedLatency.WithLabelValues(p, "itl").Set(finite(pr.ITL.Seconds()))
		m.PredictedLatency.WithLabelValues(p, "itl_tail").Set(finite(pr.ITLTail.Seconds()))
		m.PredictedLatency.WithLabelValues(p, "ttft_attainment").Set(pr.TTFTAttainment)
		if ms := d.Measured[pool]; d.Loop == "load" && (ms.NTTFT > 0 || ms.NTPOT > 0) {
			m.Measured.WithLabelValues(p, "ttft_attainment").Set(ms.TTFT)
			m.Measured.WithLabelValues(p, "itl_attainment").Set(ms.TPOT)
			m.Measured.WithLabelValues(p, "ttft_quantile").Set(ms.TTFTq.Seconds())
			m.Measured.WithLabelValues(p, "itl_quantile").Set(ms.TPOTq.Seconds())
		}
	}
	if d.Loop == "throughput" {
		for q, v := range map[string][2]float64{
			"request_rate": {d.Observed.Rate, d.Predicted.Rate}, "input_tokens": {d.Observed.Input, d.Predicted.Input},
			"output_tokens": {d.Observed.Output, d.Predicted.Output},
		} {
			m.Observed.WithLabelValues(q).Set(v[0])
			m.Predicted.WithLabelValues(q).Set(v[1])
		}
	}
	m.Correction.WithLabelValues("prefill").Set(d.Correction[0])
	m.Correction.WithLabelValues("decode").Set(d.Correction[1])
	m.Startup.Set(d.Startup.Seconds())
}

func finite(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) || x > 1e9 {
		return math.Inf(1)
	}
	return x
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
