package router

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// liveMetrics are the live router's Prometheus metrics (names under "tandem_router:").
// Per-worker load is collected at scrape time from the policy state.
type liveMetrics struct {
	l          *Live
	joins      prometheus.Counter
	losses     prometheus.Counter
	refused    prometheus.Counter
	migrations prometheus.Counter
	snapshots  prometheus.Counter
	events     prometheus.Counter
	decisions  *prometheus.CounterVec // label reason
	rejected   *prometheus.CounterVec // label cause: busy, no_workers
	latency    prometheus.Histogram
	promptBlk  prometheus.Counter
	hitBlk     prometheus.Counter

	workerDesc *prometheus.Desc
	queueDesc  *prometheus.Desc
	indexDesc  *prometheus.Desc
}

func newLiveMetrics(l *Live) *liveMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return &liveMetrics{
		l:          l,
		joins:      c("tandem_router:worker_joins_total", "Workers registered."),
		losses:     c("tandem_router:worker_losses_total", "Workers removed (disconnected, silent, replaced)."),
		refused:    c("tandem_router:worker_refusals_total", "Registrations refused because the model card disagrees."),
		migrations: c("tandem_router:migrations_total", "Requests moved to another worker mid-stream."),
		snapshots:  c("tandem_router:kv_snapshots_total", "KV snapshots fetched from workers."),
		events:     c("tandem_router:kv_events_total", "KV events applied to the index."),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:routing_decisions_total",
			Help: "Routing decisions by reason."}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:routing_rejections_total",
			Help: "Routing attempts that found no worker, by cause."}, []string{"cause"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tandem_router:routing_decision_seconds",
			Help: "Time to take a routing decision.", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10)}),
		promptBlk: c("tandem_router:prompt_blocks_total", "Prompt blocks routed."),
		hitBlk:    c("tandem_router:predicted_hit_blocks_total", "Prompt blocks predicted cached on the chosen worker (hit rate = this / prompt_blocks_total)."),
		workerDesc: prometheus.NewDesc("tandem_router:worker_load", "Predicted load per worker, by quantity.",
			[]string{"worker", "model", "quantity"}, nil),
		queueDesc: prometheus.NewDesc("tandem_router:queue_depth", "Requests waiting for a worker that is not busy.", nil, nil),
		indexDesc: prometheus.NewDesc("tandem_router:index_blocks", "Distinct block hashes in the KV index, per model.", []string{"model"}, nil),
	}
}

func (m *liveMetrics) decision(d Decision, err error, took time.Duration) {
	m.latency.Observe(took.Seconds())
	switch {
	case errors.Is(err, ErrAllBusy):
		m.rejected.WithLabelValues("busy").Inc()
	case errors.Is(err, ErrNoWorkers):
		m.rejected.WithLabelValues("no_workers").Inc()
	case err == nil:
		m.decisions.WithLabelValues(d.Reason).Inc()
		m.promptBlk.Add(float64(d.PromptBlocks))
		m.hitBlk.Add(float64(d.Overlap))
	}
}

// MustRegister registers the metrics on reg.
func (m *liveMetrics) MustRegister(reg prometheus.Registerer) {
	reg.MustRegister(m.joins, m.losses, m.refused, m.migrations, m.snapshots, m.events, m.decisions, m.rejected,
		m.latency, m.promptBlk, m.hitBlk, m)
}

// Describe implements prometheus.Collector for the scrape-time gauges.
func (m *liveMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.workerDesc
	ch <- m.queueDesc
	ch <- m.indexDesc
}

// Collect implements prometheus.Collector.
func (m *liveMetrics) Collect(ch chan<- prometheus.Metric) {
	l := m.l
	l.mu.Lock()
	defer l.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(m.queueDesc, prometheus.GaugeValue, float64(l.queued))
	for _, md := range l.models {
		ch <- prometheus.MustNewConstMetric(m.indexDesc, prometheus.GaugeValue, float64(md.state.Index().Len()), md.name)
	}
	for _, w := range l.workers {
		st, ok := w.model.state.Worker(w.id)
		if !ok {
			continue
		}
		g := func(q string, v float64) {
			ch <- prometheus.MustNewConstMetric(m.workerDesc, prometheus.GaugeValue, v, w.node, w.model.name, q)
		}
		g("prefill_blocks", st.PrefillBlocks())
		g("decode_blocks", st.DecodeBlocks())
		g("waiting", float64(st.Waiting()))
		g("running", float64(st.Report.Running))
		g("kv_usage", st.KVUsage())
		g("inflight", float64(st.Inflight))
		g("index_blocks", float64(w.model.state.Index().Blocks(w.id)))
		g("healthy", boolFloat(st.Healthy))
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
