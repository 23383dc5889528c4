package metrics

import "github.com/prometheus/client_golang/prometheus"

// Pipeline holds a pipeline replica's metrics (package pipeline): its links from one stage
// to the next, the steps that crossed them and those that failed.
type Pipeline struct {
	// LinkUp is 1 while the head's link to the next stage answers (every stage's, since a
	// stage's link to its own next carries the head's steps), 0 while the replica is down.
	LinkUp prometheus.Gauge
	// LinkFailures counts links lost or refused, by reason: lost (a step's answer did not
	// come: the connection broke or a stage died), refused (a stage refused the replica's
	// hello: another model, split or block size), dial (no stage listens there).
	LinkFailures *prometheus.CounterVec
	// StepsFailed counts forward steps that failed in the pipeline (their sequences end
	// with an error and migrate when a router sent them).
	StepsFailed prometheus.Counter
	// Steps and BytesSent count the steps sent to the next stage and their bytes.
	Steps, BytesSent prometheus.Counter
	// Rejoins counts the times the link came back after a failure (the replica then drops
	// its prefix cache: the restarted stage's KV is gone).
	Rejoins prometheus.Counter
	// KVBytes counts the bytes of this stage's layers' part of the KV blocks a transfer
	// read (op read: a prefill replica's export) or wrote (op write: a decode replica's
	// import); the head counts its own part. Summed over the stages: the blocks' bytes.
	KVBytes *prometheus.CounterVec
}

// NewPipeline registers a pipeline stage's metrics on reg (nil: counted, served nowhere).
func NewPipeline(reg prometheus.Registerer) *Pipeline {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	f := factory{reg: reg}
	p := &Pipeline{
		LinkUp: f.gauge("tandem:pipeline_link_up",
			"1 while the link to the next pipeline stage answers, 0 while the replica is down."),
		LinkFailures: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:pipeline_link_failures_total",
			Help: "Links to the next pipeline stage lost or refused, by reason: lost, refused, dial."}, []string{"reason"})).(*prometheus.CounterVec),
		StepsFailed: f.counter("tandem:pipeline_steps_failed_total",
			"Forward steps that failed in the pipeline; their sequences end with an error (and migrate when a router sent them)."),
		Steps:     f.counter("tandem:pipeline_steps_total", "Forward steps sent to the next pipeline stage."),
		BytesSent: f.counter("tandem:pipeline_sent_bytes_total", "Bytes of the steps sent to the next pipeline stage (activations and batch layout)."),
		Rejoins: f.counter("tandem:pipeline_rejoins_total",
			"Times the link to the next stage came back after a failure (the replica drops its prefix cache then)."),
		KVBytes: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:pipeline_kv_bytes_total",
			Help: "Bytes of this stage's layers' part of KV blocks read for a transfer (op read) or written from one (op write)."}, []string{"op"})).(*prometheus.CounterVec),
	}
	for _, op := range []string{"read", "write"} {
		p.KVBytes.WithLabelValues(op)
	}
	for _, r := range []string{"lost", "refused", "dial"} {
		p.LinkFailures.WithLabelValues(r) // at 0 from the start, so that rates and alerts see them
	}
	return p
}
