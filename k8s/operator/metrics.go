package operator

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the operator's own counters, beside controller-runtime's (reconciles,
// errors, queue depth) on the operator's /metrics.
type Metrics struct {
	gangWaits       *prometheus.CounterVec
	replicasCreated *prometheus.CounterVec
	routerWaits     *prometheus.CounterVec
}

// NewMetrics registers the operator's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		gangWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem_operator_gang_waits_total",
			Help: "Times a pool's new replica found no room for its whole gang under its topology rules, and waited.",
		}, []string{"namespace", "pool"}),
		replicasCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem_operator_replicas_created_total",
			Help: "Replicas (gangs of pods) the operator created.",
		}, []string{"namespace", "pool"}),
		routerWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem_operator_router_waits_total",
			Help: "Reconciles that held a cluster's engine pools back because no router was ready yet.",
		}, []string{"namespace", "cluster"}),
	}
	for _, c := range []prometheus.Collector{m.gangWaits, m.replicasCreated, m.routerWaits} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
