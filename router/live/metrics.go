package live

import (
	"cmp"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/cluster"
	"tandem/llm"
	"tandem/metrics"
	"tandem/router"
)

// liveMetrics records the live router's metrics (defined in package metrics)
// and collects the per-worker gauges from the policy state at scrape time.
type liveMetrics struct {
	*metrics.Router
	mem *metrics.Membership
	l   *Router
}

func newLiveMetrics(l *Router, reg prometheus.Registerer) *liveMetrics {
	m := &liveMetrics{Router: metrics.NewRouter(reg), mem: metrics.NewMembership(reg), l: l}
	reg.MustRegister(m)
	return m
}

func (m *liveMetrics) decision(d router.Decision, err error, took time.Duration) {
	m.DecisionLatency.Observe(took.Seconds())
	switch {
	case errors.Is(err, router.ErrAllBusy):
		m.Rejected.WithLabelValues("busy").Inc()
	case errors.Is(err, router.ErrNoWorkers):
		m.Rejected.WithLabelValues("no_workers").Inc()
	case err == nil:
		m.Decisions.WithLabelValues(d.Reason).Inc()
		m.PromptBlocks.Add(float64(d.PromptBlocks))
		m.PredictedHitBlocks.Add(float64(d.Overlap))
		if d.PeerBlocks > 0 {
			m.PeerPulls.Inc()
		}
	}
}

// Describe implements prometheus.Collector for the scrape-time gauges.
func (m *liveMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.WorkerLoad
	ch <- m.WorkerInfo
	ch <- m.QueueDepth
	ch <- m.IndexBlocks
	ch <- m.IndexEntries
	ch <- m.IndexBytes
	ch <- m.StaleWorkers
	ch <- m.KVIndexGapWorkers
	ch <- m.WorkerStartup
}

// Collect implements prometheus.Collector.
func (m *liveMetrics) Collect(ch chan<- prometheus.Metric) {
	l := m.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drainLocked()
	ch <- prometheus.MustNewConstMetric(m.QueueDepth, prometheus.GaugeValue, float64(l.queued))
	for _, md := range l.models {
		x := md.state.Index()
		ch <- prometheus.MustNewConstMetric(m.IndexBlocks, prometheus.GaugeValue, float64(x.Len()), md.name)
		ch <- prometheus.MustNewConstMetric(m.IndexEntries, prometheus.GaugeValue, float64(x.Entries()), md.name)
		ch <- prometheus.MustNewConstMetric(m.IndexBytes, prometheus.GaugeValue, float64(x.Bytes()), md.name)
		stale, resyncing := 0, 0
		for _, w := range l.workers {
			if w.model != md {
				continue
			}
			if w.staleFlag.Load() {
				stale++
			}
			w.kv.Lock()
			if w.kvs.resyncing {
				resyncing++
			}
			w.kv.Unlock()
		}
		ch <- prometheus.MustNewConstMetric(m.StaleWorkers, prometheus.GaugeValue, float64(stale), md.name)
		ch <- prometheus.MustNewConstMetric(m.KVIndexGapWorkers, prometheus.GaugeValue, float64(resyncing), md.name)
	}
	for _, w := range l.workers {
		st, ok := w.model.state.Worker(w.id)
		if !ok {
			continue
		}
		g := func(q string, v float64) {
			ch <- prometheus.MustNewConstMetric(m.WorkerLoad, prometheus.GaugeValue, v, w.node, w.model.name, q)
		}
		g("prefill_blocks", st.PrefillBlocks())
		g("decode_blocks", st.DecodeBlocks())
		g("waiting", float64(st.Waiting()))
		g("running", float64(st.Report.Running))
		g("kv_usage", st.KVUsage())
		g("inflight", float64(st.Inflight))
		g("index_blocks", float64(w.model.state.Index().Blocks(w.id)))
		g("queued", float64(st.Report.Queued))
		g("healthy", boolFloat(st.Healthy))
		ch <- prometheus.MustNewConstMetric(m.WorkerInfo, prometheus.GaugeValue, 1, w.node, w.model.name, cmp.Or(st.Card.Role, cluster.RoleBoth))
		g("kv_stale", boolFloat(st.Stale))
		// A count since the worker started, not a load: the steps whose decodes its engine
		// predicted past its ITL target (too many streams for it); rate() over it says how
		// often a worker cannot keep its streams smooth.
		g("steps_over_itl_target", float64(st.Report.StepsOverTarget))
		for _, ph := range w.startup.Phases {
			ch <- prometheus.MustNewConstMetric(m.WorkerStartup, prometheus.GaugeValue, ph.Seconds, w.node, w.model.name, w.startup.Weights, ph.Name)
		}
	}
}

// usage counts a finished request's usage as its worker reported it.
func (m *liveMetrics) usage(u llm.Usage) {
	m.PromptTokens.Add(float64(u.PromptTokens))
	m.CachedPromptTokens.Add(float64(u.CachedTokens))
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
