package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"tandem/llm"
	"tandem/tokenizer"
)

// samplingFields are the request fields chat and completions share.
type samplingFields struct {
	N                 *int64             `json:"n"`
	Stream            bool               `json:"stream"`
	StreamOptions     *streamOptions     `json:"stream_options"`
	Stop              json.RawMessage    `json:"stop"`
	StopTokenIDs      []int64            `json:"stop_token_ids"`
	IncludeStopStr    bool               `json:"include_stop_str_in_output"`
	MaxTokens         *int64             `json:"max_tokens"`
	Temperature       *float64           `json:"temperature"`
	TopP              *float64           `json:"top_p"`
	TopK              *int64             `json:"top_k"`
	MinP              *float64           `json:"min_p"`
	PresencePenalty   *float64           `json:"presence_penalty"`
	FrequencyPenalty  *float64           `json:"frequency_penalty"`
	RepetitionPenalty *float64           `json:"repetition_penalty"`
	Seed              *int64             `json:"seed"`
	LogitBias         map[string]float64 `json:"logit_bias"`
	IgnoreEOS         bool               `json:"ignore_eos"`
	User              string             `json:"user"`
	Priority          int64              `json:"priority"`
	AddSpecialTokens  *bool              `json:"add_special_tokens"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type chatRequest struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
	samplingFields
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int64          `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

type completionRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	samplingFields
	Logprobs *int64  `json:"logprobs"`
	Echo     bool    `json:"echo"`
	Suffix   *string `json:"suffix"`
	BestOf   *int64  `json:"best_of"`
}

// job is a validated request, ready to generate.
type job struct {
	m            *Model
	chat         bool
	id           string
	created      int64
	prompts      [][]int32
	n            int
	req          llm.Request // the template of every choice's request
	stops        []string
	includeStop  bool
	stopTokens   map[int32]bool
	stream       bool
	includeUsage bool
	logprobs     bool
	maxTokens    int // as asked; 0 when absent
	maxParam     string
	spacePrefix  bool // the tokenizer adds a space before text (SPM); see step
}

// addsSpacePrefix reports whether t encodes text with a leading space added
// (SentencePiece's add_dummy_prefix), whose decoders drop the first space.
func addsSpacePrefix(t *tokenizer.Tokenizer) bool {
	var b []byte
	for _, id := range t.Encode("a", false, false) {
		b = append(b, t.Piece(id)...)
	}
	return len(b) > 0 && b[0] == ' '
}

func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// SessionHeader carries a session id: a router keeps the requests of one session on one
// worker. Without it, the body's "user" field is the session.
const SessionHeader = "X-Session-Id"

func session(r *http.Request, user string) string {
	if sid := r.Header.Get(SessionHeader); sid != "" {
		return sid
	}
	return user
}

