package metrics

import "github.com/prometheus/client_golang/prometheus"

// Planner holds the router's SLA planner metrics (docs/planner.md): the pools' sizes, the
// loops' decisions, the load they observed and predicted, the model's latency at the
// target sizes, its corrections, the start-up time planned with, and how scale-downs
// ended.
type Planner struct {
	// Replicas by pool (both, prefill, decode) and state: target (what the planner wants),
	// running (asked for and not draining: starting or serving), ready (serving),
	// draining.
	Replicas *prometheus.GaugeVec
	// Decisions counts loop runs by pool, loop (throughput, load) and direction (up, down,
	// hold).
	Decisions *prometheus.CounterVec
	// Observed and Predicted are the throughput loop's load, by quantity: request_rate
	// (per second), input_tokens and output_tokens (means per request).
	Observed, Predicted *prometheus.GaugeVec
	// PredictedLatency is the model's latency at the target sizes under the predicted
	// load, by pool and quantity: ttft and itl (means, seconds), itl_tail (the ITL at the
	// goal's quantile, seconds) and ttft_attainment (the fraction of first tokens within target).
	PredictedLatency *prometheus.GaugeVec
	// Measured is the load loop's window, by pool and quantity: ttft_attainment,
	// itl_attainment (fractions within target), ttft_quantile and itl_quantile (seconds at
	// the goal's quantile).
	Measured *prometheus.GaugeVec
	// Correction multiplies the model's prefill work and decode step, by phase.
	Correction *prometheus.GaugeVec
	// Startup is the start-up time of a new replica the planner plans with, seconds:
	// measured (registration less start) when a replica has joined, else configured.
	Startup prometheus.Gauge
	// ScaleDowns counts removed workers by pool and result: drained (it left with no
	// request in flight), migrated (its drain ran out; its requests moved elsewhere) or
	// unstarted (stopped before it had registered).
	ScaleDowns *prometheus.CounterVec
	// ConnectorErrors counts failed scale requests by pool; ConnectorReadErrors the
	// connector's failed reads of a pool's replicas (the planner then goes on with the
	// last list read).
	ConnectorErrors     *prometheus.CounterVec
	ConnectorReadErrors *prometheus.CounterVec
	// Refused counts decisions that left a pool short of what it needs, by pool and
	// reason: max (the pool's upper bound), budget (the total bound) or connector (the
	// connector declined the request).
	Refused *prometheus.CounterVec
}

// NewPlanner registers the router's planner metrics on reg.
func NewPlanner(reg prometheus.Registerer) *Planner {
	f := factory{reg: reg}
	gv := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return f.register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)).(*prometheus.GaugeVec)
	}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)).(*prometheus.CounterVec)
	}
	return &Planner{
		Replicas:         gv("tandem_router:planner_replicas", "Workers per pool, by state: target, running (starting or serving), ready, draining.", "pool", "state"),
		Decisions:        cv("tandem_router:planner_decisions_total", "Planner loop runs by pool, loop (throughput, load) and direction (up, down, hold).", "pool", "loop", "direction"),
		Observed:         gv("tandem_router:planner_observed", "The last adjustment interval's load: request_rate, input_tokens, output_tokens.", "quantity"),
		Predicted:        gv("tandem_router:planner_predicted", "The load the planner sized for: request_rate, input_tokens, output_tokens.", "quantity"),
		PredictedLatency: gv("tandem_router:planner_predicted_latency", "The model's latency at the target sizes under the predicted load, by pool and quantity (ttft, itl: means in seconds; itl_tail: at the goal's quantile; ttft_attainment: fraction within target).", "pool", "quantity"),
		Measured:         gv("tandem_router:planner_measured", "The load loop's window by pool and quantity (ttft_attainment, itl_attainment as fractions; ttft_quantile, itl_quantile in seconds).", "pool", "quantity"),
		Correction:       gv("tandem_router:planner_correction", "Factor on the model's prefill work and decode step, learned from measured latency, by phase.", "phase"),
		Startup:          f.gauge("tandem_router:planner_startup_seconds", "Start-up time of a new replica the planner plans with (measured, else configured)."),
		ScaleDowns:       cv("tandem_router:planner_scale_downs_total", "Workers removed by the planner, by pool and result: drained, migrated (requests moved on), unstarted (stopped while starting).", "pool", "result"),
		Refused:          cv("tandem_router:planner_refused_total", "Planner decisions that left a pool short of what it needs, by pool and reason: max (its bound), budget (the total bound), connector (declined).", "pool", "reason"),
		ConnectorErrors:  cv("tandem_router:planner_connector_errors_total", "Scale requests the connector failed, by pool.", "pool"),
		ConnectorReadErrors: cv("tandem_router:planner_connector_read_errors_total",
			"Reads of a pool's replicas the connector failed (the planner went on with the last list read), by pool.", "pool"),
	}
}
