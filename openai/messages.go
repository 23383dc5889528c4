package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"tandem/llm"
)

// Anthropic's Messages API (/v1/messages), which coding agents speak: the request's system
// text, messages and content blocks (text, tool_use, tool_result, thinking) become chat
// messages, and the answer is a chat completion's one choice (the same template, tools
// and reasoning), returned as content blocks (thinking, text, tool_use) with Anthropic's
// stop_reason, streamed as Anthropic's events. Errors have Anthropic's shape. The key may
// come as x-api-key.

type messagesRequest struct {
	Model         string             `json:"model"`
	MaxTokens     *int64             `json:"max_tokens"`
	Messages      []anthropicMessage `json:"messages"`
	System        json.RawMessage    `json:"system"`
	StopSequences []string           `json:"stop_sequences"`
	Stream        bool               `json:"stream"`
	Temperature   *float64           `json:"temperature"`
	TopP          *float64           `json:"top_p"`
	TopK          *int64             `json:"top_k"`
	Tools         []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
	ToolChoice *struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
	} `json:"tool_choice"`
	Metadata *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
	Thinking *struct {
		Type         string `json:"type"`
		BudgetTokens int    `json:"budget_tokens"`
	} `json:"thinking"`
	// Refused when set.
	Container  json.RawMessage `json:"container"`
	MCPServers json.RawMessage `json:"mcp_servers"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Thinking  string          `json:"thinking"`
}

// anthropicErrorTypes are Anthropic's error types by status.
var anthropicErrorTypes = map[int]string{
	http.StatusBadRequest: "invalid_request_error", http.StatusUnauthorized: "authentication_error",
	http.StatusForbidden: "permission_error", http.StatusNotFound: "not_found_error",
	http.StatusMethodNotAllowed: "invalid_request_error", http.StatusRequestTimeout: "timeout_error",
	http.StatusRequestEntityTooLarge: "request_too_large", http.StatusUnsupportedMediaType: "invalid_request_error",
	http.StatusTooManyRequests: "rate_limit_error", http.StatusServiceUnavailable: "overloaded_error",
}

// anthropicBody is the error in Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
func (e *apiError) anthropicBody() any {
	typ := anthropicErrorTypes[e.status]
	if typ == "" {
		typ = "api_error"
	}
	return map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": e.msg}}
}

func (h *handler) messages(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req messagesRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	creq, aerr := req.chat()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := h.chatJob(r, creq, info)
	if aerr != nil {
		if aerr.param == "max_completion_tokens" {
			aerr.param, aerr.msg = "max_tokens", strings.ReplaceAll(aerr.msg, "max_completion_tokens", "max_tokens")
		}
		writeError(w, aerr)
		return
	}
	j.id = newID("msg_")
	if req.Thinking != nil && req.Thinking.BudgetTokens > 0 {
		// The budget is not enforced: say so where the client can see it.
		w.Header().Set("X-Tandem-Ignored", "thinking.budget_tokens")
	}
	h.runMessage(w, r, info, j)
}

// countTokens serves /v1/messages/count_tokens: the prompt's length as /v1/messages would
// render it.
func (h *handler) countTokens(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req messagesRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	if req.MaxTokens == nil {
		one := int64(1)
		req.MaxTokens = &one // count_tokens takes no max_tokens
	}
	creq, aerr := req.chat()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	creq.MaxCompletionTokens = nil
	j, aerr := h.chatJob(r, creq, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	info.promptTokens = len(j.prompts[0])
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": len(j.prompts[0])})
}

// chat converts the request to a chat request.
func (req *messagesRequest) chat() (*chatRequest, *apiError) {
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"container", req.Container}, {"mcp_servers", req.MCPServers}} {
		if !isNull(f.raw) {
			return nil, badRequest(f.name, "%s is not supported by this server.", f.name)
		}
	}
	if req.MaxTokens == nil {
		return nil, badRequest("max_tokens", "max_tokens: Field required.")
	}
	creq := &chatRequest{Model: req.Model, MaxCompletionTokens: req.MaxTokens}
	creq.Stream = req.Stream
	creq.Temperature, creq.TopP, creq.TopK = req.Temperature, req.TopP, req.TopK
	if req.Metadata != nil {
		creq.User = req.Metadata.UserID
	}
	if len(req.StopSequences) > 0 {
		creq.Stop, _ = json.Marshal(req.StopSequences)
	}
	if !isNull(req.System) {
		text, aerr := anthropicText(req.System, "system")
		if aerr != nil {
			return nil, aerr
		}
		sys, _ := json.Marshal(text)
		creq.Messages = append(creq.Messages, chatMessage{Role: "system", Content: sys})
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages: at least one message is required.")
	}
	for i, m := range req.Messages {
		msgs, aerr := anthropicToChat(m, fmt.Sprintf("messages.%d", i))
		if aerr != nil {
			return nil, aerr
		}
		creq.Messages = append(creq.Messages, msgs...)
	}
	if len(req.Tools) > 0 {
		tools := make([]map[string]any, 0, len(req.Tools))
		for i, t := range req.Tools {
			if t.Type != "" && t.Type != "custom" {
				return nil, badRequest(fmt.Sprintf("tools.%d.type", i), "tools.%d.type: server tools (%q) are not available; define custom tools with input_schema.", i, t.Type)
			}
			fn := map[string]any{"name": t.Name, "description": t.Description}
			if !isNull(t.InputSchema) {
				fn["parameters"] = t.InputSchema
			}
			tools = append(tools, map[string]any{"type": "function", "function": fn})
		}
		creq.Tools, _ = json.Marshal(tools)
	}
	if tc := req.ToolChoice; tc != nil {
		var choice any
		switch tc.Type {
		case "auto", "":
			choice = "auto"
		case "any":
			choice = "required"
		case "none":
			choice = "none"
		case "tool":
			choice = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
		default:
			return nil, badRequest("tool_choice.type", "tool_choice.type must be auto, any, tool or none, got %q.", tc.Type)
		}
		creq.ToolChoice, _ = json.Marshal(choice)
		if tc.DisableParallelToolUse {
			no := false
			creq.ParallelToolCalls = &no
		}
	}
	if th := req.Thinking; th != nil {
		switch th.Type {
		case "enabled", "adaptive":
			creq.ChatTemplateKwargs = map[string]json.RawMessage{"enable_thinking": json.RawMessage("true")}
		case "disabled":
			creq.ChatTemplateKwargs = map[string]json.RawMessage{"enable_thinking": json.RawMessage("false")}
		default:
			return nil, badRequest("thinking.type", "thinking.type must be enabled or disabled, got %q.", th.Type)
		}
	}
	return creq, nil
}

// anthropicText reads a string or a list of text blocks.
func anthropicText(raw json.RawMessage, param string) (string, *apiError) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return "", badRequest(param, "%s must be a string or a list of text blocks.", param)
	}
	var parts []string
	for k, b := range blocks {
		if b.Type != "text" {
			return "", badRequest(fmt.Sprintf("%s.%d.type", param, k), "%s.%d.type: only text blocks are supported here, got %q.", param, k, b.Type)
		}
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n"), nil
}

// anthropicToChat converts one message: a user's tool results become tool messages (before
// its text), an assistant's tool uses its tool calls and its thinking its reasoning.
func anthropicToChat(m anthropicMessage, param string) ([]chatMessage, *apiError) {
	if m.Role != "user" && m.Role != "assistant" {
		return nil, badRequest(param+".role", "%s.role must be user or assistant, got %q.", param, m.Role)
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		content, _ := json.Marshal(s)
		return []chatMessage{{Role: m.Role, Content: content}}, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(m.Content, &blocks) != nil {
		return nil, badRequest(param+".content", "%s.content must be a string or a list of content blocks.", param)
	}
	var out []chatMessage
	var texts, thinking []string
	var calls []toolCallOut
	for k, b := range blocks {
		bp := fmt.Sprintf("%s.content.%d", param, k)
		switch {
		case b.Type == "text":
			texts = append(texts, b.Text)
		case b.Type == "tool_result" && m.Role == "user":
			text := ""
			if !isNull(b.Content) {
				var aerr *apiError
				if text, aerr = anthropicText(b.Content, bp+".content"); aerr != nil {
					return nil, aerr
				}
			}
			if b.IsError {
				text = "Error: " + text
			}
			content, _ := json.Marshal(text)
			out = append(out, chatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: content})
		case b.Type == "tool_use" && m.Role == "assistant":
			args := "{}"
			if !isNull(b.Input) {
				args = string(b.Input)
			}
			calls = append(calls, toolCallOut{ID: b.ID, Type: "function", Function: toolCallFunction{Name: b.Name, Arguments: args}})
		case (b.Type == "thinking" || b.Type == "redacted_thinking") && m.Role == "assistant":
			if b.Thinking != "" {
				thinking = append(thinking, b.Thinking)
			}
		default:
			return nil, badRequest(bp+".type", "%s.type: %q blocks are not supported in %s messages (this server takes text, tool_use, tool_result and thinking).", bp, b.Type, m.Role)
		}
	}
	if len(texts) > 0 || len(calls) > 0 || len(thinking) > 0 || len(out) == 0 {
		msg := chatMessage{Role: m.Role}
		if len(texts) > 0 || m.Role == "user" {
			msg.Content, _ = json.Marshal(strings.Join(texts, "\n"))
		}
		if len(calls) > 0 {
			msg.ToolCalls, _ = json.Marshal(calls)
		}
		if len(thinking) > 0 {
			r := strings.Join(thinking, "\n")
			msg.ReasoningContent = &r
		}
		out = append(out, msg)
	}
	return out, nil
}

// msgBlock is one content block of the answer.
type msgBlock struct {
	typ  string // text, thinking, tool_use
	id   string
	name string
	text strings.Builder // text, thinking, or the tool input's JSON
	bad  bool            // a tool call that did not parse
}

// msgBuilder turns a choice's parsed output into content blocks and, for a stream, events.
type msgBuilder struct {
	h      *handler
	blocks []*msgBlock
	open   *msgBlock
	sse    *sseWriter // the stream; nil: not streamed
}

func (b *msgBuilder) send(typ string, fields map[string]any) error {
	if b.sse == nil {
		return nil
	}
	fields["type"] = typ
	return b.sse.event(typ, fields)
}

func (b *msgBuilder) start(blk *msgBlock) error {
	if err := b.close(); err != nil {
		return err
	}
	b.blocks = append(b.blocks, blk)
	b.open = blk
	var cb map[string]any
	switch blk.typ {
	case "text":
		cb = map[string]any{"type": "text", "text": ""}
	case "thinking":
		cb = map[string]any{"type": "thinking", "thinking": "", "signature": ""}
	case "tool_use":
		cb = map[string]any{"type": "tool_use", "id": blk.id, "name": blk.name, "input": map[string]any{}}
	}
	return b.send("content_block_start", map[string]any{"index": len(b.blocks) - 1, "content_block": cb})
}

func (b *msgBuilder) close() error {
	if b.open == nil {
		return nil
	}
	blk := b.open
	b.open = nil
	if blk.typ == "thinking" {
		if err := b.delta("signature_delta", "signature", ""); err != nil {
			return err
		}
	}
	return b.send("content_block_stop", map[string]any{"index": len(b.blocks) - 1})
}

// delta sends a content_block_delta of the open block, {"type": typ, field: text}, as
// encoding/json would write that map (keys sorted), without a map per token.
func (b *msgBuilder) delta(typ, field, text string) error {
	if b.sse == nil {
		return nil
	}
	if b.sse.err != nil {
		return b.sse.err
	}
	e := b.sse.begin("content_block_delta")
	e = append(e, `{"delta":{`...)
	e = appendKey(e, field)
	e = appendJSONString(e, text)
	e = append(e, `,"type":`...)
	e = appendJSONString(e, typ)
	e = append(e, `},"index":`...)
	e = strconv.AppendInt(e, int64(len(b.blocks)-1), 10)
	e = append(e, `,"type":"content_block_delta"}`...)
	return b.sse.commit(e)
}

func (b *msgBuilder) add(out parsed) error {
	if r := out.reasoning; r != "" {
		if b.open == nil || b.open.typ != "thinking" {
			if err := b.start(&msgBlock{typ: "thinking"}); err != nil {
				return err
			}
		}
		b.open.text.WriteString(r)
		if err := b.delta("thinking_delta", "thinking", r); err != nil {
			return err
		}
	}
	for _, ev := range out.events {
		var err error
		switch ev.kind {
		case evText:
			if ev.text == "" {
				continue
			}
			if b.open == nil || b.open.typ != "text" {
				if err = b.start(&msgBlock{typ: "text"}); err != nil {
					return err
				}
			}
			b.open.text.WriteString(ev.text)
			err = b.delta("text_delta", "text", ev.text)
		case evCallStart:
			err = b.start(&msgBlock{typ: "tool_use", id: newID("toolu_"), name: ev.text})
		case evCallArgs:
			if b.open == nil || b.open.typ != "tool_use" {
				continue
			}
			b.open.text.WriteString(ev.text)
			err = b.delta("input_json_delta", "partial_json", ev.text)
		case evCallEnd:
			err = b.close()
		case evCallBroken:
			b.h.unparsedCall()
			if b.sse == nil {
				if n := len(b.blocks); n > 0 && b.blocks[n-1].typ == "tool_use" {
					b.blocks, b.open = b.blocks[:n-1], nil
				}
				err = b.add(parsed{events: []toolEvent{{kind: evText, text: ev.raw}}})
			} else if b.open != nil && b.open.typ == "tool_use" {
				b.open.bad = true
				err = b.close()
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// content is the answer's blocks in Anthropic's shape.
func (b *msgBuilder) content() []any {
	out := []any{}
	for _, blk := range b.blocks {
		text := blk.text.String()
		switch blk.typ {
		case "text":
			out = append(out, map[string]any{"type": "text", "text": text})
		case "thinking":
			out = append(out, map[string]any{"type": "thinking", "thinking": text, "signature": ""})
		case "tool_use":
			input := json.RawMessage(text)
			if !json.Valid(input) || blk.bad {
				input = json.RawMessage("{}")
			}
			out = append(out, map[string]any{"type": "tool_use", "id": blk.id, "name": blk.name, "input": input})
		}
	}
	return out
}

// stopReason is Anthropic's stop_reason and stop_sequence for the choice.
func (b *msgBuilder) stopReason(c *choice) (string, any) {
	switch {
	case c.finish == string(llm.FinishLength):
		return "max_tokens", nil
	case c.stopStr != "":
		return "stop_sequence", c.stopStr
	}
	for _, blk := range b.blocks {
		if blk.typ == "tool_use" {
			return "tool_use", nil
		}
	}
	return "end_turn", nil
}

func anthropicUsage(u usage) map[string]int {
	return map[string]int{"input_tokens": u.PromptTokens - u.PromptTokensDetails.CachedTokens, "output_tokens": u.CompletionTokens,
		"cache_read_input_tokens": u.PromptTokensDetails.CachedTokens, "cache_creation_input_tokens": 0}
}

// runMessage generates the answer, streamed or not.
func (h *handler) runMessage(w http.ResponseWriter, r *http.Request, info *reqInfo, j *job) {
	c, aerr := h.startSingle(r.Context(), j)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	defer c.st.Close()
	c.worker(w)
	b := &msgBuilder{h: h}
	var sse *sseWriter
	if j.stream {
		sse = h.newSSE(w)
		b.sse = sse
		prompt := len(j.prompts[0])
		start := map[string]any{"id": j.id, "type": "message", "role": "assistant", "content": []any{}, "model": j.m.ID,
			"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": prompt, "output_tokens": 0}}
		if b.send("message_start", map[string]any{"message": start}) != nil || b.send("ping", map[string]any{}) != nil {
			return
		}
	}
	aerr = h.runSingle(r.Context(), r, info, j, c, sse, func(out parsed, _ *tokenLogprob) error { return b.add(out) })
	if aerr == nil && b.close() != nil {
		aerr = errClientGone
	}
	if aerr != nil {
		if aerr == errClientGone {
			return
		}
		if sse != nil {
			b.send("error", map[string]any{"error": aerr.anthropicBody().(map[string]any)["error"]})
			return
		}
		writeError(w, aerr)
		return
	}
	h.requestDone(j, []*choice{c})
	u := j.usage([]*choice{c})
	reason, seq := b.stopReason(c)
	if sse != nil {
		if b.send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq},
			"usage": map[string]int{"output_tokens": u.CompletionTokens}}) != nil {
			return
		}
		b.send("message_stop", map[string]any{})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": j.id, "type": "message", "role": "assistant", "model": j.m.ID,
		"content": b.content(), "stop_reason": reason, "stop_sequence": seq, "usage": anthropicUsage(u)})
}
