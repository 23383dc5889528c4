package openai_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/respjson"
)

// rawField decodes an extra (vLLM) field of an SDK response into v; absent is an error.
func rawField(t *testing.T, fields map[string]respjson.Field, name string, v any) {
	t.Helper()
	f, ok := fields[name]
	if !ok {
		t.Fatalf("no %q in the response", name)
	}
	if err := json.Unmarshal([]byte(f.Raw()), v); err != nil {
		t.Fatalf("%s = %s: %v", name, f.Raw(), err)
	}
}

func completionParams(prompt string, maxTokens int) sdk.CompletionNewParams {
	return sdk.CompletionNewParams{Model: "m", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		MaxTokens: sdk.Int(int64(maxTokens)), Temperature: sdk.Float(0)}
}

// return_token_ids gives the prompt's and the output's ids, streamed and not, and they are
// the tokens of the text; return_tokens_as_token_ids names logprob tokens by id.
func TestSDKReturnTokenIDs(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, nil)
	c := e.client()
	ids := option.WithJSONSet("return_token_ids", true)
	prompt := "The weather in Oslo"
	want := e.m.Tokenizer.Encode(prompt, true, true)

	out, err := c.Completions.New(testCtx(t), completionParams(prompt, 12), ids)
	if err != nil {
		t.Fatal(err)
	}
	var promptIDs, gen []int32
	rawField(t, out.Choices[0].JSON.ExtraFields, "prompt_token_ids", &promptIDs)
	rawField(t, out.Choices[0].JSON.ExtraFields, "token_ids", &gen)
	if !slices.Equal(promptIDs, want) || len(gen) != int(out.Usage.CompletionTokens) {
		t.Fatalf("prompt ids %v (want %v), %d ids for %d tokens", promptIDs, want, len(gen), out.Usage.CompletionTokens)
	}
	if whole := strings.ToValidUTF8(e.m.Tokenizer.Decode(append(slices.Clone(want), gen...)), "\uFFFD"); !strings.HasSuffix(whole, out.Choices[0].Text) {
		t.Errorf("the ids decode to %q, the text is %q", whole, out.Choices[0].Text)
	}
	stream := c.Completions.NewStreaming(testCtx(t), completionParams(prompt, 12), ids)
	var streamed, streamedPrompt []int32
	for stream.Next() {
		ch := stream.Current()
		var more []int32
		if f, ok := ch.Choices[0].JSON.ExtraFields["token_ids"]; ok && f.Raw() != "null" {
			rawField(t, ch.Choices[0].JSON.ExtraFields, "token_ids", &more)
		}
		if _, ok := ch.Choices[0].JSON.ExtraFields["prompt_token_ids"]; ok {
			if streamedPrompt != nil {
				t.Error("prompt_token_ids sent twice")
			}
			rawField(t, ch.Choices[0].JSON.ExtraFields, "prompt_token_ids", &streamedPrompt)
		}
		streamed = append(streamed, more...)
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(streamed, gen) || !slices.Equal(streamedPrompt, want) {
		t.Errorf("streamed ids %v, prompt %v; not streamed %v", streamed, streamedPrompt, gen)
	}

	// Chat: the prompt's ids at the top, the output's in the choice; streamed the same.
	params := sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")},
		MaxCompletionTokens: sdk.Int(10), Temperature: sdk.Float(0), Logprobs: sdk.Bool(true), TopLogprobs: sdk.Int(2)}
	chat, err := c.Chat.Completions.New(testCtx(t), params, ids, option.WithJSONSet("return_tokens_as_token_ids", true))
	if err != nil {
		t.Fatal(err)
	}
	var chatIDs []int32
	rawField(t, chat.JSON.ExtraFields, "prompt_token_ids", &promptIDs)
	rawField(t, chat.Choices[0].JSON.ExtraFields, "token_ids", &chatIDs)
	if len(promptIDs) != int(chat.Usage.PromptTokens) || len(chatIDs) != 10 {
		t.Errorf("chat: %d prompt ids for %d tokens, %d output ids", len(promptIDs), chat.Usage.PromptTokens, len(chatIDs))
	}
	for i, lp := range chat.Choices[0].Logprobs.Content {
		if lp.Token != fmt.Sprintf("token_id:%d", chatIDs[i]) || !strings.HasPrefix(lp.TopLogprobs[0].Token, "token_id:") {
			t.Errorf("logprob %d: token %q, top %q, id %d", i, lp.Token, lp.TopLogprobs[0].Token, chatIDs[i])
		}
	}
	_, chunks := streamAll(t, c, params, ids)
	var chatStreamed []int32
	for _, ch := range chunks {
		if len(ch.Choices) > 0 {
			if f, ok := ch.Choices[0].JSON.ExtraFields["token_ids"]; ok && f.Raw() != "null" {
				var more []int32
				json.Unmarshal([]byte(f.Raw()), &more)
				chatStreamed = append(chatStreamed, more...)
			}
		}
	}
	if !slices.Equal(chatStreamed, chatIDs) {
		t.Errorf("chat streamed ids %v, not streamed %v", chatStreamed, chatIDs)
	}
	if _, ok := chunks[0].JSON.ExtraFields["prompt_token_ids"]; !ok {
		t.Error("the chat stream's first chunk lacks prompt_token_ids")
	}
}

