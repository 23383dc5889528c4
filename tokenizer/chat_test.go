package tokenizer

import (
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
		{"qwen2", []Message{{"user", "Why?"}, {"assistant", "<think>\nreasoning\n</think>\n\nAnswer"}}, false, "testdata/qwen3_think.txt"},
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
