// Package openai serves the OpenAI-compatible HTTP API (chat, completions, models, tokenize,
// with structured outputs, tool calls and reasoning) over a token-level Backend: the engine
// in process, or the router over RPC.
package openai

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"tandem/httpserve"
	"tandem/llm"
	"tandem/metrics"
	"tandem/tokenizer"
)

// Backend produces tokens for a request: the engine in process, the router over RPC.
//
// The handler passes a context that lives as long as the request and calls
// Generate once per choice (n choices per prompt), then reads every stream
// from its own goroutine. Stream.Next must return when its context is done;
// Close may be called while Next is blocked (a stop string or a client that
// went away) and must make the backend free the sequence at once. Errors
// wrapping llm.ErrInvalid, ErrPromptTooLong (400), ErrQueueFull (429) and
// ErrUnavailable (503) reach the client as such; any other is a 500.
type Backend interface {
	Generate(ctx context.Context, req *llm.Request) (llm.Stream, error)
}

// WorkerStream is an optional interface of an llm.Stream: the name of the
// worker that serves it. The handler sends it as the X-Tandem-Worker header.
type WorkerStream interface {
	Worker() string
}

// WorkerHeader is the response header that names the worker(s) serving a request.
const WorkerHeader = "X-Tandem-Worker"

// Model is one served model.
type Model struct {
	ID         string // the served model name
	Tokenizer  *tokenizer.Tokenizer
	ContextLen int // 0: unknown, the backend alone checks lengths
	Created    int64
	OwnedBy    string
	Backend    Backend
	// ChatTemplate, if set, replaces the tokenizer's own chat template.
	ChatTemplate string
	// ToolCallParser names the format the model writes tool calls in (ToolCallParsers):
	// "" or "auto" chooses it from the chat template, "none" turns tool calling off.
	ToolCallParser string
	// ReasoningParser (ReasoningParsers): "" or "auto" splits a <think> block off the
	// answer when the chat template writes one, "think" always, "none" never.
	ReasoningParser string
	// NoConstraints says the backend cannot follow grammars (a router whose workers
	// predate constrained decoding): requests that need one are refused.
	NoConstraints bool
	// NoTokenControls says the backend predates min_tokens, allowed_token_ids, prompt
	// logprobs and embeddings (a router whose workers do): requests that need them are
	// refused rather than answered as if they were absent.
	NoTokenControls bool
	// Pooling is how /v1/embeddings pools the model's hidden states (llm.Poolings);
	// "" is last-token pooling.
	Pooling llm.Pooling
	// Adapters, if set, is the backend's LoRA adapters (lora.go): a request's model field
	// may name one, /v1/models lists them with this model as their parent.
	Adapters AdapterServer

	fallbackLogged atomic.Bool // a template fallback was logged once
	adapter        string      // set on the model an adapter makes (underAdapter)
	parent         *Model
}

// template is the model's chat template ("" when it has none).
func (m *Model) template() string {
	if m.ChatTemplate != "" {
		return m.ChatTemplate
	}
	return m.Tokenizer.ChatTemplate()
}

// toolFormat is the tool-call format of the model's output (nil: none).
func (m *Model) toolFormat() *toolFormat { return toolFormatFor(m.ToolCallParser, m.template()) }

// thinks reports whether the model's output begins with reasoning to split off.
func (m *Model) thinks() bool {
	switch m.ReasoningParser {
	case "think":
		return true
	case "none":
		return false
	}
	return templateThinks(m.template())
}

