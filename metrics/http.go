package metrics

import "github.com/prometheus/client_golang/prometheus"

// HTTP holds the API server's own refusals and cuts, the ones no engine or router
// metric sees: requests refused before they reached a model, and streams the server
// ended early.
type HTTP struct {
	// Refused counts requests answered with an error before any work, by reason:
	// unauthorized, body_too_large, body_timeout, unsupported_media_type.
	Refused *prometheus.CounterVec
	// Cut counts responses the server ended early at its drain deadline (streams get an
	// error event first).
	Cut prometheus.Counter
	// TemplateFallbacks counts chat requests with tools or tool calls that the model's
	// chat template does not write, which the server wrote into the messages itself, by
	// what (tools, tool_calls).
	TemplateFallbacks *prometheus.CounterVec
	// ToolCallsUnparsed counts tool calls a model began that did not parse; a response
	// that is not streamed returns their text as content.
	ToolCallsUnparsed prometheus.Counter
	// Request-level metrics that only the API layer sees (it knows n and max_tokens,
	// which reach an engine one choice at a time), by model_name: vLLM's
	// request_params_n, request_params_max_tokens (the context left when absent) and
	// request_max_num_generation_tokens (the most tokens a request's choices generated).
	ParamsN          *prometheus.HistogramVec
	ParamsMaxTokens  *prometheus.HistogramVec
	MaxNumGeneration *prometheus.HistogramVec
}

// NewHTTP registers the HTTP metrics on reg under prefix ("tandem" for the engine,
// "tandem_router" for the router).
func NewHTTP(reg prometheus.Registerer, prefix string) *HTTP {
	f := factory{reg: reg}
	return &HTTP{
		Refused: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + ":http_requests_refused_total",
			Help: "HTTP requests refused before any work, by reason (unauthorized, body_too_large, body_timeout, unsupported_media_type)."},
			[]string{"reason"})).(*prometheus.CounterVec),
		Cut: f.counter(prefix+":http_responses_cut_total", "HTTP responses (streams) the server ended early because its drain deadline passed."),
		TemplateFallbacks: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + ":chat_template_fallbacks_total",
			Help: "Chat requests whose tools or tool calls the chat template does not write, written into the messages by the server instead, by what (tools, tool_calls)."},
			[]string{"what"})).(*prometheus.CounterVec),
		ToolCallsUnparsed: f.counter(prefix+":tool_calls_unparsed_total", "Tool calls a model began that did not parse (returned as content when not streamed)."),
		ParamsN:           f.histogramVec(prefix+":request_params_n", "Histogram of the n request parameter.", nBuckets),
		ParamsMaxTokens:   f.histogramVec(prefix+":request_params_max_tokens", "Histogram of the max_tokens request parameter (the context left when absent).", tokenBuckets),
		MaxNumGeneration:  f.histogramVec(prefix+":request_max_num_generation_tokens", "Histogram of the most tokens a request's choices generated.", tokenBuckets),
	}
}

func (f factory) histogramVec(name, help string, buckets []float64) *prometheus.HistogramVec {
	return f.register(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{"model_name"})).(*prometheus.HistogramVec)
}