// newJob validates the fields chat and completions share.
func newJob(m *Model, f *samplingFields, chat bool, maxTokens *int64, maxParam string) (*job, *apiError) {
	j := &job{m: m, chat: chat, created: time.Now().Unix(), stream: f.Stream, includeStop: f.IncludeStopStr, maxParam: maxParam}
	if chat {
		j.id = newID("chatcmpl-")
	} else {
		j.id = newID("cmpl-")
	}
	j.includeUsage = f.Stream && f.StreamOptions != nil && f.StreamOptions.IncludeUsage
	j.spacePrefix = addsSpacePrefix(m.Tokenizer)
	vocab := m.Tokenizer.VocabSize()

	j.n = 1
	if f.N != nil {
		if *f.N < 1 || *f.N > MaxN {
			return nil, badRequest("n", "n must be between 1 and %d, got %d.", MaxN, *f.N)
		}
		j.n = int(*f.N)
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return nil, badRequest(maxParam, "%s must be at least 1, got %d.", maxParam, *maxTokens)
		}
		j.maxTokens = int(min(*maxTokens, math.MaxInt32))
	}

	// Stop strings: a string or a list of strings; empty strings are ignored.
	if !isNull(f.Stop) {
		var one string
		var list []string
		if err := json.Unmarshal(f.Stop, &one); err == nil {
			list = []string{one}
		} else if err := json.Unmarshal(f.Stop, &list); err != nil {
			return nil, badRequest("stop", "stop must be a string or a list of strings.")
		}
		for _, s := range list {
			if s != "" {
				j.stops = append(j.stops, s)
			}
		}
	}
	j.stopTokens = map[int32]bool{}
	for _, id := range f.StopTokenIDs {
		if id < 0 || id >= int64(vocab) {
			return nil, badRequest("stop_token_ids", "stop_token_ids: token id %d is outside the vocabulary [0, %d).", id, vocab)
		}
		j.stopTokens[int32(id)] = true
		j.req.StopTokens = append(j.req.StopTokens, int32(id))
	}

	// Sampling. OpenAI's default temperature is 1; top_p 0 means greedy.
	sp := llm.SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
	if f.Temperature != nil {
		sp.Temperature = float32(*f.Temperature)
	}
	if f.TopP != nil {
		if *f.TopP == 0 {
			sp.Temperature = 0
		} else {
			sp.TopP = float32(*f.TopP)
		}
	}
	if f.TopK != nil {
		sp.TopK = int(max(min(*f.TopK, math.MaxInt32), math.MinInt32))
	}
	if f.MinP != nil {
		sp.MinP = float32(*f.MinP)
	}
	if f.PresencePenalty != nil {
		sp.PresencePenalty = float32(*f.PresencePenalty)
	}
	if f.FrequencyPenalty != nil {
		sp.FrequencyPenalty = float32(*f.FrequencyPenalty)
	}
	if f.RepetitionPenalty != nil {
		sp.RepetitionPenalty = float32(*f.RepetitionPenalty)
	}
	if f.Seed != nil {
		sp.Seed, sp.HasSeed = uint64(*f.Seed), true
	}
	if len(f.LogitBias) > 0 {
		sp.LogitBias = make(map[int32]float32, len(f.LogitBias))
		for k, v := range f.LogitBias {
			id, err := strconv.ParseInt(strings.TrimSpace(k), 10, 32)
			if err != nil {
				return nil, badRequest("logit_bias", "logit_bias keys must be token ids, got %q.", k)
			}
			sp.LogitBias[int32(id)] = float32(v)
		}
	}
	j.req.Sampling = sp
	j.req.IgnoreEOS = f.IgnoreEOS
	j.req.Priority = int(max(min(f.Priority, math.MaxInt32), math.MinInt32))
	j.req.MaxTokens = j.maxTokens
	j.req.Model = m.ID
	return j, nil
}

// validateSampling runs llm.SamplingParams.Validate and names the field.
func (j *job) validateSampling(topLogprobsParam string) *apiError {
	err := j.req.Sampling.Validate(j.m.Tokenizer.VocabSize())
	if err == nil {
		return nil
	}
	msg := strings.TrimPrefix(err.Error(), "sampling: ")
	param, _, _ := strings.Cut(msg, " ")
	switch param {
	case "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias":
	case "top_logprobs":
		param = topLogprobsParam
		msg = topLogprobsParam + strings.TrimPrefix(msg, "top_logprobs")
	default:
		return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "Internal error: " + err.Error()}
	}
	return badRequest(param, "%s.", msg)
}

// encodeText encodes a rendered prompt or plain text. add is the request's
// add_special_tokens, or nil for the default rule. With limit > 0 it stops as soon as
// the text is known to encode to more than limit tokens and reports false, so that a
// prompt far longer than the context costs no more work than one that fits.
func encodeText(t *tokenizer.Tokenizer, text string, add *bool, chat bool, limit int) ([]int32, bool) {
	addSpecial := true
	switch {
	case add != nil:
		addSpecial = *add
	case chat:
		// A template that writes the BOS text itself ({{ bos_token }}) gets it
		// parsed as the BOS token; adding one more would double it.
		if bos := t.TokenText(t.BOS()); bos != "" && strings.HasPrefix(text, bos) {
			addSpecial = false
		}
	}
	return t.EncodeLimit(text, addSpecial, true, limit)
}