// Options configures NewHandler.
type Options struct {
	MaxBodyBytes int64 // default 32 MiB; larger bodies → 413
	// APIKey, if set, is required ("Authorization: Bearer KEY") on every path the
	// handler serves: /v1/..., /tokenize and /detokenize.
	APIKey  string
	Logger  *slog.Logger  // default slog.Default(); one line per request
	Metrics *metrics.HTTP // refusals and cut streams; nil counts nothing
	// Responses keeps the Responses API's stored responses (store, previous_response_id,
	// GET and DELETE /v1/responses/{id}); nil: requests that would store one are refused.
	Responses ResponseStore
	// RuntimeLoRA serves vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter
	// (they read files named by the client: off unless the operator allows it).
	RuntimeLoRA bool
	// StreamInterval, above 1, writes a stream's events that many tokens at a time (one
	// write and flush), the first token's at once and the last with the end, as vLLM's
	// and SGLang's --stream-interval: fewer writes for a little latency. Every event is
	// still sent, as it would be one at a time.
	StreamInterval int
}

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 32 << 20

// Limits on a request's shape.
const (
	MaxN       = 16  // choices per prompt
	MaxChoices = 128 // choices per request, over all prompts
)

type handler struct {
	models  []*Model
	byID    map[string]*Model
	maxBody int64
	apiKey  string
	log     *slog.Logger
	met     *metrics.HTTP
	mem     memoryReturn
	bodies  bodyBuffers
	store   ResponseStore
	loraAPI bool

	streamInterval int
}

// NewHandler returns the API's HTTP handler for models. Routes:
//
//	POST /v1/chat/completions
//	POST /v1/completions
//	POST /v1/embeddings
//	POST /v1/responses; GET, DELETE /v1/responses/{id}; GET /v1/responses/{id}/input_items
//	POST /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API)
//	GET  /v1/models, /v1/models/{id}
//	POST /tokenize, /detokenize (vLLM's shapes)
//
// Rules where the OpenAI API leaves room:
//
//   - A request without "model" gets the only model when exactly one is
//     served (vLLM requires the field).
//   - Chat prompts are the model's chat template (Model.ChatTemplate, else
//     the tokenizer's; none → 400) rendered with add_generation_prompt, then
//     encoded with special tokens parsed. BOS is added unless the rendered
//     text already begins with the BOS token's text (a template that writes
//     {{ bos_token }}), so there is never a double BOS; an explicit
//     add_special_tokens overrides the rule. Completion strings are encoded
//     with BOS (add_special_tokens, default true) and special tokens parsed;
//     token-id prompts are used as given.
//   - Output text continues the prompt: prompt text + completion text reads
//     as one text (a word-initial space on the first token is kept, as vLLM
//     and llama.cpp keep it). End-of-generation and stop_token_ids tokens
//     give no text but count in usage and appear in logprobs.
//   - Stop strings end a choice at their first occurrence; the text from it
//     on is dropped (kept with include_stop_str_in_output) and the stream is
//     closed at once. Usage counts every token generated up to that point.
//   - With a seed, choice i of each prompt uses seed+i; choice indexes run
//     prompt_index*n + i. Without temperature, 1 (OpenAI's default); top_p 0
//     means greedy.
//   - Structured outputs (response_format, guided_*, structured_outputs) and
//     forced or strict tool calls constrain the output with a grammar
//     (llm.Constraint); tool calls and reasoning are parsed out of the text in the
//     model's format (docs/structured-outputs.md).
//   - Fields that change the output and are not implemented (non-text content
//     parts, suffix, best_of other than n, prompt_logprobs, min_tokens, …) are
//     refused with a 400 naming the field; unknown fields are ignored.
//
// It panics if a model is nil, lacks an ID, Tokenizer or Backend, or two
// models share an ID: those are wiring mistakes.
func NewHandler(models []*Model, opts Options) http.Handler {
	h := &handler{byID: map[string]*Model{}, maxBody: opts.MaxBodyBytes, apiKey: opts.APIKey, log: opts.Logger, met: opts.Metrics, store: opts.Responses, loraAPI: opts.RuntimeLoRA,
		streamInterval: opts.StreamInterval}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	for _, m := range models {
		switch {
		case m == nil || m.ID == "" || m.Tokenizer == nil || m.Backend == nil:
			panic("openai: a model needs an ID, a Tokenizer and a Backend")
		case h.byID[m.ID] != nil:
			panic(fmt.Sprintf("openai: model %q listed twice", m.ID))
		case m.ToolCallParser != "" && !slices.Contains(ToolCallParsers, m.ToolCallParser):
			panic(fmt.Sprintf("openai: model %q: unknown tool-call parser %q", m.ID, m.ToolCallParser))
		case m.ReasoningParser != "" && !slices.Contains(ReasoningParsers, m.ReasoningParser):
			panic(fmt.Sprintf("openai: model %q: unknown reasoning parser %q", m.ID, m.ReasoningParser))
		}
		h.byID[m.ID] = m
		h.models = append(h.models, m)
	}
	return h
}

