package metrics

import "github.com/prometheus/client_golang/prometheus"

// KVTransfer holds a worker's metrics of disaggregated prefill and decode: the KV blocks it
// sends (as a prefill worker) and receives (as a decode worker).
type KVTransfer struct {
	Bytes      *prometheus.CounterVec // label direction: sent, received
	Blocks     *prometheus.CounterVec // label direction
	Pulls      *prometheus.CounterVec // label result: ok, none_missing, failed, timeout
	Latency    prometheus.Observer    // seconds per pull, receiver side, from request to last block (waits for P's compute included)
	Throughput prometheus.Observer    // bytes per second per pull, receiver side: bytes / Latency
	Prefills   prometheus.Counter     // prefill-only requests served
	// PeerPulls counts the pulls of a prompt's blocks from a peer's cache that a router
	// asked for (docs/kv-tiers.md), by result: ok, partial (the peer's cache ended
	// sooner), none_missing, failed, timeout; the rest is computed.
	PeerPulls *prometheus.CounterVec
}

// NewKVTransfer registers a worker's KV transfer metrics for model on reg.
func NewKVTransfer(reg prometheus.Registerer, model string) *KVTransfer {
	labels := prometheus.Labels{"model_name": model}
	f := factory{reg: reg, labels: labels}
	vec := func(name, help, label string) *prometheus.CounterVec {
		return f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, []string{label})).(*prometheus.CounterVec)
	}
	return &KVTransfer{
		Bytes:      vec("tandem:kv_transfer_bytes_total", "KV block bytes transferred between workers, by direction.", "direction"),
		Blocks:     vec("tandem:kv_transfer_blocks_total", "KV blocks transferred between workers, by direction.", "direction"),
		Pulls:      vec("tandem:kv_transfer_pulls_total", "KV pulls by a decode worker, by result.", "result"),
		Latency:    f.histogram("tandem:kv_transfer_seconds", "Duration of a KV pull, from request to last block; a pull overlapping the prefill waits for its compute too.", latencyBuckets),
		Throughput: f.histogram("tandem:kv_transfer_bytes_per_second", "Bytes of a KV pull over its duration (tandem:kv_transfer_seconds).", prometheus.ExponentialBuckets(1<<20, 2, 16)),
		Prefills:   f.counter("tandem:prefill_only_requests_total", "Prefill-only requests served for a decode worker."),
		PeerPulls:  vec("tandem:kv_peer_pulls_total", "Pulls of a prompt's KV blocks from a peer's cache, by result (ok, partial, none_missing, failed, timeout); the rest is computed.", "result"),
	}
}

// RegisterKVState registers metrics read at scrape time from an engine: the KV blocks
// referenced now (by sequences, holds and imports; the pool's Used), the block sets held
// for a pull, and the holds that expired unclaimed. Failure tests watch the first two
// return to their baseline.
func RegisterKVState(reg prometheus.Registerer, model string, used, held, expired func() float64) {
	labels := prometheus.Labels{"model_name": model}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tandem:kv_blocks_in_use", Help: "KV blocks referenced now (by sequences, held prefills and imports).", ConstLabels: labels}, used),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tandem:kv_held_prefills", Help: "Prefilled block sets held for a decode worker's pull.", ConstLabels: labels}, held),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tandem:kv_held_expired_total", Help: "Held KV block sets freed by their timeout, never released by a decode worker.", ConstLabels: labels}, expired),
	)
}

// Disagg holds the router's metrics of disaggregated prefill and decode.
type Disagg struct {
	// Prefills counts requests by where their prefill ran (where: remote, local) and why.
	Prefills *prometheus.CounterVec
	// Fallbacks counts remote prefills that failed, by stage, after which the decode worker
	// prefilled locally. The router sees the prefill stage ("prefill"); a failed transfer
	// shows in the decode worker's KVTransfer.Pulls (result failed or timeout).
	Fallbacks *prometheus.CounterVec
	// TTFT and ITL as the router sees them, by the pool of the worker that produced the
	// token (prefill, decode, both).
	TTFT *prometheus.HistogramVec
	ITL  *prometheus.HistogramVec
}

// NewDisagg registers the router's disaggregation metrics on reg.
func NewDisagg(reg prometheus.Registerer) *Disagg {
	f := factory{reg: reg}
	return &Disagg{
		Prefills: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:prefills_total",
			Help: "Requests by where their prefill ran (remote: a prefill worker; local: the decode worker) and why."},
			[]string{"where", "reason"})).(*prometheus.CounterVec),
		Fallbacks: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:remote_prefill_fallbacks_total",
			Help: "Remote prefills that failed, after which the decode worker prefilled locally, by stage."},
			[]string{"stage"})).(*prometheus.CounterVec),
		TTFT: f.register(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tandem_router:time_to_first_token_seconds",
			Help: "Time to first token at the router, by the pool of the worker that produced it.", Buckets: latencyBuckets},
			[]string{"pool"})).(*prometheus.HistogramVec),
		ITL: f.register(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tandem_router:inter_token_latency_seconds",
			Help: "Inter-token latency at the router, by the pool of the worker that produced the token.", Buckets: latencyBuckets},
			[]string{"pool"})).(*prometheus.HistogramVec),
	}
}
