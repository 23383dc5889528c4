package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ardanlabs/jinja"
)

// Message is one chat turn, with the fields Hugging Face chat templates read.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Name is the speaker's name (optional).
	Name string `json:"name,omitempty"`
	// ToolCalls are an assistant turn's tool calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool turn answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Reasoning is an assistant turn's reasoning, sent back as reasoning_content
	// (templates that think render or drop it).
	Reasoning string `json:"reasoning_content,omitempty"`
}

// ToolCall is one call of a tool in an assistant turn.
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is the JSON text of the arguments. A template receives an object
	// decoded (as vLLM passes it, so that "| tojson" writes it back), anything else as
	// the string.
	Arguments string `json:"arguments"`
}

// ChatOptions are a template's inputs besides the messages.
type ChatOptions struct {
	AddGenerationPrompt bool
	// Tools are the tools the model may call, each as its JSON object
	// ({"type": "function", "function": {...}}), passed as the template's "tools"
	// (keys in their order).
	Tools []json.RawMessage
	// Vars are further template variables: chat_template_kwargs (enable_thinking …) and
	// reasoning_effort. They may not replace messages, tools, add_generation_prompt,
	// bos_token or eos_token.
	Vars map[string]json.RawMessage
}

// ErrNoChatTemplate is returned by ApplyChatTemplate when the model has no template.
var ErrNoChatTemplate = errors.New("tokenizer: model has no chat template")

// ApplyChatTemplate renders the model's chat template with messages,
// add_generation_prompt, and the model's bos_token/eos_token texts.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.ApplyChat(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// ApplyChat renders the model's chat template with messages and options.
func (t *Tokenizer) ApplyChat(msgs []Message, opts ChatOptions) (string, error) {
	if t.chatTemplate == "" {
		return "", ErrNoChatTemplate
	}
	return RenderChat(t.chatTemplate, msgs, opts, t.BOSText(), t.EOSText())
}

// BOSText is the text of the beginning-of-sequence token templates write as bos_token.
func (t *Tokenizer) BOSText() string {
	if t.hfBOSText != "" {
		return t.hfBOSText
	}
	return t.TokenText(t.bos)
}

// EOSText is the text of the end-of-sequence token templates write as eos_token.
func (t *Tokenizer) EOSText() string {
	if t.hfEOSText != "" {
		return t.hfEOSText
	}
	return t.TokenText(t.eos)
}

// RenderChatTemplate renders a Jinja chat template (Hugging Face conventions:
// messages, add_generation_prompt, bos_token, eos_token; raise_exception,
// strftime_now, namespace and tojson are available).
func RenderChatTemplate(tmpl string, msgs []Message, addGenerationPrompt bool, bosToken, eosToken string) (string, error) {
	return RenderChat(tmpl, msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt}, bosToken, eosToken)
}

// RenderChat renders a Jinja chat template as Hugging Face's apply_chat_template does:
// messages (with their tool calls, tool call ids, names and reasoning where present),
// tools, add_generation_prompt, bos_token, eos_token, and the extra variables.
func RenderChat(tmpl string, msgs []Message, opts ChatOptions, bosToken, eosToken string) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("tokenizer: chat template cannot be rendered: panic: %v", r)
		}
	}()
	ct, err := jinja.Compile(tmpl)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template cannot be parsed: %w", err)
	}
	data := map[string]jinja.Value{}
	for k, raw := range opts.Vars {
		switch k {
		case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token":
			return "", fmt.Errorf("tokenizer: the template variable %q cannot be set", k)
		}
		v, err := jsonValue(raw)
		if err != nil {
			return "", fmt.Errorf("tokenizer: template variable %q: %w", k, err)
		}
		data[k] = v
	}
	messages := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		dict := d.AsDict()
		dict.Set("role", jinja.NewString(m.Role))
		dict.Set("content", jinja.NewString(m.Content))
		if m.Name != "" {
			dict.Set("name", jinja.NewString(m.Name))
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]jinja.Value, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				fn := jinja.NewDict()
				fn.AsDict().Set("name", jinja.NewString(c.Name))
				args := jinja.NewString(c.Arguments)
				if v, err := jsonValue([]byte(c.Arguments)); err == nil && v.IsDict() {
					args = v
				}
				fn.AsDict().Set("arguments", args)
				call := jinja.NewDict()
				call.AsDict().Set("id", jinja.NewString(c.ID))
				call.AsDict().Set("type", jinja.NewString("function"))
				call.AsDict().Set("function", fn)
				calls[j] = call
			}
			dict.Set("tool_calls", jinja.NewList(calls))
		}
		if m.ToolCallID != "" {
			dict.Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.Reasoning != "" {
			dict.Set("reasoning_content", jinja.NewString(m.Reasoning))
		}
		messages[i] = d
	}
	data["messages"] = jinja.NewList(messages)
	if len(opts.Tools) > 0 {
		tools := make([]jinja.Value, len(opts.Tools))
		for i, raw := range opts.Tools {
			v, err := jsonValue(raw)
			if err != nil {
				return "", fmt.Errorf("tokenizer: tool %d: %w", i, err)
			}
			tools[i] = v
		}
		data["tools"] = jinja.NewList(tools)
	}
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	data["bos_token"] = jinja.NewString(bosToken)
	data["eos_token"] = jinja.NewString(eosToken)
	s, err := ct.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template cannot be rendered: %w", err)
	}
	return s, nil
}

// jsonValue decodes JSON into a template value, objects with their keys in order.
func jsonValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := jsonNext(dec, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("data after the value")
	}
	return v, nil
}

func jsonNext(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > 256 {
		return jinja.Undefined(), errors.New("nested too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				v, err := jsonNext(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := jsonNext(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", t)
	default:
		return jinja.FromGoValue(t), nil
	}
}
