package openai

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"tandem/llm"
)

// The Responses API (/v1/responses): a request's input items (and the conversation of its
// previous_response_id) become chat messages, its instructions a system message first;
// the answer is generated as a chat completion's one choice would be (the same template,
// tools, structured outputs and reasoning), and returned as output items: reasoning, a
// message, function calls. A stream sends OpenAI's events in OpenAI's order. A response
// stored (store, the default) is kept by the ResponseStore with the conversation through
// it, for GET and DELETE /v1/responses/{id} and for the next request's
// previous_response_id.

// ResponseStore keeps stored responses by id: an embedded database (package respstore),
// shared by the handlers a router rebuilds. Get and Delete report whether the id was there;
// an expired response is not.
type ResponseStore interface {
	Put(ctx context.Context, id string, data []byte) error
	Get(ctx context.Context, id string) ([]byte, bool, error)
	Delete(ctx context.Context, id string) (bool, error)
}

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	Stream             bool            `json:"stream"`
	StreamOptions      json.RawMessage `json:"stream_options"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Text               *struct {
		Format    json.RawMessage `json:"format"`
		Verbosity json.RawMessage `json:"verbosity"`
	} `json:"text"`
	Reasoning *struct {
		Effort  json.RawMessage `json:"effort"`
		Summary json.RawMessage `json:"summary"`
	} `json:"reasoning"`
	Metadata       map[string]string `json:"metadata"`
	User           string            `json:"user"`
	PromptCacheKey string            `json:"prompt_cache_key"`
	Truncation     string            `json:"truncation"`
	// vLLM's: variables for the chat template (enable_thinking).
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	// Refused when set: they change the output and are not implemented.
	Background   json.RawMessage `json:"background"`
	Conversation json.RawMessage `json:"conversation"`
	Prompt       json.RawMessage `json:"prompt"`
	Include      []string        `json:"include"`
	TopLogprobs  json.RawMessage `json:"top_logprobs"`
	MaxToolCalls json.RawMessage `json:"max_tool_calls"`
}

// storedResponse is what the store keeps for a response (format version 1).
type storedResponse struct {
	V        int               `json:"v"`
	Response json.RawMessage   `json:"response"`
	Input    []json.RawMessage `json:"input"`   // this request's input items, with ids
	History  []chatMessage     `json:"history"` // the conversation through this response, in chat form
}

const storedVersion = 1

func (h *handler) responses(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req responsesRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	rs, aerr := h.newResponseJob(r, &req, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	h.runResponse(w, r, info, rs)
}

// responseJob is a validated Responses request.
type responseJob struct {
	j       *job
	req     *responsesRequest
	id      string
	store   bool
	input   []json.RawMessage // this request's items, with ids
	history []chatMessage     // the conversation before this response's output
	created int64
}

func (h *handler) newResponseJob(r *http.Request, req *responsesRequest, info *reqInfo) (*responseJob, *apiError) {
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		why  string
	}{
		{"background", req.Background, "responses are generated while the request lasts"},
		{"conversation", req.Conversation, "conversations are not kept; use previous_response_id"},
		{"prompt", req.Prompt, "stored prompt templates are not kept"},
		{"top_logprobs", req.TopLogprobs, "the Responses API's logprobs are not returned yet; use /v1/chat/completions"},
		{"max_tool_calls", req.MaxToolCalls, "the model makes at most one round of tool calls per response"},
	} {
		if !isNull(f.raw) && string(bytes.TrimSpace(f.raw)) != "false" && string(bytes.TrimSpace(f.raw)) != "0" {
			return nil, badRequest(f.name, "%s is not supported by this server: %s.", f.name, f.why)
		}
	}
	for _, inc := range req.Include {
		return nil, badRequest("include", "include %q is not supported by this server: nothing optional is added to responses.", inc)
	}
	switch req.Truncation {
	case "", "disabled":
	default:
		return nil, badRequest("truncation", "truncation %q is not supported: a conversation too long for the context is refused, not cut.", req.Truncation)
	}
	if !isNull(req.StreamOptions) && !req.Stream {
		return nil, badRequest("stream_options", "stream_options is only allowed when stream is true.")
	}
	rs := &responseJob{req: req, id: newID("resp_"), created: time.Now().Unix(), store: h.store != nil}
	if req.Store != nil {
		rs.store = *req.Store
		if rs.store && h.store == nil {
			return nil, badRequest("store", "store: this server keeps no responses (it has no response store); send store false.")
		}
	}
	if len(req.Metadata) > 16 {
		return nil, badRequest("metadata", "metadata holds at most 16 keys, got %d.", len(req.Metadata))
	}

	if req.PreviousResponseID != "" {
		prev, aerr := h.loadResponse(r.Context(), req.PreviousResponseID, "previous_response_id")
		if aerr != nil {
			return nil, aerr
		}
		rs.history = prev.History
	}
	msgs, items, aerr := responseInput(req.Input)
	if aerr != nil {
		return nil, aerr
	}
	rs.input = items
	rs.history = append(append([]chatMessage(nil), rs.history...), msgs...)

	creq := chatRequest{Model: req.Model, Messages: rs.history, ParallelToolCalls: req.ParallelToolCalls, ChatTemplateKwargs: req.ChatTemplateKwargs}
	if req.Instructions != nil && *req.Instructions != "" {
		sys, _ := json.Marshal(*req.Instructions)
		creq.Messages = append([]chatMessage{{Role: "system", Content: sys}}, creq.Messages...)
	}
	creq.Stream = req.Stream
	creq.Temperature, creq.TopP = req.Temperature, req.TopP
	creq.MaxCompletionTokens = req.MaxOutputTokens
	creq.User = req.User
	if creq.Tools, aerr = responseTools(req.Tools); aerr != nil {
		return nil, aerr
	}
	if creq.ToolChoice, aerr = responseToolChoice(req.ToolChoice); aerr != nil {
		return nil, aerr
	}
	if req.Text != nil && !isNull(req.Text.Format) {
		if creq.ResponseFormat, aerr = responseTextFormat(req.Text.Format); aerr != nil {
			return nil, aerr
		}
	}
	if req.Reasoning != nil && !isNull(req.Reasoning.Effort) {
		creq.ReasoningEffort = req.Reasoning.Effort
	}
	j, aerr := h.chatJob(r, &creq, info)
	if aerr != nil {
		if aerr.param == "max_completion_tokens" {
			aerr.param, aerr.msg = "max_output_tokens", strings.ReplaceAll(aerr.msg, "max_completion_tokens", "max_output_tokens")
		}
		return nil, aerr
	}
	if req.PromptCacheKey != "" && r.Header.Get(SessionHeader) == "" {
		j.req.Session = req.PromptCacheKey
	}
	j.id = rs.id
	j.created = rs.created
	rs.j = j
	return rs, nil
}

// loadResponse reads a stored response; param names the field that asked for it.
func (h *handler) loadResponse(ctx context.Context, id, param string) (*storedResponse, *apiError) {
	notFound := &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: param, code: "response_not_found",
		msg: fmt.Sprintf("Response with id '%s' not found.", id)}
	if param == "previous_response_id" {
		notFound.code, notFound.msg = "previous_response_not_found", fmt.Sprintf("Previous response with id '%s' not found.", id)
	}
	if h.store == nil {
		return nil, notFound
	}
	data, ok, err := h.store.Get(ctx, id)
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "Reading the response store: " + err.Error()}
	}
	if !ok {
		return nil, notFound
	}
	var sr storedResponse
	if err := json.Unmarshal(data, &sr); err != nil || sr.V != storedVersion {
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error",
			msg: fmt.Sprintf("The stored response %s cannot be read (format version %d, this server reads %d).", id, sr.V, storedVersion)}
	}
	return &sr, nil
}

// storedResponse serves GET and DELETE /v1/responses/{id}.
func (h *handler) storedResponse(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/responses/")
	if r.Method == http.MethodDelete {
		if h.store != nil {
			ok, err := h.store.Delete(r.Context(), id)
			if err != nil {
				writeError(w, &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "Deleting from the response store: " + err.Error()})
				return
			}
			if ok {
				writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
				return
			}
		}
		_, aerr := h.loadResponse(r.Context(), id, "response_id")
		writeError(w, aerr)
		return
	}
	sr, aerr := h.loadResponse(r.Context(), id, "response_id")
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(append(sr.Response, '\n'))
}

// responseInputItems serves GET /v1/responses/{id}/input_items: the items of the request
// that made the response, in order (no pages: one list).
func (h *handler) responseInputItems(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/input_items")
	sr, aerr := h.loadResponse(r.Context(), id, "response_id")
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	list := map[string]any{"object": "list", "data": sr.Input, "has_more": false}
	if n := len(sr.Input); n > 0 {
		var first, last struct {
			ID string `json:"id"`
		}
		json.Unmarshal(sr.Input[0], &first)
		json.Unmarshal(sr.Input[n-1], &last)
		list["first_id"], list["last_id"] = first.ID, last.ID
	}
	if r.URL.Query().Get("order") == "desc" {
		rev := make([]json.RawMessage, len(sr.Input))
		for i, it := range sr.Input {
			rev[len(rev)-1-i] = it
		}
		list["data"] = rev
		list["first_id"], list["last_id"] = list["last_id"], list["first_id"]
	}
	writeJSON(w, http.StatusOK, list)
}

// responseInput converts the input (a string, or a list of items) into chat messages,
// and returns the items with ids for input_items.
func responseInput(raw json.RawMessage) ([]chatMessage, []json.RawMessage, *apiError) {
	if isNull(raw) {
		return nil, nil, badRequest("input", "input is required.")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		item, _ := json.Marshal(map[string]any{"id": newID("msg_"), "type": "message", "role": "user",
			"content": []map[string]string{{"type": "input_text", "text": text}}})
		content, _ := json.Marshal(text)
		return []chatMessage{{Role: "user", Content: content}}, []json.RawMessage{item}, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, nil, badRequest("input", "input must be a string or a list of input items.")
	}
	var msgs []chatMessage
	var items []json.RawMessage
	var reasoning *string // a reasoning item, for the next assistant message
	for i, it := range list {
		param := fmt.Sprintf("input[%d]", i)
		var x struct {
			Type      string          `json:"type"`
			ID        string          `json:"id"`
			Role      string          `json:"role"`
			Content   json.RawMessage `json:"content"`
			CallID    string          `json:"call_id"`
			Name      string          `json:"name"`
			Arguments string          `json:"arguments"`
			Output    json.RawMessage `json:"output"`
			Summary   []struct {
				Text string `json:"text"`
			} `json:"summary"`
		}
		if json.Unmarshal(it, &x) != nil {
			return nil, nil, badRequest(param, "%s must be an input item (a message, function_call, function_call_output or reasoning).", param)
		}
		switch x.Type {
		case "", "message":
			if x.Role == "" {
				return nil, nil, badRequest(param+".role", "%s.role is required.", param)
			}
			text, aerr := responseContent(x.Content, param+".content")
			if aerr != nil {
				return nil, nil, aerr
			}
			content, _ := json.Marshal(text)
			m := chatMessage{Role: x.Role, Content: content}
			if x.Role == "assistant" && reasoning != nil {
				m.ReasoningContent, reasoning = reasoning, nil
			}
			msgs = append(msgs, m)
		case "function_call":
			if x.Name == "" || x.CallID == "" {
				return nil, nil, badRequest(param, "%s: a function_call needs call_id and name.", param)
			}
			call := toolCallOut{ID: x.CallID, Type: "function", Function: toolCallFunction{Name: x.Name, Arguments: x.Arguments}}
			// Calls join the assistant message before them, as one turn.
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
				var calls []toolCallOut
				json.Unmarshal(msgs[n-1].ToolCalls, &calls)
				msgs[n-1].ToolCalls, _ = json.Marshal(append(calls, call))
			} else {
				tc, _ := json.Marshal([]toolCallOut{call})
				m := chatMessage{Role: "assistant", ToolCalls: tc}
				if reasoning != nil {
					m.ReasoningContent, reasoning = reasoning, nil
				}
				msgs = append(msgs, m)
			}
		case "function_call_output":
			if x.CallID == "" {
				return nil, nil, badRequest(param+".call_id", "%s.call_id is required.", param)
			}
			text, aerr := responseContent(x.Output, param+".output")
			if aerr != nil {
				return nil, nil, aerr
			}
			content, _ := json.Marshal(text)
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: x.CallID, Content: content})
		case "reasoning":
			var parts []string
			for _, s := range x.Summary {
				parts = append(parts, s.Text)
			}
			var content []struct {
				Text string `json:"text"`
			}
			json.Unmarshal(x.Content, &content)
			for _, c := range content {
				parts = append(parts, c.Text)
			}
			r := strings.Join(parts, "\n")
			reasoning = &r
		default:
			return nil, nil, badRequest(param+".type", "%s.type: %q items are not supported (use message, function_call, function_call_output or reasoning).", param, x.Type)
		}
		items = append(items, withID(it, x.ID, x.Type))
	}
	if len(msgs) == 0 {
		return nil, nil, badRequest("input", "input must hold at least one message.")
	}
	return msgs, items, nil
}

// withID is an input item with an id (kept if it had one).
func withID(item json.RawMessage, id, typ string) json.RawMessage {
	if id != "" {
		return item
	}
	var m map[string]any
	if json.Unmarshal(item, &m) != nil {
		return item
	}
	prefix := map[string]string{"function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}[typ]
	if prefix == "" {
		prefix = "msg_"
	}
	m["id"] = newID(prefix)
	if typ == "" {
		m["type"] = "message"
	}
	out, _ := json.Marshal(m)
	return out
}

// responseContent reads a message's content or a call's output: a string, or a list of
// text parts (input_text, output_text, text), joined with newlines.
func responseContent(raw json.RawMessage, param string) (string, *apiError) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", badRequest(param, "%s must be a string or a list of content parts.", param)
	}
	texts := make([]string, 0, len(parts))
	for k, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
		default:
			return "", badRequest(fmt.Sprintf("%s[%d].type", param, k), "%s[%d].type: only text parts are supported (input_text, output_text), got %q.", param, k, p.Type)
		}
		if p.Text != nil {
			texts = append(texts, *p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// responseTools converts the Responses API's flat function tools to chat's.
func responseTools(raw json.RawMessage) (json.RawMessage, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var list []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      *bool           `json:"strict"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return nil, badRequest("tools", "tools must be a list of tools.")
	}
	type fn struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	}
	out := make([]map[string]any, 0, len(list))
	for i, t := range list {
		if t.Type != "function" {
			return nil, badRequest(fmt.Sprintf("tools[%d].type", i), "tools[%d].type: only function tools are supported, got %q.", i, t.Type)
		}
		out = append(out, map[string]any{"type": "function", "function": fn{t.Name, t.Description, t.Parameters, t.Strict}})
	}
	b, _ := json.Marshal(out)
	return b, nil
}