// tooLong is the answer to a prompt that encodes to more than the context holds.
func (m *Model) tooLong(what string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: what, code: "context_length_exceeded",
		msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, the %s more than %d tokens. Please reduce the length of the %s.",
			m.ContextLen, map[string]string{"prompt": "prompt encodes to", "messages": "messages encode to"}[what], m.ContextLen, what)}
}

// chatMessages converts the request's messages to the template's.
func chatMessages(in []chatMessage) ([]tokenizer.Message, *apiError) {
	if len(in) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty list.")
	}
	out := make([]tokenizer.Message, 0, len(in))
	for i, msg := range in {
		param := fmt.Sprintf("messages[%d]", i)
		role := msg.Role
		switch role {
		case "system", "user", "assistant":
		case "developer":
			role = "system"
		case "tool", "function":
			return nil, badRequest(param+".role", "%s.role: %q messages are not supported: this server does not support tool calling.", param, role)
		case "":
			return nil, badRequest(param+".role", "%s.role is required.", param)
		default:
			return nil, badRequest(param+".role", "%s.role: unknown role %q (use system, developer, user or assistant).", param, role)
		}
		if !isNull(msg.ToolCalls) && strings.TrimSpace(string(msg.ToolCalls)) != "[]" {
			return nil, badRequest(param+".tool_calls", "%s.tool_calls: tool calling is not supported.", param)
		}
		text, err := messageContent(msg.Content, param+".content", role == "assistant")
		if err != nil {
			return nil, err
		}
		out = append(out, tokenizer.Message{Role: role, Content: text})
	}
	return out, nil
}

