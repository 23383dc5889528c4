package tokenizer

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

var chatConversation = []Message{
	{Role: "system", Content: "You are a helpful assistant."},
	{Role: "user", Content: "Hello!"},
	{Role: "assistant", Content: "Hi there. How can I help?"},
	{Role: "user", Content: "  What is 2+2?\n"},
}

func TestApplyChatTemplate(t *testing.T) {
	cases := []struct {
		vocab  string
		msgs   []Message
		addGen bool
		golden string
	}{
		{"llama-bpe", chatConversation, true, "testdata/llama3_chat.txt"},
		{"qwen2", chatConversation, true, "testdata/qwen3_chat.txt"},
		{"qwen2", []Message{{Role: "user", Content: "Why?"}, {Role: "assistant", Content: "<think>\nreasoning\n</think>\n\nAnswer"}}, false, "testdata/qwen3_think.txt"},
	}
	for _, c := range cases {
		t.Run(c.golden, func(t *testing.T) {
			tk, _ := loadVocab(t, c.vocab)
			want, err := os.ReadFile(c.golden)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tk.ApplyChatTemplate(c.msgs, c.addGen)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("got:\n%q\nwant:\n%q", got, want)
			}
			// The rendered prompt must tokenize with its special tokens recognised.
			ids := tk.Encode(got, false, true)
			if !tk.IsControl(ids[0]) {
				t.Errorf("first token %d (%q) is not a control token", ids[0], tk.TokenText(ids[0]))
			}
		})
	}
}

func TestChatTemplateErrors(t *testing.T) {
	tk, _ := loadVocab(t, "tok512")
	if _, err := tk.ApplyChatTemplate(chatConversation, true); err == nil {
		t.Error("expected an error for a model without a template")
	}
	_, err := RenderChatTemplate("{% for m in messages %}", chatConversation, true, "", "")
	if err == nil || !strings.Contains(err.Error(), "chat template") {
		t.Errorf("unterminated block: err = %v", err)
	}
	_, err = RenderChatTemplate("{{ raise_exception('Only user and assistant roles are supported!') }}", chatConversation, true, "", "")
	if err == nil || !strings.Contains(err.Error(), "Only user and assistant") {
		t.Errorf("raise_exception: err = %v", err)
	}
}

func TestRenderChatTemplateFeatures(t *testing.T) {
	tmpl := `{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}{%- if m.role == 'system' -%}{%- continue -%}{%- endif -%}
{%- set ns.n = ns.n + 1 -%}[{{ ns.n }}:{{ m.role }}:{{ m.content | tojson }}]{%- if loop.last -%}{%- break -%}{%- endif -%}
{%- endfor -%}{{ bos_token }}{{ eos_token }}{% if add_generation_prompt %}>{% endif %}{{ strftime_now('%Y') | length }}`
	got, err := RenderChatTemplate(tmpl, chatConversation, true, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	want := `[1:user:"Hello!"][2:assistant:"Hi there. How can I help?"][3:user:"  What is 2+2?\n"]<s></s>>4`
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// Tools, assistant tool calls, tool results and template variables reach the template as
// Hugging Face's apply_chat_template passes them (Qwen3's real template).
func TestRenderChatTools(t *testing.T) {
	tk, _ := loadVocab(t, "qwen2")
	tool := []byte(`{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}`)
	msgs := []Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
		{Role: "tool", Content: `{"temp": 21}`, ToolCallID: "call_1"},
	}
	got, err := tk.ApplyChat(msgs, ChatOptions{AddGenerationPrompt: true, Tools: []json.RawMessage{tool},
		Vars: map[string]json.RawMessage{"enable_thinking": json.RawMessage("false")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Tools\n\nYou may call one or more functions",
		"<tools>\n" + `{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}` + "\n</tools>",
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
		"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>",
		"<|im_start|>assistant\n<think>\n\n</think>\n\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered prompt lacks %q:\n%s", want, got)
		}
	}
	if _, err := tk.ApplyChat(msgs, ChatOptions{Vars: map[string]json.RawMessage{"messages": json.RawMessage("[]")}}); err == nil {
		t.Error("a variable replaced messages")
	}
}