// reqInfo collects what the request's log line reports.
type reqInfo struct {
	model            string
	promptTokens     int
	completionTokens int
}

// statusWriter records the status written, for the log line.
type statusWriter struct {
	http.ResponseWriter
	status    int
	anthropic bool // errors in Anthropic's shape (/v1/messages)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (h *handler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := &statusWriter{ResponseWriter: rw}
	info := &reqInfo{}
	defer func() {
		status := w.status
		if status == 0 {
			status = 499 // the client went away before anything was written
		}
		attrs := []any{
			"method", r.Method, "path", r.URL.Path, "model", info.model, "status", status,
			"prompt_tokens", info.promptTokens, "completion_tokens", info.completionTokens,
			"duration", time.Since(start),
		}
		if wk := w.Header().Get(WorkerHeader); wk != "" {
			attrs = append(attrs, "worker", wk)
		}
		if id := w.Header().Get(RequestIDHeader); id != "" {
			attrs = append(attrs, "request_id", id)
		}
		h.log.Info("http request", attrs...)
	}()

	path := r.URL.Path
	defer h.mem.after(r.ContentLength)
	if w.Header().Get(RequestIDHeader) == "" { // served without httpserve (tests, embedders)
		w.Header().Set(RequestIDHeader, httpserve.RequestID(r))
	}
	w.anthropic = path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
	if h.apiKey != "" && !h.authorized(r) {
		h.refused("unauthorized")
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeError(w, &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			msg: "Invalid or missing API key: send \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"."})
		return
	}
	var fn func(http.ResponseWriter, *http.Request, *reqInfo)
	methods := []string{http.MethodPost}
	get := []string{http.MethodGet}
	switch {
	case path == "/v1/chat/completions":
		fn = h.chatCompletions
	case path == "/v1/completions":
		fn = h.completions
	case path == "/v1/embeddings":
		fn = h.embeddings
	case path == "/v1/responses":
		fn = h.responses
	case strings.HasPrefix(path, "/v1/responses/") && strings.HasSuffix(path, "/input_items"):
		fn, methods = h.responseInputItems, get
	case strings.HasPrefix(path, "/v1/responses/") && len(path) > len("/v1/responses/"):
		fn, methods = h.storedResponse, []string{http.MethodGet, http.MethodDelete}
	case path == "/v1/messages":
		fn = h.messages
	case path == "/v1/messages/count_tokens":
		fn = h.countTokens
	case path == "/v1/models":
		fn, methods = h.listModels, get
	case strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/"):
		fn, methods = h.getModel, get
	case path == "/v1/load_lora_adapter" && h.loraAPI:
		fn = h.loadAdapter
	case path == "/v1/unload_lora_adapter" && h.loraAPI:
		fn = h.unloadAdapter
	case path == "/tokenize":
		fn = h.tokenize
	case path == "/detokenize":
		fn = h.detokenize
	default:
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found",
			msg: fmt.Sprintf("Unknown path %s %s.", r.Method, path)})
		return
	}
	if !slices.Contains(methods, r.Method) && !(methods[0] == http.MethodGet && r.Method == http.MethodHead) {
		allow := strings.Join(methods, ", ")
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
			msg: fmt.Sprintf("Method %s is not allowed for %s; use %s.", r.Method, path, allow)})
		return
	}
	fn(w, r, info)
}

// RequestIDHeader is the response header that names a request (httpserve sets it,
// echoing the client's); the request's log line carries it.
const RequestIDHeader = httpserve.RequestIDHeader