// messageContent accepts a string, a list of text parts (joined with "\n",
// as vLLM joins them), or null for assistant messages.
func messageContent(raw json.RawMessage, param string, nullOK bool) (string, *apiError) {
	if isNull(raw) {
		if nullOK {
			return "", nil
		}
		return "", badRequest(param, "%s is required.", param)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param, "%s must be a string or a list of content parts.", param)
	}
	texts := make([]string, 0, len(parts))
	for k, p := range parts {
		pp := fmt.Sprintf("%s[%d]", param, k)
		var part struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(p, &part); err != nil {
			return "", badRequest(pp, "%s must be an object {\"type\": \"text\", \"text\": ...}.", pp)
		}
		if part.Type != "text" {
			return "", badRequest(pp+".type", "%s.type: only \"text\" content parts are supported, got %q.", pp, part.Type)
		}
		if part.Text == nil {
			return "", badRequest(pp+".text", "%s.text is required.", pp)
		}
		texts = append(texts, *part.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// renderChat applies the model's chat template.
func (m *Model) renderChat(msgs []tokenizer.Message, addGenerationPrompt bool) (string, *apiError) {
	var text string
	var err error
	t := m.Tokenizer
	if m.ChatTemplate != "" {
		text, err = tokenizer.RenderChatTemplate(m.ChatTemplate, msgs, addGenerationPrompt, t.TokenText(t.BOS()), t.TokenText(t.EOS()))
	} else {
		text, err = t.ApplyChatTemplate(msgs, addGenerationPrompt)
	}
	switch {
	case errors.Is(err, tokenizer.ErrNoChatTemplate):
		return "", badRequest("messages", "The model `%s` has no chat template, so it cannot serve chat completions; use /v1/completions.", m.ID)
	case err != nil:
		return "", badRequest("messages", "The chat template cannot be applied to these messages: %v.", strings.TrimPrefix(err.Error(), "tokenizer: "))
	}
	return text, nil
}

// chatPrompt renders and encodes a chat request's messages.
// With limit > 0, messages that encode to more tokens are refused (see encodeText).
func (m *Model) chatPrompt(in []chatMessage, addGenerationPrompt, addSpecial *bool, limit int) ([]int32, *apiError) {
	msgs, aerr := chatMessages(in)
	if aerr != nil {
		return nil, aerr
	}
	agp := addGenerationPrompt == nil || *addGenerationPrompt
	text, aerr := m.renderChat(msgs, agp)
	if aerr != nil {
		return nil, aerr
	}
	ids, ok := encodeText(m.Tokenizer, text, addSpecial, true, limit)
	if !ok {
		return nil, m.tooLong("messages")
	}
	return ids, nil
}

func parseChat(h *handler, r *http.Request, w http.ResponseWriter, info *reqInfo) (*job, *apiError) {
	var req chatRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		return nil, aerr
	}
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		return nil, aerr
	}
	maxTokens, maxParam := req.MaxTokens, "max_tokens"
	if req.MaxCompletionTokens != nil {
		maxTokens, maxParam = req.MaxCompletionTokens, "max_completion_tokens"
	}
	if !isNull(req.Tools) && strings.TrimSpace(string(req.Tools)) != "[]" {
		return nil, badRequest("tools", "Tool calling is not supported by this server.")
	}
	if !isNull(req.ToolChoice) {
		var s string
		if json.Unmarshal(req.ToolChoice, &s) != nil || (s != "none" && s != "auto") {
			return nil, badRequest("tool_choice", "Tool calling is not supported by this server; tool_choice may only be \"none\" or \"auto\".")
		}
	}
	if !isNull(req.ResponseFormat) {
		var rf struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(req.ResponseFormat, &rf) != nil || rf.Type != "text" {
			return nil, badRequest("response_format", "Only response_format {\"type\": \"text\"} is supported.")
		}
	}
	j, aerr := newJob(m, &req.samplingFields, true, maxTokens, maxParam)
	if aerr != nil {
		return nil, aerr
	}
	j.req.Session = session(r, req.User)
	j.logprobs = req.Logprobs != nil && *req.Logprobs
	if req.TopLogprobs != nil {
		if *req.TopLogprobs > 0 && !j.logprobs {
			return nil, badRequest("top_logprobs", "top_logprobs requires logprobs to be true.")
		}
		j.req.Sampling.TopLogprobs = int(max(min(*req.TopLogprobs, math.MaxInt32), math.MinInt32))
	}
	j.req.Sampling.Logprobs = j.logprobs
	if aerr := j.validateSampling("top_logprobs"); aerr != nil {
		return nil, aerr
	}
	prompt, aerr := m.chatPrompt(req.Messages, req.AddGenerationPrompt, req.AddSpecialTokens, m.ContextLen)
	if aerr != nil {
		return nil, aerr
	}
	j.prompts = [][]int32{prompt}
	return j, j.checkPrompts()
}

func parseCompletion(h *handler, r *http.Request, w http.ResponseWriter, info *reqInfo) (*job, *apiError) {
	var req completionRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		return nil, aerr
	}
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		return nil, aerr
	}
	switch {
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported.")
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badRequest("suffix", "suffix is not supported.")
	}
	j, aerr := newJob(m, &req.samplingFields, false, req.MaxTokens, "max_tokens")
	if aerr != nil {
		return nil, aerr
	}
	j.req.Session = session(r, req.User)
	if req.BestOf != nil && *req.BestOf != int64(j.n) {
		return nil, badRequest("best_of", "best_of must equal n (%d) when given: choosing the best of several is not supported.", j.n)
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > llm.MaxTopLogprobs {
			return nil, badRequest("logprobs", "logprobs must be between 0 and %d, got %d.", llm.MaxTopLogprobs, *req.Logprobs)
		}
		j.logprobs = true
		j.req.Sampling.Logprobs = true
		j.req.Sampling.TopLogprobs = int(*req.Logprobs)
	}
	if aerr := j.validateSampling("logprobs"); aerr != nil {
		return nil, aerr
	}
	prompts, aerr := m.completionPrompts(req.Prompt, req.AddSpecialTokens)
	if aerr != nil {
		return nil, aerr
	}
	j.prompts = prompts
	return j, j.checkPrompts()
}