// responseToolChoice converts tool_choice ({"type": "function", "name": …} in this API).
func responseToolChoice(raw json.RawMessage) (json.RawMessage, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return raw, nil
	}
	var obj struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &obj) != nil || obj.Type != "function" || obj.Name == "" {
		return nil, badRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}.")
	}
	b, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": obj.Name}})
	return b, nil
}

// responseTextFormat converts text.format to chat's response_format.
func responseTextFormat(raw json.RawMessage) (json.RawMessage, *apiError) {
	var f struct {
		Type   string          `json:"type"`
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	}
	if json.Unmarshal(raw, &f) != nil {
		return nil, badRequest("text.format", "text.format must be an object {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}.")
	}
	switch f.Type {
	case "text", "json_object":
		b, _ := json.Marshal(map[string]string{"type": f.Type})
		return b, nil
	case "json_schema":
		if isNull(f.Schema) {
			return nil, badRequest("text.format.schema", "text.format.schema is required for type json_schema.")
		}
		b, _ := json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": f.Name, "schema": f.Schema, "strict": f.Strict}})
		return b, nil
	}
	return nil, badRequest("text.format.type", "text.format type %q is not supported (use text, json_object or json_schema).", f.Type)
}

// Output items.

type outputContent struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations,omitempty"`
}

