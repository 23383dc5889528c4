package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"tandem/grammar"
	"tandem/tokenizer"
)

// Tool calling: the tools a request offers, the tool_choice, the formats models write
// calls in, and the grammars that force or constrain those calls.

// toolDef is one function tool of a request.
type toolDef struct {
	name        string
	description string
	params      json.RawMessage // the arguments' JSON Schema
	strict      bool
	raw         json.RawMessage // the tool as the client sent it, for the chat template
}

var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,64}$`)

// parseTools reads the tools field: a list of {"type": "function", "function": {...}}.
func parseTools(raw json.RawMessage) ([]toolDef, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, badRequest("tools", "tools must be a list of tools.")
	}
	tools := make([]toolDef, 0, len(list))
	seen := map[string]bool{}
	for i, t := range list {
		param := fmt.Sprintf("tools[%d]", i)
		var td struct {
			Type     string `json:"type"`
			Function *struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
				Strict      *bool           `json:"strict"`
			} `json:"function"`
		}
		if json.Unmarshal(t, &td) != nil {
			return nil, badRequest(param, "%s must be an object {\"type\": \"function\", \"function\": {...}}.", param)
		}
		if td.Type != "function" {
			return nil, badRequest(param+".type", "%s.type: only function tools are supported, got %q.", param, td.Type)
		}
		if td.Function == nil {
			return nil, badRequest(param+".function", "%s.function is required.", param)
		}
		f := td.Function
		if !toolNameRE.MatchString(f.Name) {
			return nil, badRequest(param+".function.name", "%s.function.name must be 1 to 64 letters, digits, '_', '-' or '.', got %q.", param, f.Name)
		}
		if seen[f.Name] {
			return nil, badRequest(param+".function.name", "%s.function.name: two tools are named %q.", param, f.Name)
		}
		seen[f.Name] = true
		d := toolDef{name: f.Name, description: f.Description, params: f.Parameters, raw: t, strict: f.Strict != nil && *f.Strict}
		if isNull(d.params) {
			d.params = json.RawMessage(`{"type": "object", "properties": {}}`)
		}
		if d.strict {
			// Strict arguments are constrained to the schema: refuse what cannot be.
			if of, aerr := schemaFormat(param+".function.parameters", d.params, false); aerr != nil || of == nil {
				return nil, aerr
			}
		}
		tools = append(tools, d)
	}
	return tools, nil
}

// toolChoice is how the model may use the tools.
type toolChoice struct {
	mode string // "none", "auto", "required" or "function"
	name string // mode "function": the tool it must call
}

func parseToolChoice(raw json.RawMessage, tools []toolDef) (toolChoice, *apiError) {
	if isNull(raw) {
		if len(tools) > 0 {
			return toolChoice{mode: "auto"}, nil
		}
		return toolChoice{mode: "none"}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto":
			return toolChoice{mode: s}, nil
		case "required":
			if len(tools) == 0 {
				return toolChoice{}, badRequest("tool_choice", "tool_choice \"required\" needs tools.")
			}
			return toolChoice{mode: s}, nil
		}
		return toolChoice{}, badRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}, got %q.", s)
	}
	var obj struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &obj) != nil || obj.Type != "function" || obj.Function == nil {
		if obj.Type != "" && obj.Type != "function" {
			return toolChoice{}, badRequest("tool_choice.type", "tool_choice type %q is not supported (use a function).", obj.Type)
		}
		return toolChoice{}, badRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.")
	}
	for _, t := range tools {
		if t.name == obj.Function.Name {
			return toolChoice{mode: "function", name: t.name}, nil
		}
	}
	return toolChoice{}, badRequest("tool_choice.function.name", "tool_choice names the function %q, which is not among the tools.", obj.Function.Name)
}

// toolFormat is how a model family writes tool calls.
type toolFormat struct {
	name string
	// argsKey is the key of the arguments in a call's object.
	argsKey string
	// start is the text that opens a call (or list of calls), "" when calls are only
	// recognised at the start of the output.
	start string
	// instructions is the system text that presents the tools when the chat template
	// does not (the tools' JSON follows it).
	instructions string
}

// Tool-call formats, by --tool-call-parser name.
var toolFormats = map[string]*toolFormat{
	"hermes": {name: "hermes", argsKey: "arguments", start: "<tool_call>",
		instructions: "You may call one or more functions to assist with the user query. The functions are:\n%s\nFor each function call, return a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"},
	"llama3_json": {name: "llama3_json", argsKey: "parameters",
		instructions: "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n%s"},
	"mistral": {name: "mistral", argsKey: "arguments", start: "[TOOL_CALLS]",
		instructions: "You may call functions. The functions are:\n%s\nTo call functions, answer [TOOL_CALLS] followed by a JSON list of calls: [TOOL_CALLS][{\"name\": <function-name>, \"arguments\": <args-json-object>}]"},
}

// ToolCallParsers are the names --tool-call-parser accepts: a format, "auto" (the
// default: chosen from the chat template) or "none" (no tool calling).
var ToolCallParsers = []string{"auto", "hermes", "llama3_json", "mistral", "none"}

// ReasoningParsers are the names --reasoning-parser accepts: "think" (a <think>…</think>
// block before the answer), "auto" (the default: think when the chat template writes
// <think>) or "none".
var ReasoningParsers = []string{"auto", "think", "none"}

// toolFormatFor resolves a --tool-call-parser name for a chat template.
func toolFormatFor(parser, template string) *toolFormat {
	switch parser {
	case "none":
		return nil
	case "", "auto":
		switch {
		case strings.Contains(template, "<tool_call>"):
			return toolFormats["hermes"]
		case strings.Contains(template, "[TOOL_CALLS]"):
			return toolFormats["mistral"]
		case strings.Contains(template, "<|python_tag|>"), strings.Contains(template, "<|start_header_id|>"):
			return toolFormats["llama3_json"]
		}
		return nil
	}
	return toolFormats[parser]
}

// writeCall writes a call as the format's model writes it, for history the chat
// template cannot write itself.
func (f *toolFormat) writeCall(name, args string) string {
	if strings.TrimSpace(args) == "" {
		args = "{}"
	}
	obj := fmt.Sprintf(`{"name": %q, %q: %s}`, name, f.argsKey, args)
	switch f.name {
	case "hermes":
		return "<tool_call>\n" + obj + "\n</tool_call>"
	case "mistral":
		return "[TOOL_CALLS][" + obj + "]"
	}
	return obj
}

// toolsText is the fallback system text presenting the tools.
func (f *toolFormat) toolsText(tools []toolDef) string {
	var sb strings.Builder
	for _, t := range tools {
		var buf bytes.Buffer
		json.Compact(&buf, t.raw)
		sb.WriteString(buf.String())
		sb.WriteByte('\n')
	}
	return fmt.Sprintf(f.instructions, sb.String())
}

// toolPlan is how a request uses tools: the format calls are written in, the tools,
// and how the output is constrained.
type toolPlan struct {
	format   *toolFormat
	tools    []toolDef
	choice   toolChoice
	parallel bool
}

// forced reports whether the output must be tool calls (required or a named function).
func (p *toolPlan) forced() bool { return p.choice.mode == "required" || p.choice.mode == "function" }

// constrained reports whether the calls need a grammar: forced, or a strict tool.
func (p *toolPlan) constrained() bool {
	if p.forced() {
		return true
	}
	for _, t := range p.tools {
		if t.strict {
			return true
		}
	}
	return false
}

// grammar adds the plan's grammar to b: forced calls; or, under auto, either content
// (the format asked for, or free text) or calls, each call's arguments constrained to
// its schema when strict or forced, to any JSON object otherwise.
func (p *toolPlan) grammar(b *grammar.Builder, content grammar.Expr, hasContent bool) (grammar.Expr, error) {
	f := p.format
	var objs []grammar.Expr
	for _, t := range p.tools {
		if p.choice.mode == "function" && t.name != p.choice.name {
			continue
		}
		var args grammar.Expr
		if t.strict || p.forced() {
			x, err := b.JSONSchema(t.params)
			if err != nil {
				return grammar.Expr{}, fmt.Errorf("tool %s: %w", t.name, err)
			}
			args = x
		} else {
			args = b.AnyJSONObject()
		}
		name, _ := json.Marshal(t.name)
		objs = append(objs, grammar.Seq(grammar.Lit(fmt.Sprintf(`{"name": %s, %q: `, name, f.argsKey)), args, grammar.Lit("}")))
	}
	obj := b.Rule("tool-call", grammar.Alt(objs...))
	repeat := func(first, sep grammar.Expr, each grammar.Expr) grammar.Expr {
		if !p.parallel || p.choice.mode == "function" {
			return grammar.Seq(first, each)
		}
		return grammar.Seq(first, each, grammar.Star(grammar.Seq(sep, each)))
	}
	var calls, afterStart grammar.Expr
	switch f.name {
	case "hermes":
		one := grammar.Seq(grammar.Lit("\n"), obj, grammar.Lit("\n</tool_call>"))
		calls = repeat(grammar.Lit("<tool_call>"), grammar.Lit("\n<tool_call>"), one)
		afterStart = repeat(grammar.Expr{}, grammar.Lit("\n<tool_call>"), one)
	case "llama3_json":
		calls = repeat(grammar.Expr{}, grammar.Lit("; "), obj)
	case "mistral":
		// The bare list: [TOOL_CALLS] is a control token in Mistral's vocabularies, which
		// a grammar over text cannot write; the parser takes a list at the start when
		// calls are forced.
		calls = grammar.Seq(grammar.Lit("["), repeat(grammar.Expr{}, grammar.Lit(", "), obj), grammar.Lit("]"))
	}
	if p.forced() {
		return calls, nil
	}
	if hasContent {
		return grammar.Alt(content, calls), nil
	}
	switch f.name {
	case "hermes": // text, then optionally calls from the first <tool_call> on
		return grammar.Alt(b.TextWithout(f.start), grammar.Seq(b.TextThrough(f.start), afterStart)), nil
	case "llama3_json": // calls, or text that does not begin like one
		plain := grammar.Opt(grammar.Seq(grammar.Class(true, '{', '{', ' ', ' ', '\t', '\n', '\r', '\r'), grammar.Star(grammar.AnyChar())))
		return grammar.Alt(calls, plain), nil
	}
	return grammar.Expr{}, fmt.Errorf("strict tools under tool_choice auto are not supported with the %s format (its marker is a control token); use tool_choice required or a named function: %w", f.name, grammar.ErrUnsupported)
}

// messagesForTemplate adapts the messages and tools to what the chat template writes:
// a template that does not mention tools gets them in a system message, in the format's
// words; one that does not write tool calls gets the calls in the assistant's text.
// It reports what it had to write itself.
func (p *toolPlan) messagesForTemplate(template string, msgs []tokenizer.Message) ([]tokenizer.Message, []string) {
	var fell []string
	if p == nil || p.format == nil {
		return msgs, nil
	}
	out := msgs
	if len(p.tools) > 0 && !strings.Contains(template, "tools") {
		fell = append(fell, "tools")
		text := p.format.toolsText(p.tools)
		out = make([]tokenizer.Message, 0, len(msgs)+1)
		if len(msgs) > 0 && msgs[0].Role == "system" {
			first := msgs[0]
			first.Content = first.Content + "\n\n" + text
			out = append(append(out, first), msgs[1:]...)
		} else {
			out = append(append(out, tokenizer.Message{Role: "system", Content: text}), msgs...)
		}
	}
	if !strings.Contains(template, "tool_calls") {
		copied := false
		for i, m := range out {
			if len(m.ToolCalls) == 0 {
				continue
			}
			if !copied {
				out = append([]tokenizer.Message(nil), out...)
				copied = true
				fell = append(fell, "tool_calls")
			}
			var parts []string
			if m.Content != "" {
				parts = append(parts, m.Content)
			}
			for _, c := range m.ToolCalls {
				parts = append(parts, p.format.writeCall(c.Name, c.Arguments))
			}
			m.Content, m.ToolCalls = strings.Join(parts, "\n"), nil
			out[i] = m
		}
	}
	return out, fell
}
