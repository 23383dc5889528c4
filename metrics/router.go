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
	// PeerPulls counts the requests sent with a peer to pull their prefix from
	// (docs/kv-tiers.md); the workers count the pulls by result.
	PeerPulls prometheus.Counter
	// WorkerMigrations counts, by worker, the requests that moved away from it mid-stream
	// because it failed (their sum is Migrations).
	WorkerMigrations *prometheus.CounterVec // label worker
	// PromptTokens and CachedPromptTokens are finished requests' usage as the workers
	// reported it to the client: the reported prefix-cache hit rate is their ratio.
	PromptTokens       prometheus.Counter
	CachedPromptTokens prometheus.Counter

	// Requests that waited in the router's queue (label cause: busy, no_workers), once per
	// request; Rejected counts each attempt that found no worker.
	Queued *prometheus.CounterVec
	// AdapterLoads counts the LoRA adapter loads the router asked a worker for (its
	// run-time API, a request no worker could serve, or a cheaper worker without the
	// adapter), by result: ok, error.
	AdapterLoads *prometheus.CounterVec
	// The router's own stalls: heartbeat ticks that came late (the time is not counted
	// against the workers' heartbeats), and ticks at which most workers had gone silent
	// at once, which the router took for its own host's or network's trouble rather than
	// the fleet's death.
	RouterStalls     prometheus.Counter
	RouterStallTime  prometheus.Counter
	MassSilenceHolds prometheus.Counter
	// Share and Shares: this router's share of the workers' ties among the routers the
	// workers say front them (0 of 0: none); ShareDisagreements, registrations that placed
	// this router otherwise than the share it follows (workers given other --join lists).
	Share, Shares      prometheus.Gauge
	ShareDisagreements prometheus.Counter
	KVGaps             *prometheus.CounterVec // label worker: event id gaps
	KVResyncs          *prometheus.CounterVec // labels worker, cause (join, gap, behind, drift, retry)
	// LocalEngineEvents counts the degraded events of engines this process supervises
	// (tandem cluster, the planner's local connector), by event: restarted, killed.
	LocalEngineEvents *prometheus.CounterVec
	KVResyncFailures  *prometheus.CounterVec // label worker
	KVDrift           *prometheus.CounterVec // label worker: consistency checks that found the index's block count off
	KVStale           *prometheus.CounterVec // label worker: times it was marked stale
	KVEventsDropped   *prometheus.CounterVec // label worker: events dropped while a resync's backlog was full
	IndexEntries      *prometheus.Desc       // label model: (worker, block) entries
	IndexBytes        *prometheus.Desc       // label model
	StaleWorkers      *prometheus.Desc       // label model: workers whose KV events are missing
	KVIndexGapWorkers *prometheus.Desc       // label model: workers being resynchronised now

	WorkerLoad  *prometheus.Desc // labels worker, model, quantity
	WorkerInfo  *prometheus.Desc // labels worker, model, role; always 1
	QueueDepth  *prometheus.Desc
	IndexBlocks *prometheus.Desc // label model
	// WorkerStartup is each worker's start-up as its card reported it: seconds by phase,
	// labels worker, model, weights (where its weights came from), phase.
	WorkerStartup *prometheus.Desc

	// WorkerMessages counts the load reports and KV event batches received, by kind
	// (report, events) and by way (stream: Worker.Publish; call: Router.Heartbeat and
	// Router.Events, from workers that do not publish, and the workers' liveness probes).
	WorkerMessages *prometheus.CounterVec
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
		PeerPulls:          f.counter("tandem_router:peer_pulls_total", "Requests sent with a peer worker to pull their prompt's prefix from, pulling being cheaper than computing it."),
		WorkerMigrations: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:worker_migrations_total",
			Help: "Requests moved mid-stream away from a worker that failed, by that worker."}, []string{"worker"})).(*prometheus.CounterVec),
		PromptTokens: f.counter("tandem_router:prompt_tokens_total", "Prompt tokens of finished requests, as their workers reported them."),
		CachedPromptTokens: f.counter("tandem_router:cached_prompt_tokens_total",
			"Of the prompt tokens of finished requests, those the workers reported cached (reported hit rate = this / prompt_tokens_total)."),
		WorkerInfo: prometheus.NewDesc("tandem_router:worker_info", "Registered workers (always 1), with their role: join on worker for per-pool sums.",
			[]string{"worker", "model", "role"}, nil),
		Queued: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:requests_queued_total",
			Help: "Requests that waited in the router for a worker, by cause (busy: every worker busy; no_workers: none healthy)."}, []string{"cause"})).(*prometheus.CounterVec),
		AdapterLoads: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:lora_loads_total",
			Help: "LoRA adapter loads the router asked a worker for, by result."}, []string{"result"})).(*prometheus.CounterVec),
		RouterStalls: f.counter("tandem_router:heartbeat_ticks_late_total",
			"Heartbeat checks that ran late (the router's own host stalled); the lateness is not counted against the workers."),
		RouterStallTime: f.counter("tandem_router:heartbeat_ticks_late_seconds_total", "Total lateness of the late heartbeat checks."),
		MassSilenceHolds: f.counter("tandem_router:heartbeat_mass_silence_total",
			"Heartbeat checks at which most workers were silent past the timeout at once and none was declared dead (the router suspects itself)."),
		Share: f.gauge("tandem_router:share",
			"This router's share of the workers (0-based) among tandem_router:shares routers; where workers tie, it takes its own share's first."),
		Shares: f.gauge("tandem_router:shares",
			"Routers that front these workers, as the workers' --join lists say (0: one, or not said)."),
		ShareDisagreements: f.counter("tandem_router:share_disagreements_total",
			"Worker registrations that placed this router otherwise than the share it follows (workers given different --join lists)."),
		KVGaps: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:kv_event_gaps_total",
			Help: "KV event id gaps, per worker."}, []string{"worker"})).(*prometheus.CounterVec),
		LocalEngineEvents: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:local_engine_events_total",
			Help: "Engines this process supervises (tandem cluster, the planner's local connector), by event: restarted (died by itself), killed (outlived its drain after SIGTERM)."}, []string{"event"})).(*prometheus.CounterVec),
		KVResyncs: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:kv_resyncs_total",
			Help: "KV index resynchronisations from a worker's snapshot, per worker and cause (join, gap, behind, drift, retry)."}, []string{"worker", "cause"})).(*prometheus.CounterVec),
		KVResyncFailures: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:kv_resync_failures_total",
			Help: "KV snapshots that failed, per worker (retried with backoff; the worker's overlap is unknown meanwhile)."}, []string{"worker"})).(*prometheus.CounterVec),
		KVDrift: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:kv_index_drift_total",
			Help: "Consistency checks that found the index's block count for a worker off its reported cache size, per worker."}, []string{"worker"})).(*prometheus.CounterVec),
		KVStale: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:kv_stale_total",
			Help: "Times a worker was marked stale: load but no KV events for longer than expected (its overlap then counts as unknown), per worker."}, []string{"worker"})).(*prometheus.CounterVec),
		KVEventsDropped: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:kv_events_dropped_total",
			Help: "KV events dropped because a resynchronisation's backlog was full (the snapshot covers them), per worker."}, []string{"worker"})).(*prometheus.CounterVec),
		WorkerMessages: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_router:worker_messages_total",
			Help: "Load reports and KV event batches received from workers, by kind (report, events) and way (stream: Worker.Publish; call: Router.Heartbeat, Router.Events)."}, []string{"kind", "via"})).(*prometheus.CounterVec),
		IndexEntries:      prometheus.NewDesc("tandem_router:index_entries", "(worker, block) entries in the KV index, per model.", []string{"model"}, nil),
		IndexBytes:        prometheus.NewDesc("tandem_router:index_bytes", "Memory of the KV index's tables, per model.", []string{"model"}, nil),
		StaleWorkers:      prometheus.NewDesc("tandem_router:kv_stale_workers", "Workers whose KV events are missing (overlap unknown), per model.", []string{"model"}, nil),
		KVIndexGapWorkers: prometheus.NewDesc("tandem_router:kv_resyncing_workers", "Workers whose index entries are being resynchronised, per model.", []string{"model"}, nil),
		WorkerLoad: prometheus.NewDesc("tandem_router:worker_load", "Predicted load per worker, by quantity.",
			[]string{"worker", "model", "quantity"}, nil),
		QueueDepth:  prometheus.NewDesc("tandem_router:queue_depth", "Requests waiting for a worker that is not busy.", nil, nil),
		IndexBlocks: prometheus.NewDesc("tandem_router:index_blocks", "Distinct block hashes in the KV index, per model.", []string{"model"}, nil),
		WorkerStartup: prometheus.NewDesc("tandem_router:worker_startup_seconds",
			"Each worker's start-up time by phase, as it reported it (weights: where its weights came from: file, pack-cache, peer).",
			[]string{"worker", "model", "weights", "phase"}, nil),
	}
}
