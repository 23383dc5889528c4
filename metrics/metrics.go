// Package metrics defines Tandem's Prometheus metrics in one place: names,
// help, buckets and labels, named like vLLM's under a "tandem:" prefix.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Engine holds one engine's metrics for one served model.
type Engine struct {
	Running          prometheus.Gauge
	Waiting          prometheus.Gauge
	KVUsage          prometheus.Gauge
	PrefixQueries    prometheus.Counter
	PrefixHits       prometheus.Counter
	Preemptions      prometheus.Counter
	PromptTokens     prometheus.Counter
	GenerationTokens prometheus.Counter
	RequestSuccess   *prometheus.CounterVec // label finished_reason
	TTFT             prometheus.Observer
	ITL              prometheus.Observer
	E2E              prometheus.Observer
	QueueTime        prometheus.Observer
	PrefillTime      prometheus.Observer
	DecodeTime       prometheus.Observer
	RequestPrompt    prometheus.Observer
	RequestGenerated prometheus.Observer
	IterationTokens  prometheus.Observer
	// StepPrefillTokens and StepDecodeTokens split each step's tokens into prompt tokens
	// (prefill chunks, recomputation after a preemption) and decode tokens (one per
	// sequence generating its next token): the batch's composition.
	StepPrefillTokens prometheus.Observer
	StepDecodeTokens  prometheus.Observer
	// ConstraintFailures counts constrained sequences ended with an error because their
	// grammar allowed no token of the vocabulary (a grammar the vocabulary cannot spell).
	ConstraintFailures prometheus.Counter
	// vLLM's older names, which its stock Grafana dashboard reads (see vllm.go):
	// TPOT is observed with ITL, GPUCacheUsage set with KVUsage; InferenceTime is the
	// time from a sequence's first step to its end (prefill and decode).
	TPOT            prometheus.Observer
	GPUCacheUsage   prometheus.Gauge
	InferenceTime   prometheus.Observer
	StepsOverTarget prometheus.Counter // engine steps with decode tokens predicted past the ITL target
	// StepCostFactor is the live correction of the step cost profile, for prefill-only,
	// decode-only and mixed steps (label steps), as sched.LiveCost.Correction gives them.
	StepCostFactor [3]prometheus.Gauge
	// StepCostProfile is 1 for the source of the step cost profile the ITL target starts
	// from (label source: file, sim, measured, or builtin when a quick profile could not be
	// fitted and the built-in CPU profile stands in); none without a target.
	StepCostProfile *prometheus.GaugeVec

	// LoRA adapters: registered (loaded by --lora or the run-time API) and resident
	// (their weights in memory; the least recently used past the budget are evicted and
	// read again from their files when next asked for); loads by result and their time;
	// requests by adapter.
	LoRARegistered  prometheus.Gauge
	LoRAResident    prometheus.Gauge
	LoRALoads       *prometheus.CounterVec // label result: ok, error
	LoRALoadSeconds prometheus.Observer
	LoRAEvictions   prometheus.Counter
	LoRARequests    *prometheus.CounterVec // label lora_name
	// Speculative decoding (vLLM's names): verification steps of a drafting sequence,
	// tokens drafted and accepted, and accepted/drafted since start.
	SpecDrafts         prometheus.Counter
	SpecDraftTokens    prometheus.Counter
	SpecAcceptedTokens prometheus.Counter
	SpecAcceptanceRate prometheus.Gauge
	// SpecDraftFailures counts the draft model's failed forward passes: those steps
	// decoded without drafts.
	SpecDraftFailures prometheus.Counter
}

var (
	latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	tokenBuckets   = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}
	// A step often has no prefill tokens, or no decode tokens: 0 gets a bucket of its own.
	stepTokenBuckets = append([]float64{0}, tokenBuckets...)
)