// prompt_logprobs: null for the first prompt token, then each token's logprob and rank
// with the best alternatives; echo with logprobs and max_tokens 0 scores the prompt alone.
func TestSDKPromptLogprobsAndEcho(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, nil)
	c := e.client()
	prompt := "One two three four"
	ptoks := e.m.Tokenizer.Encode(prompt, true, true)
	for _, stream := range []bool{false, true} {
		var fields map[string]respjson.Field
		if stream {
			s := c.Completions.NewStreaming(testCtx(t), completionParams(prompt, 3), option.WithJSONSet("prompt_logprobs", 2))
			for s.Next() {
				if f := s.Current().Choices[0].JSON.ExtraFields; f["prompt_logprobs"].Raw() != "" {
					if fields != nil {
						t.Error("prompt_logprobs streamed twice")
					}
					fields = f
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			out, err := c.Completions.New(testCtx(t), completionParams(prompt, 3), option.WithJSONSet("prompt_logprobs", 2))
			if err != nil {
				t.Fatal(err)
			}
			fields = out.Choices[0].JSON.ExtraFields
		}
		var plp []map[string]struct {
			Logprob float64 `json:"logprob"`
			Rank    int     `json:"rank"`
		}
		rawField(t, fields, "prompt_logprobs", &plp)
		if len(plp) != len(ptoks) || plp[0] != nil {
			t.Fatalf("stream %v: %d prompt logprobs for %d tokens (first %v)", stream, len(plp), len(ptoks), plp[0])
		}
		for k := 1; k < len(plp); k++ {
			mine, ok := plp[k][fmt.Sprint(ptoks[k])]
			if !ok || mine.Rank < 1 || mine.Logprob > 0 || len(plp[k]) < 2 || len(plp[k]) > 3 {
				t.Errorf("stream %v: position %d: %+v (token %d)", stream, k, plp[k], ptoks[k])
			}
		}
	}

	// echo: the text begins with the prompt; max_tokens 0 scores the prompt alone.
	out, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "m", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		MaxTokens: sdk.Int(0), Echo: sdk.Bool(true), Logprobs: sdk.Int(1), Temperature: sdk.Float(0)})
	if err != nil {
		t.Fatal(err)
	}
	ch := out.Choices[0]
	if ch.Text != prompt || len(ch.Logprobs.Tokens) != len(ptoks) || len(ch.Logprobs.TokenLogprobs) != len(ptoks) {
		t.Fatalf("echo, max_tokens 0: text %q, %d logprob tokens for %d prompt tokens", ch.Text, len(ch.Logprobs.Tokens), len(ptoks))
	}
	if raw := ch.Logprobs.JSON.TokenLogprobs.Raw(); !strings.HasPrefix(raw, "[null,") {
		t.Errorf("echo: the first prompt token has a logprob: %s", raw)
	}
	if strings.Join(ch.Logprobs.Tokens, "") != e.m.Tokenizer.Decode(ptoks) || ch.Logprobs.TextOffset[len(ptoks)-1] == 0 {
		t.Errorf("echo tokens %q, offsets %v", ch.Logprobs.Tokens, ch.Logprobs.TextOffset)
	}
	out, err = c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "m", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		MaxTokens: sdk.Int(4), Echo: sdk.Bool(true), Temperature: sdk.Float(0)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.Choices[0].Text, prompt) || len(out.Choices[0].Text) == len(prompt) {
		t.Errorf("echo with 4 tokens: %q", out.Choices[0].Text)
	}
	s := c.Completions.NewStreaming(testCtx(t), sdk.CompletionNewParams{Model: "m", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		MaxTokens: sdk.Int(4), Echo: sdk.Bool(true), Temperature: sdk.Float(0)})
	var text string
	for s.Next() {
		text += s.Current().Choices[0].Text
	}
	if s.Err() != nil || text != out.Choices[0].Text {
		t.Errorf("echo streamed %q (%v), not streamed %q", text, s.Err(), out.Choices[0].Text)
	}

	// Chat: prompt_logprobs at the top of the response.
	chat, err := c.Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")},
		MaxCompletionTokens: sdk.Int(2), Temperature: sdk.Float(0)}, option.WithJSONSet("prompt_logprobs", 0))
	if err != nil {
		t.Fatal(err)
	}
	var plp []map[string]any
	rawField(t, chat.JSON.ExtraFields, "prompt_logprobs", &plp)
	if len(plp) != int(chat.Usage.PromptTokens) || plp[0] != nil || len(plp[1]) != 1 {
		t.Errorf("chat prompt_logprobs: %d entries for %d prompt tokens: %v", len(plp), chat.Usage.PromptTokens, plp[:min(len(plp), 2)])
	}
}

