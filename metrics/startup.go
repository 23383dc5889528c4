package metrics

import "github.com/prometheus/client_golang/prometheus"

// Startup holds an engine's start-up metrics: how long each phase took, where the weights
// came from, and every source that was tried and not used.
type Startup struct {
	// Seconds is tandem:startup_seconds{phase}: open (parse and map the model file),
	// hash (its content hash), join (the cluster identity, before a pull), weights
	// (prepared from the file, a pack cache or a peer), engine (KV cache and engine),
	// total (process start to serving).
	Seconds *prometheus.GaugeVec
	// Source is 1 for the source the weights came from: file, pack-cache or peer.
	Source *prometheus.GaugeVec
	// Fallbacks counts sources tried and given up, by source (pack-cache, peer) and
	// reason (pack cache: stale, corrupt, unusable; peer: other_model, refused, died,
	// corrupt).
	Fallbacks *prometheus.CounterVec
}

// NewStartup registers an engine's start-up metrics on reg.
func NewStartup(reg prometheus.Registerer) *Startup {
	f := factory{reg: reg}
	return &Startup{
		Seconds: f.register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tandem:startup_seconds",
			Help: "Time each start-up phase took: open, hash, join, weights, engine, and total from process start to serving."}, []string{"phase"})).(*prometheus.GaugeVec),
		Source: f.register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tandem:startup_weights_source",
			Help: "1 for where this engine's weights came from: file (prepared here), pack-cache or peer."}, []string{"source"})).(*prometheus.GaugeVec),
		Fallbacks: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:weights_fallbacks_total",
			Help: "Weight sources tried at start-up and given up for the next one, by source (pack-cache, peer) and reason."}, []string{"source", "reason"})).(*prometheus.CounterVec),
	}
}

// RegisterPrepared registers tandem:weights_prepared{how}, read at scrape time from the
// backend: weights it prepared itself (packed) and weights it was given prepared
// (imported from a pack cache or a peer). A start from either packs none, also later.
func RegisterPrepared(reg prometheus.Registerer, packed, imported func() float64) {
	const name, help = "tandem:weights_prepared", "Weights the backend prepared itself (how=packed) and those it was given prepared (how=imported: a pack cache or a peer)."
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"how": "packed"}}, packed),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"how": "imported"}}, imported),
	)
}

// WeightsTransfer holds a worker's metrics of prepared weights sent to and received from
// peers (Worker.PullWeights).
type WeightsTransfer struct {
	Bytes *prometheus.CounterVec // label direction: sent, received
	// Streams counts pull streams served, by result: ok, refused, failed.
	Streams *prometheus.CounterVec
	// Sending is the pull streams being served now.
	Sending prometheus.Gauge
}

// NewWeightsTransfer registers a worker's weights transfer metrics on reg.
func NewWeightsTransfer(reg prometheus.Registerer) *WeightsTransfer {
	f := factory{reg: reg}
	return &WeightsTransfer{
		Bytes: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:weights_transfer_bytes_total",
			Help: "Prepared weight bytes transferred between engines, by direction."}, []string{"direction"})).(*prometheus.CounterVec),
		Streams: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:weights_pull_streams_total",
			Help: "Weights pull streams this engine served to a peer, by result: ok, refused, failed."}, []string{"result"})).(*prometheus.CounterVec),
		Sending: f.gauge("tandem:weights_pull_streams_active", "Weights pull streams being served to peers now."),
	}
}
