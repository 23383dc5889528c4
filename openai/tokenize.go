package openai

import (
	"encoding/json"
	"net/http"
)

type tokenizeRequest struct {
	Model               string                     `json:"model"`
	Prompt              *string                    `json:"prompt"`
	Messages            []chatMessage              `json:"messages"`
	AddGenerationPrompt *bool                      `json:"add_generation_prompt"`
	AddSpecialTokens    *bool                      `json:"add_special_tokens"`
	ReturnTokenStrs     bool                       `json:"return_token_strs"`
	Tools               json.RawMessage            `json:"tools"`
	ChatTemplateKwargs  map[string]json.RawMessage `json:"chat_template_kwargs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs,omitempty"`
}

// MaxTokenizeBodyBytes bounds the body of /tokenize and /detokenize (or
// Options.MaxBodyBytes when smaller). Their answer is the whole token list, with no
// context length to stop at, so the body bounds their work: a MiB of text takes up to
// ~100 MB while it is tokenized (SentencePiece vocabularies the most).
const MaxTokenizeBodyBytes = 1 << 20

// tokenize serves vLLM's POST /tokenize: a prompt (add_special_tokens
// defaults to true) or chat messages (rendered as for chat completions).
func (h *handler) tokenize(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req tokenizeRequest
	if aerr := h.readJSON(w, r, min(h.maxBody, MaxTokenizeBodyBytes), &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var tokens []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		aerr = badRequest("prompt", "Send either prompt or messages, not both.")
	case req.Prompt != nil:
		tokens, _ = encodeText(m.Tokenizer, *req.Prompt, req.AddSpecialTokens, false, 0)
	case req.Messages != nil:
		// As vLLM's: the chat prompt as chat completions render it, tools included.
		creq := chatRequest{Tools: req.Tools, ChatTemplateKwargs: req.ChatTemplateKwargs}
		var plan *toolPlan
		var vars map[string]json.RawMessage
		if plan, aerr = m.toolPlan(&creq); aerr == nil {
			if vars, aerr = creq.templateVars(); aerr == nil {
				var fell []string
				tokens, _, fell, aerr = m.chatPrompt(chatInput{messages: req.Messages, addGenerationPrompt: req.AddGenerationPrompt,
					addSpecial: req.AddSpecialTokens, tools: plan, vars: vars}, 0)
				h.templateFallback(m, fell)
			}
		}
	default:
		aerr = badRequest("prompt", "Send a prompt or messages to tokenize.")
	}
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	info.promptTokens = len(tokens)
	resp := tokenizeResponse{Count: len(tokens), MaxModelLen: m.ContextLen, Tokens: tokens}
	if resp.Tokens == nil {
		resp.Tokens = []int32{}
	}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(tokens))
		for i, id := range tokens {
			resp.TokenStrs[i] = m.Tokenizer.TokenText(id)
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// detokenize serves vLLM's POST /detokenize: token ids to text.
func (h *handler) detokenize(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req struct {
		Model  string  `json:"model"`
		Tokens []int64 `json:"tokens"`
	}
	if aerr := h.readJSON(w, r, min(h.maxBody, MaxTokenizeBodyBytes), &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	vocab := int64(m.Tokenizer.VocabSize())
	ids := make([]int32, len(req.Tokens))
	for i, id := range req.Tokens {
		if id < 0 || id >= vocab {
			writeError(w, badRequest("tokens", "tokens[%d]: token id %d is outside the vocabulary [0, %d).", i, id, vocab))
			return
		}
		ids[i] = int32(id)
	}
	writeJSON(w, http.StatusOK, struct {
		Prompt string `json:"prompt"`
	}{m.Tokenizer.Decode(ids)})
}