// min_tokens holds back the end of generation, allowed_token_ids limits the tokens, streamed
// and not.
func TestSDKMinTokensAllowedTokens(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, nil)
	c := e.client()
	eos := e.m.Tokenizer.EOS()
	bias := map[string]int64{fmt.Sprint(eos): 100}
	params := completionParams("Hello", 20)
	params.LogitBias = bias
	out, err := c.Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if out.Usage.CompletionTokens != 1 || out.Choices[0].FinishReason != "stop" {
		t.Fatalf("with the EOS forced: %d tokens (%s)", out.Usage.CompletionTokens, out.Choices[0].FinishReason)
	}
	for _, stream := range []bool{false, true} {
		var n int64
		var finish string
		if stream {
			params.StreamOptions.IncludeUsage = sdk.Bool(true)
			s := c.Completions.NewStreaming(testCtx(t), params, option.WithJSONSet("min_tokens", 6))
			for s.Next() {
				ch := s.Current()
				if len(ch.Choices) > 0 && ch.Choices[0].FinishReason != "" {
					finish = string(ch.Choices[0].FinishReason)
				}
				if ch.Usage.CompletionTokens > 0 {
					n = ch.Usage.CompletionTokens
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			out, err := c.Completions.New(testCtx(t), params, option.WithJSONSet("min_tokens", 6))
			if err != nil {
				t.Fatal(err)
			}
			n, finish = out.Usage.CompletionTokens, string(out.Choices[0].FinishReason)
		}
		if n != 7 || finish != "stop" {
			t.Errorf("stream %v: min_tokens 6 with the EOS forced: %d tokens (%s), want 6 and the EOS", stream, n, finish)
		}
	}

	allowed := []int32{1000, 2000, 3000}
	for _, temp := range []float64{0, 1.5} {
		p := completionParams("Hello", 8)
		p.Temperature = sdk.Float(temp)
		out, err := c.Completions.New(testCtx(t), p, option.WithJSONSet("allowed_token_ids", allowed), option.WithJSONSet("return_token_ids", true))
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		rawField(t, out.Choices[0].JSON.ExtraFields, "token_ids", &ids)
		for _, id := range ids {
			if !slices.Contains(allowed, id) {
				t.Errorf("temperature %v: token %d outside %v", temp, id, allowed)
			}
		}
	}
}

// continue_final_message leaves the assistant's message open (the prompt ends with its
// text), echo prepends it to the answer.
func TestSDKContinueFinalMessage(t *testing.T) {
	e := newFixtureEnv(t, qwenFixture, nil)
	c := e.client()
	msgs := []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Tell a story"), sdk.AssistantMessage("Once upon a time")}
	for _, stream := range []bool{false, true} {
		params := sdk.ChatCompletionNewParams{Model: "m", Messages: msgs, MaxCompletionTokens: sdk.Int(5), Temperature: sdk.Float(0)}
		opts := []option.RequestOption{option.WithJSONSet("continue_final_message", true), option.WithJSONSet("echo", true),
			option.WithJSONSet("return_token_ids", true), noThinking}
		var out sdk.ChatCompletion
		var first sdk.ChatCompletionChunk
		if stream {
			var chunks []sdk.ChatCompletionChunk
			out, chunks = streamAll(t, c, params, opts...)
			first = chunks[0]
		} else {
			o, err := c.Chat.Completions.New(testCtx(t), params, opts...)
			if err != nil {
				t.Fatal(err)
			}
			out = *o
		}
		if !strings.HasPrefix(out.Choices[0].Message.Content, "Once upon a time") {
			t.Errorf("stream %v: echo: %q", stream, out.Choices[0].Message.Content)
		}
		fields := out.JSON.ExtraFields
		if stream {
			fields = first.JSON.ExtraFields
		}
		var prompt []int32
		rawField(t, fields, "prompt_token_ids", &prompt)
		if text := e.m.Tokenizer.Decode(prompt); !strings.HasSuffix(text, "Once upon a time") {
			t.Errorf("stream %v: continue_final_message: the prompt ends %q", stream, text[max(0, len(text)-40):])
		}
	}
}
