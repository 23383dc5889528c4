package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"tandem/grammar"
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
	// SpeculativeDecoding false turns the server's speculative decoding off for the
	// request (the tokens are the same; only the speed differs).
	SpeculativeDecoding *bool `json:"speculative_decoding"`
	// vLLM's token-level fields.
	MinTokens              *int64          `json:"min_tokens"`
	AllowedTokenIDs        []int64         `json:"allowed_token_ids"`
	PromptLogprobs         json.RawMessage `json:"prompt_logprobs"`
	ReturnTokenIDs         *bool           `json:"return_token_ids"`
	ReturnTokensAsTokenIDs *bool           `json:"return_tokens_as_token_ids"`
	formatFields
	refusedFields
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             string          `json:"name"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
}

type chatRequest struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
	samplingFields
	chatRefusedFields
	MaxCompletionTokens *int64                     `json:"max_completion_tokens"`
	Logprobs            *bool                      `json:"logprobs"`
	TopLogprobs         *int64                     `json:"top_logprobs"`
	Tools               json.RawMessage            `json:"tools"`
	ToolChoice          json.RawMessage            `json:"tool_choice"`
	ParallelToolCalls   *bool                      `json:"parallel_tool_calls"`
	AddGenerationPrompt *bool                      `json:"add_generation_prompt"`
	ChatTemplateKwargs  map[string]json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort     json.RawMessage            `json:"reasoning_effort"`
	// Echo prepends the final message's content to the answer when it is the assistant's
	// (vLLM); ContinueFinalMessage leaves the final message open for the model to go on.
	Echo                 bool `json:"echo"`
	ContinueFinalMessage bool `json:"continue_final_message"`
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
	out          outputSpec

	// vLLM's token-level answers.
	tokenIDs       bool     // return_token_ids: the prompt's and the output's token ids
	idsAsTokens    bool     // return_tokens_as_token_ids: logprob tokens as "token_id:N"
	promptLogprobs int      // prompt_logprobs: alternatives per prompt token; -1: none
	minTokens      int      // stop strings apply from this many tokens on
	echo           []string // per prompt: the text the answer begins with (echo)
	echoOnly       bool     // echo with max_tokens 0: the prompt alone, no generated token
}

// outputSpec is how a chat choice's text is read back: its reasoning split off, its tool
// calls parsed, and, for constrained or tool output, its spaces kept as the tokens have
// them (a clean-up would change what the grammar allowed).
type outputSpec struct {
	reasoning bool      // split a think block off
	inside    bool      // the prompt opened the think block
	tools     *toolPlan // parse tool calls in this format; nil: none
	raw       bool
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
	if f.StreamOptions != nil && !f.Stream {
		return nil, badRequest("stream_options", "stream_options is only allowed when stream is true.")
	}
	if aerr := refuse(f.refusedFields.list()); aerr != nil {
		return nil, aerr
	}
	j.includeUsage = f.Stream && f.StreamOptions != nil && f.StreamOptions.IncludeUsage
	j.tokenIDs = f.ReturnTokenIDs != nil && *f.ReturnTokenIDs
	j.idsAsTokens = f.ReturnTokensAsTokenIDs != nil && *f.ReturnTokensAsTokenIDs
	j.promptLogprobs = -1
	if !isNull(f.PromptLogprobs) {
		var n int64
		if json.Unmarshal(f.PromptLogprobs, &n) != nil || n < 0 || n > llm.MaxTopLogprobs {
			return nil, badRequest("prompt_logprobs", "prompt_logprobs must be an integer between 0 and %d (alternatives per prompt token), got %s.", llm.MaxTopLogprobs, f.PromptLogprobs)
		}
		j.promptLogprobs = int(n)
		j.req.PromptLogprobs, j.req.PromptTopLogprobs = true, int(n)
	}
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
	if f.MinTokens != nil {
		switch {
		case *f.MinTokens < 0:
			return nil, badRequest("min_tokens", "min_tokens must be at least 0, got %d.", *f.MinTokens)
		case j.maxTokens > 0 && *f.MinTokens > int64(j.maxTokens):
			return nil, badRequest("min_tokens", "min_tokens (%d) must not exceed %s (%d).", *f.MinTokens, maxParam, j.maxTokens)
		}
		sp.MinTokens = int(min(*f.MinTokens, math.MaxInt32))
		j.minTokens = sp.MinTokens
	}
	if f.AllowedTokenIDs != nil {
		if len(f.AllowedTokenIDs) == 0 {
			return nil, badRequest("allowed_token_ids", "allowed_token_ids must not be empty.")
		}
		for _, id := range f.AllowedTokenIDs {
			if id < 0 || id >= int64(vocab) {
				return nil, badRequest("allowed_token_ids", "allowed_token_ids: token id %d is outside the vocabulary [0, %d).", id, vocab)
			}
			sp.AllowedTokens = append(sp.AllowedTokens, int32(id))
		}
	}
	if (sp.MinTokens > 0 || sp.AllowedTokens != nil || j.req.PromptLogprobs) && m.NoTokenControls {
		param := "min_tokens"
		switch {
		case sp.AllowedTokens != nil:
			param = "allowed_token_ids"
		case j.req.PromptLogprobs:
			param = "prompt_logprobs"
		}
		return nil, badRequest(param, "%s: the workers serving `%s` predate it and would ignore it; upgrade them.", param, m.ID)
	}
	j.req.Sampling = sp
	j.req.IgnoreEOS = f.IgnoreEOS
	// A stop string is matched here, on the text, and ends the worker's generation only
	// when its token arrives: tokens sent many to a message would let a worker run up to a
	// message's worth past it.
	j.req.Collected = !f.Stream && len(j.stops) == 0
	j.req.Priority = int(max(min(f.Priority, math.MaxInt32), math.MinInt32))
	j.req.MaxTokens = j.maxTokens
	j.req.Model = m.ID
	j.req.Adapter = m.adapter
	j.req.NoSpeculation = f.SpeculativeDecoding != nil && !*f.SpeculativeDecoding
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
		case "system", "user", "assistant", "tool":
		case "developer":
			role = "system"
		case "function":
			return nil, badRequest(param+".role", "%s.role: the legacy \"function\" role is not supported; send tool results as \"tool\" messages.", param)
		case "":
			return nil, badRequest(param+".role", "%s.role is required.", param)
		default:
			return nil, badRequest(param+".role", "%s.role: unknown role %q (use system, developer, user, assistant or tool).", param, role)
		}
		text, err := messageContent(msg.Content, param+".content", role == "assistant")
		if err != nil {
			return nil, err
		}
		tm := tokenizer.Message{Role: role, Content: text, Name: msg.Name}
		if !isNull(msg.ToolCalls) && strings.TrimSpace(string(msg.ToolCalls)) != "[]" {
			if role != "assistant" {
				return nil, badRequest(param+".tool_calls", "%s.tool_calls: only assistant messages make tool calls.", param)
			}
			calls, aerr := messageToolCalls(msg.ToolCalls, param+".tool_calls")
			if aerr != nil {
				return nil, aerr
			}
			tm.ToolCalls = calls
		}
		if role == "tool" {
			tm.ToolCallID = msg.ToolCallID
		}
		if role == "assistant" {
			switch {
			case msg.ReasoningContent != nil:
				tm.Reasoning = *msg.ReasoningContent
			case msg.Reasoning != nil:
				tm.Reasoning = *msg.Reasoning
			}
		}
		out = append(out, tm)
	}
	return out, nil
}

// messageToolCalls reads an assistant message's tool_calls.
func messageToolCalls(raw json.RawMessage, param string) ([]tokenizer.ToolCall, *apiError) {
	var list []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function *struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return nil, badRequest(param, "%s must be a list of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}.", param)
	}
	calls := make([]tokenizer.ToolCall, 0, len(list))
	for i, c := range list {
		pp := fmt.Sprintf("%s[%d]", param, i)
		if c.Type != "" && c.Type != "function" {
			return nil, badRequest(pp+".type", "%s.type: only function calls are supported, got %q.", pp, c.Type)
		}
		if c.Function == nil || c.Function.Name == "" {
			return nil, badRequest(pp+".function.name", "%s.function.name is required.", pp)
		}
		args := "{}"
		if a := c.Function.Arguments; !isNull(a) {
			var s string
			if json.Unmarshal(a, &s) == nil {
				args = s // OpenAI's form: the arguments' JSON as a string
			} else {
				args = string(a) // an object, as some clients send
			}
		}
		calls = append(calls, tokenizer.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args})
	}
	return calls, nil
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

// chatInput is what a chat prompt is rendered from.
type chatInput struct {
	messages            []chatMessage
	addGenerationPrompt *bool
	continueFinal       bool // the final message is left open: the model goes on with it
	addSpecial          *bool
	tools               *toolPlan                  // nil: none
	vars                map[string]json.RawMessage // chat_template_kwargs, reasoning_effort
}

// renderChat applies the model's chat template. It reports what the template could not
// write that the server wrote itself (tools, tool_calls).
func (m *Model) renderChat(in chatInput) (string, []string, *apiError) {
	msgs, aerr := chatMessages(in.messages)
	if aerr != nil {
		return "", nil, aerr
	}
	tmpl := m.template()
	if tmpl == "" {
		return "", nil, badRequest("messages", "The model `%s` has no chat template, so it cannot serve chat completions; use /v1/completions.", m.ID)
	}
	msgs, fell := in.tools.messagesForTemplate(tmpl, msgs)
	opts := tokenizer.ChatOptions{AddGenerationPrompt: !in.continueFinal && (in.addGenerationPrompt == nil || *in.addGenerationPrompt), Vars: in.vars}
	if in.tools != nil && !slices.Contains(fell, "tools") {
		for _, t := range in.tools.tools {
			opts.Tools = append(opts.Tools, t.raw)
		}
	}
	t := m.Tokenizer
	text, err := tokenizer.RenderChat(tmpl, msgs, opts, t.BOSText(), t.EOSText())
	if err != nil {
		return "", nil, badRequest("messages", "The chat template cannot be applied to these messages: %v.", strings.TrimPrefix(err.Error(), "tokenizer: "))
	}
	if in.continueFinal {
		// The rendered text is cut right after the final message's content, so that what
		// the template writes to close it (an end-of-turn token) is left out (vLLM's rule).
		last := msgs[len(msgs)-1].Content
		i := strings.LastIndex(text, last)
		if last == "" || i < 0 {
			return "", nil, badRequest("continue_final_message", "continue_final_message: the final message must have content that the chat template writes as it is.")
		}
		text = text[:i+len(last)]
	}
	return text, fell, nil
}

// chatPrompt renders and encodes a chat request's messages, and returns the rendered text
// too. With limit > 0, messages that encode to more tokens are refused (see encodeText).
func (m *Model) chatPrompt(in chatInput, limit int) ([]int32, string, []string, *apiError) {
	text, fell, aerr := m.renderChat(in)
	if aerr != nil {
		return nil, "", nil, aerr
	}
	ids, ok := encodeText(m.Tokenizer, text, in.addSpecial, true, limit)
	if !ok {
		return nil, "", nil, m.tooLong("messages")
	}
	return ids, text, fell, nil
}

// templateVars are the template variables of a chat request: chat_template_kwargs, and
// reasoning_effort for templates that read it.
func (req *chatRequest) templateVars() (map[string]json.RawMessage, *apiError) {
	vars := map[string]json.RawMessage{}
	for k, v := range req.ChatTemplateKwargs {
		switch k {
		case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token":
			return nil, badRequest("chat_template_kwargs", "chat_template_kwargs may not set %q.", k)
		}
		vars[k] = v
	}
	if !isNull(req.ReasoningEffort) {
		var effort string
		if json.Unmarshal(req.ReasoningEffort, &effort) != nil {
			return nil, badRequest("reasoning_effort", "reasoning_effort must be a string.")
		}
		if _, set := vars["reasoning_effort"]; !set {
			vars["reasoning_effort"] = req.ReasoningEffort
		}
	}
	return vars, nil
}

// toolPlan reads the request's tools, tool_choice and parallel_tool_calls.
func (m *Model) toolPlan(req *chatRequest) (*toolPlan, *apiError) {
	tools, aerr := parseTools(req.Tools)
	if aerr != nil {
		return nil, aerr
	}
	choice, aerr := parseToolChoice(req.ToolChoice, tools)
	if aerr != nil {
		return nil, aerr
	}
	if len(tools) == 0 {
		return nil, nil
	}
	p := &toolPlan{format: m.toolFormat(), tools: tools, choice: choice, parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls}
	if p.format == nil && choice.mode != "none" {
		return nil, badRequest("tools", "The model `%s` has no tool-call format: its chat template writes none that this server knows (hermes, llama3_json, mistral); start the server with --tool-call-parser.", m.ID)
	}
	return p, nil
}

// constrain builds the choice's grammar: the format asked for, or the tool calls a plan
// forces or makes strict, after the reasoning block when the model thinks first.
func (j *job) constrain(format *outputFormat, plan *toolPlan) *apiError {
	tools := plan != nil && plan.choice.mode != "none" && plan.constrained()
	if format == nil && !tools {
		return nil
	}
	param := "tools"
	if format != nil && !(tools && plan.forced()) {
		param = format.param
	}
	if j.m.NoConstraints {
		return badRequest(param, "%s: the workers serving `%s` cannot follow a grammar (they predate constrained decoding); upgrade them.", param, j.m.ID)
	}
	b := grammar.NewBuilder()
	var content grammar.Expr
	if format != nil && !(tools && plan.forced()) {
		x, err := format.build(b)
		if err != nil {
			return badRequest(param, "%s: %v.", param, trimPrefixes(err))
		}
		content = x
	}
	body := content
	if tools {
		x, err := plan.grammar(b, content, format != nil && !plan.forced())
		if err != nil {
			return badRequest(param, "%s: %v.", param, trimPrefixes(err))
		}
		body = x
	}
	if j.out.reasoning {
		body = grammar.Seq(thinkPrefix(b, j.out.inside), body)
	}
	g, err := b.Build(body)
	if err == nil {
		_, err = grammar.Compile(g)
	}
	if err != nil {
		return badRequest(param, "%s: %v.", param, trimPrefixes(err))
	}
	j.req.Constraint = llm.Constraint{Grammar: g.String()}
	j.out.raw = true
	return nil
}

func parseChat(h *handler, r *http.Request, w http.ResponseWriter, info *reqInfo) (*job, *apiError) {
	var req chatRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		return nil, aerr
	}
	return h.chatJob(r, &req, info)
}

// chatJob validates a chat request (from /v1/chat/completions, or made from a Responses
// or Messages request) into a job.
func (h *handler) chatJob(r *http.Request, req *chatRequest, info *reqInfo) (*job, *apiError) {
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := refuse(req.chatRefusedFields.list()); aerr != nil {
		return nil, aerr
	}
	maxTokens, maxParam := req.MaxTokens, "max_tokens"
	if req.MaxCompletionTokens != nil {
		maxTokens, maxParam = req.MaxCompletionTokens, "max_completion_tokens"
	}
	format, aerr := req.format()
	if aerr != nil {
		return nil, aerr
	}
	plan, aerr := m.toolPlan(req)
	if aerr != nil {
		return nil, aerr
	}
	vars, aerr := req.templateVars()
	if aerr != nil {
		return nil, aerr
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
	in := chatInput{messages: req.Messages, addGenerationPrompt: req.AddGenerationPrompt,
		addSpecial: req.AddSpecialTokens, tools: plan, vars: vars, continueFinal: req.ContinueFinalMessage}
	if req.ContinueFinalMessage && req.AddGenerationPrompt != nil && *req.AddGenerationPrompt {
		return nil, badRequest("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true.")
	}
	prompt, text, fell, aerr := m.chatPrompt(in, m.ContextLen)
	if aerr != nil {
		return nil, aerr
	}
	if n := len(req.Messages); req.Echo && n > 0 && req.Messages[n-1].Role == "assistant" {
		last, _ := messageContent(req.Messages[n-1].Content, "", true)
		j.echo = []string{last}
	}
	h.templateFallback(m, fell)
	j.prompts = [][]int32{prompt}
	if m.thinks() && !promptClosesThinking(text) {
		j.out.reasoning, j.out.inside = true, promptOpensThinking(text)
	}
	if plan != nil && plan.choice.mode != "none" {
		j.out.tools, j.out.raw = plan, true
	}
	if aerr := j.constrain(format, plan); aerr != nil {
		return nil, aerr
	}
	return j, j.checkPrompts()
}

func parseCompletion(h *handler, r *http.Request, w http.ResponseWriter, info *reqInfo) (*job, *apiError) {
	data, aerr := h.readRequest(w, r, h.maxBody, h.bodies.get())
	if aerr != nil {
		return nil, aerr
	}
	defer h.bodies.put(data) // nothing below keeps a part of it
	var req completionRequest
	ids, rest, cut := cutPromptIDs(data)
	if !cut || decodeJSON(rest, &req) != nil {
		// No prompt of plain token ids, or a body the copy cannot stand for: decoded
		// as it is, with its own errors.
		req, ids = completionRequest{}, nil
		if aerr := decodeJSON(data, &req); aerr != nil {
			return nil, aerr
		}
	}
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		return nil, aerr
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return nil, badRequest("suffix", "suffix is not supported.")
	}
	format, aerr := req.format()
	if aerr != nil {
		return nil, aerr
	}
	maxTokens, echoOnly := req.MaxTokens, false
	if req.Echo && maxTokens != nil && *maxTokens == 0 {
		// The prompt alone, scored (lm-eval's loglikelihood requests): one token is
		// generated for the prompt's logprobs to come, and left out (as vLLM does).
		one := int64(1)
		maxTokens, echoOnly = &one, true
	}
	j, aerr := newJob(m, &req.samplingFields, false, maxTokens, "max_tokens")
	if aerr != nil {
		return nil, aerr
	}
	j.echoOnly = echoOnly
	if aerr := j.constrain(format, nil); aerr != nil {
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
		if req.Echo && !j.req.PromptLogprobs {
			// The echoed prompt's tokens get their logprobs too (as vLLM gives them).
			if m.NoTokenControls {
				return nil, badRequest("echo", "echo with logprobs: the workers serving `%s` predate prompt logprobs; upgrade them.", m.ID)
			}
			j.req.PromptLogprobs, j.req.PromptTopLogprobs = true, int(*req.Logprobs)
		}
	}
	if aerr := j.validateSampling("logprobs"); aerr != nil {
		return nil, aerr
	}
	var prompts [][]int32
	if ids != nil {
		if aerr := m.checkIDs(ids, "prompt"); aerr != nil {
			return nil, aerr
		}
		prompts = [][]int32{ids}
	} else if prompts, aerr = m.promptIDs(req.Prompt, req.AddSpecialTokens); aerr != nil {
		return nil, aerr
	}
	j.prompts = prompts
	if req.Echo {
		j.echo = m.promptTexts(req.Prompt, prompts)
	}
	return j, j.checkPrompts()
}

// promptTexts is the text of each of a completion's prompts (raw, read as ids): a
// string prompt's own, or its token ids decoded.
func (m *Model) promptTexts(raw json.RawMessage, ids [][]int32) []string {
	texts := make([]string, len(ids))
	var one string
	var list []string
	switch {
	case json.Unmarshal(raw, &one) == nil:
		texts[0] = one
	case json.Unmarshal(raw, &list) == nil && len(list) == len(ids):
		copy(texts, list)
	default:
		for i, p := range ids {
			texts[i] = m.Tokenizer.Decode(p)
		}
	}
	return texts
}

// checkIDs refuses token ids outside the vocabulary, naming the first.
func (m *Model) checkIDs(ids []int32, param string) *apiError {
	vocab := int32(m.Tokenizer.VocabSize())
	for _, id := range ids {
		if id < 0 || id >= vocab {
			return badRequest("prompt", "%s: token id %d is outside the vocabulary [0, %d).", param, id, vocab)
		}
	}
	return nil
}

// promptIDs is completionPrompts' token ids.
func (m *Model) promptIDs(raw json.RawMessage, addSpecial *bool) ([][]int32, *apiError) {
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
	if p, end, ok := scanTokenIDs(raw); ok && skipSpace(raw, end) == len(raw) {
		// A list of plain token ids, read without encoding/json (tokenids.go).
		if aerr := m.checkIDs(p, "prompt"); aerr != nil {
			return nil, aerr
		}
		return [][]int32{p}, nil
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