// MarshalJSON writes output_text's annotations and logprobs, empty lists as OpenAI has them.
func (c outputContent) MarshalJSON() ([]byte, error) {
	if c.Type != "output_text" {
		return json.Marshal(map[string]string{"type": c.Type, "text": c.Text})
	}
	return json.Marshal(map[string]any{"type": c.Type, "text": c.Text, "annotations": []any{}, "logprobs": []any{}})
}

type outputItem struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Status    string          `json:"status"`
	Role      string          `json:"role,omitempty"`
	Content   []outputContent `json:"content,omitempty"`
	Summary   []any           `json:"summary,omitempty"`
	CallID    string          `json:"call_id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments *string         `json:"arguments,omitempty"`

	text strings.Builder // the item's text so far (reasoning, message, arguments)
}

// snapshot is the item as sent: its text in place, status as given.
func (it *outputItem) snapshot(status string) outputItem {
	out := outputItem{ID: it.ID, Type: it.Type, Status: status, Role: it.Role, CallID: it.CallID, Name: it.Name}
	text := it.text.String()
	switch it.Type {
	case "message":
		out.Content = []outputContent{{Type: "output_text", Text: text, Annotations: []any{}}}
		if status == "in_progress" && text == "" {
			out.Content = []outputContent{}
		}
	case "reasoning":
		out.Summary = []any{}
		out.Content = []outputContent{{Type: "reasoning_text", Text: text}}
	case "function_call":
		out.Arguments = &text
	}
	return out
}

// MarshalJSON writes the reasoning item's empty summary, which omitempty would drop.
func (it outputItem) MarshalJSON() ([]byte, error) {
	type plain outputItem
	b, err := json.Marshal(plain(it))
	if err == nil && it.Type == "reasoning" && it.Summary != nil && len(it.Summary) == 0 {
		b = append(b[:len(b)-1], []byte(`,"summary":[]}`)...)
	}
	return b, err
}

// respBuilder turns a choice's parsed output into output items, and, for a stream, into
// events.
type respBuilder struct {
	h     *handler
	items []*outputItem
	open  *outputItem // the item text goes to now
	sse   *sseWriter  // the stream; nil: not streamed
	seq   int         // the next event's sequence_number
}

// delta sends a text or arguments delta event of the open item (contentIndex < 0: none;
// logprobs: with an empty list) as encoding/json would write its map (keys sorted),
// without a map per token.
func (b *respBuilder) delta(typ string, contentIndex int, delta string, logprobs bool) error {
	if b.sse == nil {
		return nil
	}
	if b.sse.err != nil {
		return b.sse.err
	}
	e := b.sse.begin(typ)
	e = append(e, '{')
	if contentIndex >= 0 {
		e = append(e, `"content_index":`...)
		e = strconv.AppendInt(e, int64(contentIndex), 10)
		e = append(e, ',')
	}
	e = append(e, `"delta":`...)
	e = appendJSONString(e, delta)
	e = append(e, `,"item_id":`...)
	e = appendJSONString(e, b.open.ID)
	if logprobs {
		e = append(e, `,"logprobs":[]`...)
	}
	e = append(e, `,"output_index":`...)
	e = strconv.AppendInt(e, int64(len(b.items)-1), 10)
	e = append(e, `,"sequence_number":`...)
	e = strconv.AppendInt(e, int64(b.seq), 10)
	b.seq++
	e = append(e, `,"type":`...)
	e = appendJSONString(e, typ)
	return b.sse.commit(append(e, '}'))
}

// send sends an event of the stream with its type and sequence number.
func (b *respBuilder) send(typ string, fields map[string]any) error {
	if b.sse == nil {
		return nil
	}
	fields["type"], fields["sequence_number"] = typ, b.seq
	b.seq++
	return b.sse.event(typ, fields)
}

// start opens a new item.
func (b *respBuilder) start(it *outputItem) error {
	if err := b.close(); err != nil {
		return err
	}
	b.items = append(b.items, it)
	b.open = it
	idx := len(b.items) - 1
	if err := b.send("response.output_item.added", map[string]any{"output_index": idx, "item": it.snapshot("in_progress")}); err != nil {
		return err
	}
	switch it.Type {
	case "message":
		return b.send("response.content_part.added", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0,
			"part": outputContent{Type: "output_text", Text: "", Annotations: []any{}}})
	case "reasoning":
		return b.send("response.content_part.added", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0,
			"part": outputContent{Type: "reasoning_text", Text: ""}})
	}
	return nil
}

// close ends the open item.
func (b *respBuilder) close() error {
	it := b.open
	if it == nil {
		return nil
	}
	b.open = nil
	idx := len(b.items) - 1
	text := it.text.String()
	status := "completed"
	if it.Status == "incomplete" {
		status = "incomplete"
	}
	it.Status = status
	var err error
	switch it.Type {
	case "message":
		err = b.send("response.output_text.done", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0, "text": text, "logprobs": []any{}})
		if err == nil {
			err = b.send("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0,
				"part": outputContent{Type: "output_text", Text: text, Annotations: []any{}}})
		}
	case "reasoning":
		err = b.send("response.reasoning_text.done", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0, "text": text})
		if err == nil {
			err = b.send("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0,
				"part": outputContent{Type: "reasoning_text", Text: text}})
		}
	case "function_call":
		err = b.send("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": idx, "name": it.Name, "arguments": text})
	}
	if err != nil {
		return err
	}
	return b.send("response.output_item.done", map[string]any{"output_index": idx, "item": it.snapshot(status)})
}

// add takes one piece of parsed output.
func (b *respBuilder) add(out parsed) error {
	if r := out.reasoning; r != "" {
		if b.open == nil || b.open.Type != "reasoning" {
			if err := b.start(&outputItem{ID: newID("rs_"), Type: "reasoning"}); err != nil {
				return err
			}
		}
		b.open.text.WriteString(r)
		if err := b.delta("response.reasoning_text.delta", 0, r, false); err != nil {
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
			if b.open == nil || b.open.Type != "message" {
				if err = b.start(&outputItem{ID: newID("msg_"), Type: "message", Role: "assistant"}); err != nil {
					return err
				}
			}
			b.open.text.WriteString(ev.text)
			err = b.delta("response.output_text.delta", 0, ev.text, true)
		case evCallStart:
			err = b.start(&outputItem{ID: newID("fc_"), Type: "function_call", CallID: newID("call_"), Name: ev.text})
		case evCallArgs:
			if b.open == nil || b.open.Type != "function_call" {
				continue
			}
			b.open.text.WriteString(ev.text)
			err = b.delta("response.function_call_arguments.delta", -1, ev.text, false)
		case evCallEnd:
			err = b.close()
		case evCallBroken:
			b.h.unparsedCall()
			if b.sse == nil {
				// Not streamed: the call that did not parse becomes text again.
				if n := len(b.items); n > 0 && b.items[n-1].Type == "function_call" {
					b.items, b.open = b.items[:n-1], nil
				}
				err = b.add(parsed{events: []toolEvent{{kind: evText, text: ev.raw}}})
			} else if b.open != nil && b.open.Type == "function_call" {
				b.open.Status = "incomplete"
				err = b.close()
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// response is the response object for the items so far.
func (rs *responseJob) response(status string, items []*outputItem, u *usage, reasoningTokens int, finish string) map[string]any {
	req := rs.req
	out := make([]outputItem, 0, len(items))
	for _, it := range items {
		st := it.Status
		if st == "" {
			st = "in_progress"
		}
		out = append(out, it.snapshot(st))
	}
	var instructions any
	if req.Instructions != nil {
		instructions = *req.Instructions
	}
	var prev any
	if req.PreviousResponseID != "" {
		prev = req.PreviousResponseID
	}
	tools := json.RawMessage("[]")
	if !isNull(req.Tools) {
		tools = req.Tools
	}
	toolChoice := json.RawMessage(`"auto"`)
	if !isNull(req.ToolChoice) {
		toolChoice = req.ToolChoice
	}
	format := json.RawMessage(`{"type":"text"}`)
	if req.Text != nil && !isNull(req.Text.Format) {
		format = req.Text.Format
	}
	var effort json.RawMessage = json.RawMessage("null")
	if req.Reasoning != nil && !isNull(req.Reasoning.Effort) {
		effort = req.Reasoning.Effort
	}
	metadata := req.Metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	resp := map[string]any{
		"id": rs.id, "object": "response", "created_at": rs.created, "status": status, "error": nil,
		"incomplete_details": nil, "instructions": instructions, "max_output_tokens": req.MaxOutputTokens,
		"model": rs.j.m.ID, "output": out, "parallel_tool_calls": req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		"previous_response_id": prev, "reasoning": map[string]any{"effort": effort, "summary": nil}, "store": rs.store,
		"temperature": req.Temperature, "top_p": req.TopP, "text": map[string]any{"format": format},
		"tool_choice": toolChoice, "tools": tools, "truncation": "disabled", "metadata": metadata, "usage": nil,
	}
	if req.User != "" {
		resp["user"] = req.User
	}
	if status == "incomplete" && finish == string(llm.FinishLength) {
		resp["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
	}
	if u != nil {
		resp["usage"] = map[string]any{
			"input_tokens": u.PromptTokens, "input_tokens_details": map[string]int{"cached_tokens": u.PromptTokensDetails.CachedTokens},
			"output_tokens": u.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": reasoningTokens},
			"total_tokens": u.TotalTokens,
		}
	}
	return resp
}

// runResponse generates the response, streamed or not, and stores it when asked.
func (h *handler) runResponse(w http.ResponseWriter, r *http.Request, info *reqInfo, rs *responseJob) {
	j := rs.j
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c, aerr := h.startSingle(ctx, j)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	defer c.st.Close()
	c.worker(w)

	b := &respBuilder{h: h}
	var sse *sseWriter
	if j.stream {
		sse = h.newSSE(w)
		b.sse = sse
		if b.send("response.created", map[string]any{"response": rs.response("in_progress", nil, nil, 0, "")}) != nil ||
			b.send("response.in_progress", map[string]any{"response": rs.response("in_progress", nil, nil, 0, "")}) != nil {
			return
		}
	}
	var reasoning strings.Builder
	aerr = h.runSingle(ctx, r, info, j, c, sse, func(out parsed, _ *tokenLogprob) error {
		reasoning.WriteString(out.reasoning)
		return b.add(out)
	})
	if aerr == nil {
		if err := b.close(); err != nil {
			aerr = errClientGone
		}
	}
	if aerr != nil {
		if aerr == errClientGone {
			return
		}
		if sse != nil {
			b.send("error", map[string]any{"code": aerr.code, "message": aerr.msg, "param": nilIfEmpty(aerr.param)})
			failed := rs.response("failed", b.items, nil, 0, "")
			failed["error"] = map[string]string{"code": cmp.Or(aerr.code, "server_error"), "message": aerr.msg}
			b.send("response.failed", map[string]any{"response": failed})
			return
		}
		writeError(w, aerr)
		return
	}

	h.requestDone(j, []*choice{c})
	u := j.usage([]*choice{c})
	status := "completed"
	if c.finish == string(llm.FinishLength) {
		status = "incomplete"
	}
	rt := 0
	if reasoning.Len() > 0 {
		rt = len(j.m.Tokenizer.Encode(reasoning.String(), false, false))
	}
	resp := rs.response(status, b.items, &u, rt, c.finish)
	if rs.store {
		if err := h.saveResponse(r.Context(), rs, resp, b.items); err != nil {
			h.log.Error("storing a response failed", "id", rs.id, "err", err)
			aerr := &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "Storing the response failed: " + err.Error()}
			if sse != nil {
				b.send("error", map[string]any{"code": "server_error", "message": aerr.msg, "param": nil})
				return
			}
			writeError(w, aerr)
			return
		}
	}
	if sse != nil {
		typ := "response.completed"
		if status == "incomplete" {
			typ = "response.incomplete"
		}
		b.send(typ, map[string]any{"response": resp})
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// saveResponse stores a finished response with the conversation through it.
func (h *handler) saveResponse(ctx context.Context, rs *responseJob, resp map[string]any, items []*outputItem) error {
	history := rs.history
	var msg *chatMessage
	for _, it := range items {
		if msg == nil {
			msg = &chatMessage{Role: "assistant"}
		}
		text := it.text.String()
		switch it.Type {
		case "reasoning":
			msg.ReasoningContent = &text
		case "message":
			msg.Content, _ = json.Marshal(text)
		case "function_call":
			var calls []toolCallOut
			json.Unmarshal(msg.ToolCalls, &calls)
			msg.ToolCalls, _ = json.Marshal(append(calls, toolCallOut{ID: it.CallID, Type: "function", Function: toolCallFunction{Name: it.Name, Arguments: text}}))
		}
	}
	if msg != nil {
		history = append(append([]chatMessage(nil), history...), *msg)
	}
	respJSON, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	data, err := json.Marshal(storedResponse{V: storedVersion, Response: respJSON, Input: rs.input, History: history})
	if err != nil {
		return err
	}
	return h.store.Put(ctx, rs.id, data)
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
