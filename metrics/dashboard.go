package metrics

import "github.com/prometheus/client_golang/prometheus"

// Dashboard holds the live dashboard's own metrics (package web): its open data streams,
// the streams it refused, and the SLA targets its latency charts are drawn against (so
// that Grafana can draw the same lines).
type Dashboard struct {
	Streams prometheus.Gauge
	// Refused counts data streams refused, by reason: unauthorized, too_many.
	Refused *prometheus.CounterVec
	// SLATarget is the latency target in seconds, by target: ttft, itl.
	SLATarget *prometheus.GaugeVec
}

// NewDashboard registers the dashboard's metrics on reg under prefix ("tandem" for the
// engine, "tandem_router" for the router).
func NewDashboard(reg prometheus.Registerer, prefix string) *Dashboard {
	f := factory{reg: reg}
	return &Dashboard{
		Streams: f.gauge(prefix+":dashboard_streams", "Dashboard data streams open now."),
		Refused: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + ":dashboard_streams_refused_total",
			Help: "Dashboard data streams refused, by reason (unauthorized, too_many)."}, []string{"reason"})).(*prometheus.CounterVec),
		SLATarget: f.register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: prefix + ":sla_target_seconds",
			Help: "Latency target (--sla-ttft, --sla-itl) in seconds, by target (ttft, itl)."}, []string{"target"})).(*prometheus.GaugeVec),
	}
}
