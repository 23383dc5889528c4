package metrics

import "github.com/prometheus/client_golang/prometheus"

// Responses holds the response store's metrics (package respstore): the Responses API's
// stored responses, and those its TTL removed.
type Responses struct {
	Stored  prometheus.Gauge
	Expired prometheus.Counter
}

// NewResponses registers the response store's metrics on reg under prefix ("tandem" for
// the engine, "tandem_router" for the router).
func NewResponses(reg prometheus.Registerer, prefix string) *Responses {
	f := factory{reg: reg}
	return &Responses{
		Stored:  f.gauge(prefix+":responses_stored", "Responses API responses kept in the response store."),
		Expired: f.counter(prefix+":responses_expired_total", "Stored responses removed because their TTL (--response-ttl) passed."),
	}
}