// NewEngine registers an engine's metrics for model on reg.
func NewEngine(reg prometheus.Registerer, model string) *Engine {
	labels := prometheus.Labels{"model_name": model}
	f := factory{reg: reg, labels: labels}
	e := &Engine{
		Running:          f.gauge("tandem:num_requests_running", "Number of requests in model execution batches."),
		Waiting:          f.gauge("tandem:num_requests_waiting", "Number of requests waiting to be processed."),
		KVUsage:          f.gauge("tandem:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		PrefixQueries:    f.counter("tandem:prefix_cache_queries_total", "Prefix cache queries, in number of queried tokens."),
		PrefixHits:       f.counter("tandem:prefix_cache_hits_total", "Prefix cache hits, in number of cached tokens."),
		Preemptions:      f.counter("tandem:num_preemptions_total", "Cumulative number of preemptions."),
		PromptTokens:     f.counter("tandem:prompt_tokens_total", "Number of prefill tokens processed."),
		GenerationTokens: f.counter("tandem:generation_tokens_total", "Number of generation tokens processed."),
		RequestSuccess: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{"finished_reason"})).(*prometheus.CounterVec),
		TTFT:              f.histogram("tandem:time_to_first_token_seconds", "Histogram of time to first token in seconds.", latencyBuckets),
		ITL:               f.histogram("tandem:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", latencyBuckets),
		E2E:               f.histogram("tandem:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", latencyBuckets),
		QueueTime:         f.histogram("tandem:request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.", latencyBuckets),
		PrefillTime:       f.histogram("tandem:request_prefill_time_seconds", "Histogram of time spent in prefill in seconds.", latencyBuckets),
		DecodeTime:        f.histogram("tandem:request_decode_time_seconds", "Histogram of time spent in decode in seconds.", latencyBuckets),
		RequestPrompt:     f.histogram("tandem:request_prompt_tokens", "Number of prefill tokens per request.", tokenBuckets),
		RequestGenerated:  f.histogram("tandem:request_generation_tokens", "Number of generation tokens per request.", tokenBuckets),
		IterationTokens:   f.histogram("tandem:iteration_tokens_total", "Histogram of number of tokens per engine step.", tokenBuckets),
		StepPrefillTokens: f.histogram("tandem:iteration_prefill_tokens", "Histogram of prompt (prefill) tokens per engine step.", stepTokenBuckets),
		StepDecodeTokens: f.histogram("tandem:iteration_decode_tokens",
			"Histogram of decode tokens (one per sequence generating its next token) per engine step.", stepTokenBuckets),
		ConstraintFailures: f.counter("tandem:constrained_generation_failures_total",
			"Constrained sequences ended with an error because their grammar allowed no token of the vocabulary."),
		TPOT:            f.histogram("tandem:time_per_output_token_seconds", "Histogram of time per output token in seconds (the inter-token latency).", latencyBuckets),
		GPUCacheUsage:   f.gauge("tandem:gpu_cache_usage_perc", "KV-cache usage (vLLM's older name of kv_cache_usage_perc). 1 means 100 percent usage."),
		InferenceTime:   f.histogram("tandem:request_inference_time_seconds", "Histogram of time spent in prefill and decode in seconds.", latencyBuckets),
		StepsOverTarget: f.counter("tandem:steps_over_itl_target_total", "Engine steps carrying decode tokens whose predicted time exceeded the inter-token latency target: too many streams for the target."),

		LoRARegistered: f.gauge("tandem:lora_adapters_registered", "LoRA adapters that requests may name (loaded at start or at run time)."),
		LoRAResident:   f.gauge("tandem:lora_adapters_resident", "LoRA adapters whose weights are in memory."),
		LoRALoads: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:lora_loads_total", Help: "LoRA adapter loads (first loads and reloads after an eviction) by result.", ConstLabels: labels,
		}, []string{"result"})).(*prometheus.CounterVec),
		LoRALoadSeconds: f.histogram("tandem:lora_load_seconds", "Histogram of LoRA adapter load times in seconds.", latencyBuckets),
		LoRAEvictions:   f.counter("tandem:lora_evictions_total", "LoRA adapters evicted from memory past the resident budget (least recently used first)."),
		LoRARequests: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:lora_requests_total", Help: "Requests served with a LoRA adapter, by adapter.", ConstLabels: labels,
		}, []string{"lora_name"})).(*prometheus.CounterVec),
		SpecDrafts:         f.counter("tandem:spec_decode_num_drafts_total", "Speculative decoding: verification steps of drafting sequences."),
		SpecDraftTokens:    f.counter("tandem:spec_decode_num_draft_tokens_total", "Speculative decoding: tokens drafted."),
		SpecAcceptedTokens: f.counter("tandem:spec_decode_num_accepted_tokens_total", "Speculative decoding: drafted tokens the target model accepted."),
		SpecAcceptanceRate: f.gauge("tandem:spec_decode_draft_acceptance_rate", "Speculative decoding: accepted / drafted tokens since start."),
		SpecDraftFailures:  f.counter("tandem:spec_decode_draft_failures_total", "Speculative decoding: failed forward passes of the draft model (those steps decoded without drafts)."),
	}
	cost := f.register(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tandem:step_cost_correction", ConstLabels: labels,
		Help: "The engine's live correction of its step cost profile: the factor for prefill-only and decode-only steps, and for a mixed step the fitted prompt part of a 64-token chunk over the profile's prefill prediction; 1 until corrected.",
	}, []string{"steps"})).(*prometheus.GaugeVec)
	for i, kind := range []string{"prefill", "decode", "mixed"} {
		e.StepCostFactor[i] = cost.WithLabelValues(kind)
	}
	e.StepCostProfile = f.register(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tandem:step_cost_profile", ConstLabels: labels,
		Help: "1 for where the step cost profile the ITL target starts from came from: file (--step-profile), sim (the sim backend's timing), measured (a quick profile at start), builtin (the built-in CPU profile: the quick profile could not be fitted).",
	}, []string{"source"})).(*prometheus.GaugeVec)
	return e
}

type factory struct {
	reg    prometheus.Registerer
	labels prometheus.Labels
}

func (f factory) register(c prometheus.Collector) prometheus.Collector {
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	return f.register(prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: f.labels})).(prometheus.Gauge)
}

func (f factory) counter(name, help string) prometheus.Counter {
	return f.register(prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: f.labels})).(prometheus.Counter)
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Observer {
	return f.register(prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: f.labels})).(prometheus.Histogram)
}

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg in the Prometheus text format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}