// templateFallback counts the parts of a chat request (tools, tool_calls) the model's
// chat template does not write, which the server wrote into the messages itself, and
// logs the first time a model needs it.
func (h *handler) templateFallback(m *Model, fell []string) {
	if len(fell) == 0 {
		return
	}
	if m.parent != nil {
		m = m.parent // an adapter's requests log under its base model's flag
	}
	if h.met != nil {
		for _, what := range fell {
			h.met.TemplateFallbacks.WithLabelValues(what).Inc()
		}
	}
	if m.fallbackLogged.CompareAndSwap(false, true) {
		h.log.Warn("the chat template does not write tools or tool calls; the server writes them into the messages in the model's tool-call format",
			"model", m.ID, "missing", strings.Join(fell, ","), "format", m.toolFormat().name)
	}
}

// refused counts a request refused before any work.
func (h *handler) refused(reason string) {
	if h.met != nil {
		h.met.Refused.WithLabelValues(reason).Inc()
	}
}

// authorized checks the API key: "Authorization: Bearer KEY" (OpenAI's clients) or
// "x-api-key: KEY" (Anthropic's).
func (h *handler) authorized(r *http.Request) bool {
	if key := r.Header.Get("X-Api-Key"); key != "" {
		return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(key)), []byte(h.apiKey)) == 1
	}
	auth := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(auth) < len(prefix) || !strings.EqualFold(auth[:len(prefix)], prefix) {
		return false
	}
	key := strings.TrimSpace(auth[len(prefix):])
	return subtle.ConstantTimeCompare([]byte(key), []byte(h.apiKey)) == 1
}

// model resolves a request's model name. An empty name means the only
// model when exactly one is served (vLLM requires the name; we are lenient).
// resolve finds the request's model and records it for the log line: the
// name as asked until it resolves, then the model's ID.
func (h *handler) resolve(name string, info *reqInfo) (*Model, *apiError) {
	info.model = name
	m, aerr := h.model(name)
	if aerr != nil {
		return nil, aerr
	}
	info.model = m.ID
	return m, nil
}

func (h *handler) model(name string) (*Model, *apiError) {
	if len(h.models) == 0 {
		// A router before its first worker joined: nothing is wrong with the name yet.
		return nil, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_model", retryAfter: "5",
			msg: "No model is served yet: no worker has joined this router. Retry once an engine has registered."}
	}
	if name == "" {
		if len(h.models) == 1 {
			return h.models[0], nil
		}
		return nil, badRequest("model", "You must provide a model parameter.")
	}
	if m := h.byID[name]; m != nil {
		return m, nil
	}
	if m := h.adapterModel(name); m != nil {
		return m, nil
	}
	return nil, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
		msg: fmt.Sprintf("The model `%s` does not exist.", name)}
}

type modelObject struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	// A LoRA adapter's: where it was loaded from and its base model (vLLM's fields).
	Root   string `json:"root,omitempty"`
	Parent string `json:"parent,omitempty"`
}

func (m *Model) object() modelObject {
	owner := m.OwnedBy
	if owner == "" {
		owner = "tandem"
	}
	return modelObject{ID: m.ID, Object: "model", Created: m.Created, OwnedBy: owner, MaxModelLen: m.ContextLen}
}

func (h *handler) listModels(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	list := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, m := range h.models {
		list.Data = append(list.Data, m.object())
		list.Data = append(list.Data, m.adapterObjects()...)
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *handler) getModel(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	info.model = id
	if len(h.models) == 0 {
		_, aerr := h.model(id)
		writeError(w, aerr)
		return
	}
	m := h.byID[id]
	if a := h.adapterModel(id); m == nil && a != nil {
		for _, o := range a.parent.adapterObjects() {
			if o.ID == id {
				writeJSON(w, http.StatusOK, o)
				return
			}
		}
	}
	if m == nil {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("The model `%s` does not exist.", id)})
		return
	}
	writeJSON(w, http.StatusOK, m.object())
}