// completionPrompts accepts a string, a list of strings, a list of token ids,
// or a list of lists of token ids.
// Texts that encode to more tokens than the context holds are refused (see encodeText).
func (m *Model) completionPrompts(raw json.RawMessage, addSpecial *bool) ([][]int32, *apiError) {
	if isNull(raw) {
		return nil, badRequest("prompt", "prompt is required.")
	}
	t := m.Tokenizer
	encode := func(s string) ([]int32, *apiError) {
		ids, ok := encodeText(t, s, addSpecial, false, m.ContextLen)
		if !ok {
			return nil, m.tooLong("prompt")
		}
		return ids, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		ids, aerr := encode(s)
		if aerr != nil {
			return nil, aerr
		}
		return [][]int32{ids}, nil
	}
	var elems []json.RawMessage
	if json.Unmarshal(raw, &elems) != nil {
		return nil, badRequest("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids.")
	}
	if len(elems) == 0 {
		return nil, badRequest("prompt", "prompt must not be an empty list.")
	}
	vocab := int64(t.VocabSize())
	ids := func(raw json.RawMessage, param string) ([]int32, *apiError) {
		var in []int64
		if json.Unmarshal(raw, &in) != nil {
			return nil, badRequest("prompt", "%s must be a list of integer token ids.", param)
		}
		out := make([]int32, len(in))
		for i, id := range in {
			if id < 0 || id >= vocab {
				return nil, badRequest("prompt", "%s: token id %d is outside the vocabulary [0, %d).", param, id, vocab)
			}
			out[i] = int32(id)
		}
		return out, nil
	}
	first := bytes.TrimSpace(elems[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		var list []string
		if json.Unmarshal(raw, &list) != nil {
			return nil, badRequest("prompt", "prompt: a list of strings must hold only strings.")
		}
		out := make([][]int32, len(list))
		for i, s := range list {
			ids, aerr := encode(s)
			if aerr != nil {
				return nil, aerr
			}
			out[i] = ids
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		out := make([][]int32, len(elems))
		for i, e := range elems {
			p, aerr := ids(e, fmt.Sprintf("prompt[%d]", i))
			if aerr != nil {
				return nil, aerr
			}
			out[i] = p
		}
		return out, nil
	}
	p, aerr := ids(raw, "prompt")
	if aerr != nil {
		return nil, aerr
	}
	return [][]int32{p}, nil
}

// checkPrompts refuses empty prompts, too many choices, and prompts that do
// not fit the context with the completion asked for (vLLM's message).
func (j *job) checkPrompts() *apiError {
	what, param := "prompt", "prompt"
	if j.chat {
		what, param = "messages", "messages"
	}
	if len(j.prompts)*j.n > MaxChoices {
		return badRequest(param, "Too many choices: %d prompts × n=%d is more than %d.", len(j.prompts), j.n, MaxChoices)
	}
	ctxLen := j.m.ContextLen
	for i, p := range j.prompts {
		if len(p) == 0 {
			if len(j.prompts) > 1 {
				return badRequest(param, "prompt %d is empty.", i)
			}
			return badRequest(param, "The %s encode to no tokens.", what)
		}
		if ctxLen <= 0 {
			continue
		}
		switch {
		case j.maxTokens > 0 && len(p)+j.maxTokens > ctxLen:
			return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, code: "context_length_exceeded",
				msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
					ctxLen, len(p)+j.maxTokens, len(p), what, j.maxTokens, what)}
		case len(p) >= ctxLen:
			return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, code: "context_length_exceeded",
				msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the %s, which leaves no room for the completion. Please reduce the length of the %s.",
					ctxLen, len(p), what, what)}
		}
	}
	return nil
}
