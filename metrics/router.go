package metrics

import "github.com/prometheus/client_golang/prometheus"

// Router holds the routing binary's metrics. The Desc fields describe
// gauges that the router collects from its state at scrape time.
type Router struct {
	Joins              prometheus.Counter
	Losses             prometheus.Counter
	DeadWorkers        prometheus.Counter // of Losses: declared dead, their load reports having stopped
	Retries            prometheus.Counter
	Refused            prometheus.Counter
	Migrations         prometheus.Counter
	Snapshots          prometheus.Counter
	Events             prometheus.Counter
	Decisions          *prometheus.CounterVec // label reason
	Rejected           *prometheus.CounterVec // label cause: busy, no_workers
	DecisionLatency    prometheus.Observer
	PromptBlocks       prometheus.Counter
	PredictedHitBlocks prometheus.Counter
	// WorkerMigrations counts, by worker, the requests that moved away from it mid-stream
	// because it failed (their sum is Migrations).
	WorkerMigrations *prometheus.CounterVec // label worker
	// PromptTokens and CachedPromptTokens are finished requests' usage as the workers
	// reported it to the client: the reported prefix-cache hit rate is their ratio.
	PromptTokens       prometheus.Counter
	CachedPromptTokens prometheus.Counter

	WorkerLoad  *prometheus.Desc // labels worker, model, quantity
	WorkerInfo  *prometheus.Desc // labels worker, model, role; always 1
	QueueDepth  *prometheus.Desc
	IndexBlocks *prometheus.Desc // label model
	// WorkerStartup is each worker's start-up as its card reported it: seconds by phase,
	// labels worker, model, weights (where its weights came from), phase.
	WorkerStartup *prometheus.Desc
}

// NewRouter registers the router's metrics on reg.
func NewRouter(reg prometheus.Registerer) *Router {
	f := factory{reg: reg}
	return &Router{
		Joins:  f.counter("tandem_router:worker_joins_total", "Workers registered."),
		Losses: f.counter("tandem_router:worker_losses_total", "Workers removed (disconnected, silent, replaced)."),
		DeadWorkers: f.counter("tandem_router:worker_heartbeat_timeouts_total",
			"Workers declared dead and removed because their load reports stopped for the heartbeat timeout (counted in worker_losses_total too)."),
		Retries: f.counter("tandem_router:request_retries_total",
			"Requests sent to another worker because theirs failed or was declared dead before their first token."),
		Refused:    f.counter("tandem_router:worker_refusals_total", "Registrations refused because the model card disagrees."),
		Migrations: f.counter("tandem_router:migrations_total", "Requests moved to another worker mid-stream."),
		Snapshots:  f.counter("tandem_router:kv_snapshots_total", "KV snapshots fetched from workers."),
		Events:     f.counter("tandem_router:kv_events_total", "KV events applied to the index."),
		Decisions: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:routing_decisions_total",
			Help: "Routing decisions by reason."}, []string{"reason"})).(*prometheus.CounterVec),
		Rejected: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:routing_rejections_total",
			Help: "Routing attempts that found no worker, by cause."}, []string{"cause"})).(*prometheus.CounterVec),
		DecisionLatency:    f.histogram("tandem_router:routing_decision_seconds", "Time to take a routing decision.", prometheus.ExponentialBuckets(1e-6, 4, 10)),
		PromptBlocks:       f.counter("tandem_router:prompt_blocks_total", "Prompt blocks routed."),
		PredictedHitBlocks: f.counter("tandem_router:predicted_hit_blocks_total", "Prompt blocks predicted cached on the chosen worker (hit rate = this / prompt_blocks_total)."),
		WorkerMigrations: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:worker_migrations_total",
			Help: "Requests moved mid-stream away from a worker that failed, by that worker."}, []string{"worker"})).(*prometheus.CounterVec),
		PromptTokens: f.counter("tandem_router:prompt_tokens_total", "Prompt tokens of finished requests, as their workers reported them."),
		CachedPromptTokens: f.counter("tandem_router:cached_prompt_tokens_total",
			"Of the prompt tokens of finished requests, those the workers reported cached (reported hit rate = this / prompt_tokens_total)."),
		WorkerInfo: prometheus.NewDesc("tandem_router:worker_info", "Registered workers (always 1), with their role: join on worker for per-pool sums.",
			[]string{"worker", "model", "role"}, nil),
		WorkerLoad: prometheus.NewDesc("tandem_router:worker_load", "Predicted load per worker, by quantity.",
			[]string{"worker", "model", "quantity"}, nil),
		QueueDepth:  prometheus.NewDesc("tandem_router:queue_depth", "Requests waiting for a worker that is not busy.", nil, nil),
		IndexBlocks: prometheus.NewDesc("tandem_router:index_blocks", "Distinct block hashes in the KV index, per model.", []string{"model"}, nil),
		WorkerStartup: prometheus.NewDesc("tandem_router:worker_startup_seconds",
			"Each worker's start-up time by phase, as it reported it (weights: where its weights came from: file, pack-cache, peer).",
			[]string{"worker", "model", "weights", "phase"}, nil),
	}
}
