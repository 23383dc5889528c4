package tokenizer

import (
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// Message is one chat turn.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ErrNoChatTemplate is returned by ApplyChatTemplate when the model has no template.
var ErrNoChatTemplate = errors.New("tokenizer: model has no chat template")

// ApplyChatTemplate renders the model's chat template with messages,
// add_generation_prompt, and the model's bos_token/eos_token texts.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	if t.chatTemplate == "" {
		return "", ErrNoChatTemplate
	}
	bos, eos := t.hfBOSText, t.hfEOSText
	if bos == "" {
		bos = t.TokenText(t.bos)
	}
	if eos == "" {
		eos = t.TokenText(t.eos)
	}
	return RenderChatTemplate(t.chatTemplate, msgs, addGenerationPrompt, bos, eos)
}

// RenderChatTemplate renders a Jinja chat template (Hugging Face conventions:
// messages, add_generation_prompt, bos_token, eos_token; raise_exception,
// strftime_now, namespace and tojson are available).
func RenderChatTemplate(tmpl string, msgs []Message, addGenerationPrompt bool, bosToken, eosToken string) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("tokenizer: chat template cannot be rendered: panic: %v", r)
		}
	}()
	ct, err := jinja.Compile(tmpl)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template cannot be parsed: %w", err)
	}
	messages := make([]any, len(msgs))
	for i, m := range msgs {
		messages[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	s, err := ct.Render(map[string]any{
		"messages":              messages,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             bosToken,
		"eos_token":             eosToken,
	})
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template cannot be rendered: %w", err)
	}
	return s, nil
}
