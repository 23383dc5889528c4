package openai_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/openai"
)

func (e *env) client(opts ...option.RequestOption) *sdk.Client {
	c := sdk.NewClient(append([]option.RequestOption{
		option.WithBaseURL(e.srv.URL + "/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithRequestTimeout(30 * time.Second),
	}, opts...)...)
	return &c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

const storyPrompt = "Once upon a time"

// chatPromptTokens is what testTemplate renders for one user message "Hi",
// encoded without an extra BOS.
func (e *env) chatPromptTokens() []int32 {
	return e.m.Tokenizer.Encode("<s>user: Hi\nassistant:", false, true)
}

func TestCompletionsGreedyMatchesEngine(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()
	prompt := e.m.Tokenizer.Encode(storyPrompt, true, true)
	for _, maxTokens := range []int{0, 1, 32} {
		ids, want := e.direct(t, prompt, maxTokens)
		params := sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(storyPrompt)},
			Temperature: sdk.Float(0)}
		if maxTokens > 0 {
			params.MaxTokens = sdk.Int(int64(maxTokens))
		}
		resp, err := c.Completions.New(testCtx(t), params)
		if err != nil {
			t.Fatalf("max_tokens %d: %v", maxTokens, err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Text != want {
			t.Fatalf("max_tokens %d: got %+v, want text %q", maxTokens, resp.Choices, want)
		}
		u := resp.Usage
		if u.PromptTokens != int64(len(prompt)) || u.CompletionTokens != int64(len(ids)) || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("max_tokens %d: usage %+v, want %d prompt, %d completion", maxTokens, u, len(prompt), len(ids))
		}
		if resp.Choices[0].FinishReason != "length" || !strings.HasPrefix(resp.ID, "cmpl-") || resp.Object != "text_completion" || resp.Model != "stories" {
			t.Errorf("max_tokens %d: finish %q id %q object %q model %q", maxTokens, resp.Choices[0].FinishReason, resp.ID, resp.Object, resp.Model)
		}
	}
}

// The completion continues the prompt: the space that begins a word is kept
// even on the first token, so prompt + text reads as one text.
func TestCompletionContinuesPrompt(t *testing.T) {
	e := newEnv(t, openai.Options{})
	resp, err := e.client().Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "stories",
		Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a")}, Temperature: sdk.Float(0), MaxTokens: sdk.Int(1)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Text != " time" {
		t.Errorf("got %q, want \" time\"", resp.Choices[0].Text)
	}
	// include_stop_str_in_output (vLLM) keeps the stop string.
	r := do(t, "POST", e.srv.URL+"/v1/completions", `{"prompt":"Once upon a time","max_tokens":20,"temperature":0,"stop":["little"],"include_stop_str_in_output":true}`)
	if !strings.Contains(string(r.body), `"text":", there was a little","logprobs":null,"finish_reason":"stop"`) {
		t.Errorf("include_stop_str_in_output: %s", r.body)
	}
}

func TestChatGreedyMatchesEngine(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()
	prompt := e.chatPromptTokens()
	if prompt[0] != e.m.Tokenizer.BOS() || prompt[1] == e.m.Tokenizer.BOS() {
		t.Fatalf("test prompt %v should start with exactly one BOS", prompt)
	}
	ids, want := e.direct(t, prompt, 20)
	resp, err := c.Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "stories",
		Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")}, Temperature: sdk.Float(0), MaxCompletionTokens: sdk.Int(20)})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != want || resp.Choices[0].Message.Role != "assistant" {
		t.Fatalf("got %+v, want %q", resp.Choices, want)
	}
	if resp.Usage.PromptTokens != int64(len(prompt)) || resp.Usage.CompletionTokens != int64(len(ids)) {
		t.Errorf("usage %+v, want %d prompt (one BOS), %d completion", resp.Usage, len(prompt), len(ids))
	}
	if !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Object != "chat.completion" || resp.Choices[0].FinishReason != "length" {
		t.Errorf("id %q object %q finish %q", resp.ID, resp.Object, resp.Choices[0].FinishReason)
	}
	// max_completion_tokens wins over max_tokens.
	resp, err = c.Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "stories",
		Messages:    []sdk.ChatCompletionMessageParamUnion{sdk.SystemMessage("Be kind."), sdk.UserMessage("Hi")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(50), MaxCompletionTokens: sdk.Int(3)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.CompletionTokens != 3 {
		t.Errorf("max_completion_tokens 3 with max_tokens 50: %d completion tokens", resp.Usage.CompletionTokens)
	}
}

// streamChat returns the concatenated content, the finish reasons by index
// and the usage chunk's completion tokens (-1 without one).
func streamChat(t *testing.T, c *sdk.Client, params sdk.ChatCompletionNewParams) (map[int64]string, map[int64]string, int64) {
	t.Helper()
	s := c.Chat.Completions.NewStreaming(testCtx(t), params)
	defer s.Close()
	texts, finish, usage := map[int64]string{}, map[int64]string{}, int64(-1)
	roles := map[int64]bool{}
	for s.Next() {
		ch := s.Current()
		if ch.Object != "chat.completion.chunk" {
			t.Errorf("chunk object %q", ch.Object)
		}
		if len(ch.Choices) == 0 {
			usage = ch.Usage.CompletionTokens
			continue
		}
		for _, cc := range ch.Choices {
			if cc.Delta.Role == "assistant" {
				roles[cc.Index] = true
			} else if !roles[cc.Index] {
				t.Errorf("choice %d: content before the role delta", cc.Index)
			}
			texts[cc.Index] += cc.Delta.Content
			if cc.FinishReason != "" {
				finish[cc.Index] = cc.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return texts, finish, usage
}

func TestStreamingEqualsNonStreaming(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()

	chat := sdk.ChatCompletionNewParams{Model: "stories", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(40)}
	full, err := c.Chat.Completions.New(testCtx(t), chat)
	if err != nil {
		t.Fatal(err)
	}
	chat.StreamOptions.IncludeUsage = sdk.Bool(true)
	texts, finish, usage := streamChat(t, c, chat)
	if texts[0] != full.Choices[0].Message.Content || finish[0] != full.Choices[0].FinishReason || len(texts) != 1 {
		t.Errorf("chat stream %q (%q), non-stream %q (%q)", texts[0], finish[0], full.Choices[0].Message.Content, full.Choices[0].FinishReason)
	}
	if usage != full.Usage.CompletionTokens {
		t.Errorf("stream usage %d completion tokens, non-stream %d", usage, full.Usage.CompletionTokens)
	}

	comp := sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(storyPrompt)},
		Temperature: sdk.Float(0)}
	cfull, err := c.Completions.New(testCtx(t), comp)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Completions.NewStreaming(testCtx(t), comp)
	var text, fin string
	chunks := 0
	for s.Next() {
		ch := s.Current()
		chunks++
		for _, cc := range ch.Choices {
			text += cc.Text
			if cc.FinishReason != "" {
				fin = string(cc.FinishReason)
			}
		}
		if ch.JSON.Usage.Valid() {
			t.Errorf("usage in a chunk without include_usage: %s", ch.RawJSON())
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if text != cfull.Choices[0].Text || fin != string(cfull.Choices[0].FinishReason) || chunks < 10 {
		t.Errorf("completion stream %q (%q, %d chunks), non-stream %q (%q)", text, fin, chunks, cfull.Choices[0].Text, cfull.Choices[0].FinishReason)
	}
}

func TestStopStrings(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()
	tok := e.m.Tokenizer
	prompt := tok.Encode(storyPrompt, true, true)
	ids, full := e.direct(t, prompt, 60)
	// "girl" appears once, early; " park" spans a token boundary or not, either way it must cut.
	for _, stop := range []string{"girl", " park", "Lily.", "ball. She"} {
		at := strings.Index(full, stop)
		if at < 0 {
			t.Fatalf("stop %q not in %q", stop, full)
		}
		want := full[:at]
		// The completion tokens are those up to the one that completes the stop string.
		wantTokens := 0
		for k := 1; k <= len(ids); k++ {
			if strings.Contains(tok.Decode(ids[:k]), stop) {
				wantTokens = k
				break
			}
		}
		closedBefore := e.be.closed.Load()
		resp, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "stories", Temperature: sdk.Float(0), MaxTokens: sdk.Int(60),
			Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(storyPrompt)},
			Stop:   sdk.CompletionNewParamsStopUnion{OfStringArray: []string{"never appears", stop}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Choices[0]; got.Text != want || got.FinishReason != "stop" {
			t.Errorf("stop %q: got %q (%q), want %q (stop)", stop, got.Text, got.FinishReason, want)
		}
		if resp.Usage.CompletionTokens != int64(wantTokens) {
			t.Errorf("stop %q: %d completion tokens, want %d", stop, resp.Usage.CompletionTokens, wantTokens)
		}
		if e.be.closed.Load() == closedBefore {
			t.Errorf("stop %q: the stream was not closed", stop)
		}
		// Streaming gives the same text.
		texts, finish, _ := streamChat(t, c, sdk.ChatCompletionNewParams{Model: "stories", Temperature: sdk.Float(0), MaxTokens: sdk.Int(60),
			Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")}})
		chatFull := texts[0]
		if finish[0] == "" {
			t.Fatalf("no finish reason streaming chat")
		}
		if at := strings.Index(chatFull, stop); at >= 0 {
			texts, finish, _ = streamChat(t, c, sdk.ChatCompletionNewParams{Model: "stories", Temperature: sdk.Float(0), MaxTokens: sdk.Int(60),
				Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")}, Stop: sdk.ChatCompletionNewParamsStopUnion{OfString: sdk.String(stop)}})
			if texts[0] != chatFull[:at] || finish[0] != "stop" {
				t.Errorf("streamed stop %q: got %q (%q), want %q", stop, texts[0], finish[0], chatFull[:at])
			}
		}
	}
	// A completion streamed with a stop string cuts at the same place.
	s := c.Completions.NewStreaming(testCtx(t), sdk.CompletionNewParams{Model: "stories", Temperature: sdk.Float(0), MaxTokens: sdk.Int(60),
		Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(storyPrompt)}, Stop: sdk.CompletionNewParamsStopUnion{OfString: sdk.String(" park")}})
	var text, fin string
	for s.Next() {
		for _, cc := range s.Current().Choices {
			text += cc.Text
			fin += string(cc.FinishReason)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if want := full[:strings.Index(full, " park")]; text != want || fin != "stop" {
		t.Errorf("streamed completion stop: got %q (%q), want %q", text, fin, want)
	}
}

func TestNWithSeed(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()
	params := sdk.ChatCompletionNewParams{Model: "stories", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")},
		N: sdk.Int(2), Seed: sdk.Int(7), Temperature: sdk.Float(1), MaxTokens: sdk.Int(24)}
	a, err := c.Chat.Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Chat.Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Choices) != 2 || a.Choices[0].Index != 0 || a.Choices[1].Index != 1 {
		t.Fatalf("choices %+v", a.Choices)
	}
	for i := range 2 {
		if a.Choices[i].Message.Content != b.Choices[i].Message.Content {
			t.Errorf("choice %d differs between equal seeded requests: %q vs %q", i, a.Choices[i].Message.Content, b.Choices[i].Message.Content)
		}
	}
	if a.Choices[0].Message.Content == a.Choices[1].Message.Content {
		t.Errorf("n=2 gave two equal choices %q", a.Choices[0].Message.Content)
	}
	if want := int64(len(e.chatPromptTokens())); a.Usage.PromptTokens != want {
		t.Errorf("prompt tokens %d, want %d (counted once, not per choice)", a.Usage.PromptTokens, want)
	}
	// Choice 1 used seed+1.
	params.N, params.Seed = sdk.Int(1), sdk.Int(8)
	one, err := c.Chat.Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if one.Choices[0].Message.Content != a.Choices[1].Message.Content {
		t.Errorf("seed 8 alone %q, choice 1 of seed 7 %q", one.Choices[0].Message.Content, a.Choices[1].Message.Content)
	}
	// Streaming with n=2 gives the same texts, interleaved by index.
	params.N, params.Seed = sdk.Int(2), sdk.Int(7)
	texts, finish, _ := streamChat(t, c, params)
	for i := range 2 {
		if texts[int64(i)] != a.Choices[i].Message.Content || finish[int64(i)] == "" {
			t.Errorf("streamed choice %d: %q (%q), want %q", i, texts[int64(i)], finish[int64(i)], a.Choices[i].Message.Content)
		}
	}
}

func TestMultiplePrompts(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()
	tok := e.m.Tokenizer
	p0, p1 := tok.Encode("Once", true, true), tok.Encode("The dog", true, true)
	_, want0 := e.direct(t, p0, 8)
	_, want1 := e.direct(t, p1, 8)
	ids := func(p []int32) []int64 {
		out := make([]int64, len(p))
		for i, id := range p {
			out[i] = int64(id)
		}
		return out
	}
	for name, prompt := range map[string]sdk.CompletionNewParamsPromptUnion{
		"strings":      {OfArrayOfStrings: []string{"Once", "The dog"}},
		"token arrays": {OfArrayOfTokenArrays: [][]int64{ids(p0), ids(p1)}},
	} {
		resp, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "stories", Prompt: prompt, N: sdk.Int(2),
			Temperature: sdk.Float(0), MaxTokens: sdk.Int(8)})
		if err != nil {
			t.Fatal(name, err)
		}
		if len(resp.Choices) != 4 {
			t.Fatalf("%s: %d choices", name, len(resp.Choices))
		}
		for i, ch := range resp.Choices {
			want := want0
			if i >= 2 {
				want = want1
			}
			if ch.Index != int64(i) || ch.Text != want {
				t.Errorf("%s: choice %d (index %d) %q, want %q", name, i, ch.Index, ch.Text, want)
			}
		}
		if resp.Usage.PromptTokens != int64(len(p0)+len(p1)) || resp.Usage.CompletionTokens != 32 {
			t.Errorf("%s: usage %+v", name, resp.Usage)
		}
	}
	// One prompt as token ids.
	resp, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfArrayOfTokens: ids(p1)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(8)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Text != want1 {
		t.Errorf("token prompt: %q, want %q", resp.Choices[0].Text, want1)
	}
}

func TestLogprobs(t *testing.T) {
	e := newEnv(t, openai.Options{})
	c := e.client()
	for _, stream := range []bool{false, true} {
		params := sdk.ChatCompletionNewParams{Model: "stories", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")},
			Temperature: sdk.Float(0), MaxTokens: sdk.Int(12), Logprobs: sdk.Bool(true), TopLogprobs: sdk.Int(3)}
		var content []sdk.ChatCompletionTokenLogprob
		var text string
		if stream {
			s := c.Chat.Completions.NewStreaming(testCtx(t), params)
			for s.Next() {
				for _, cc := range s.Current().Choices {
					content = append(content, cc.Logprobs.Content...)
					text += cc.Delta.Content
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			resp, err := c.Chat.Completions.New(testCtx(t), params)
			if err != nil {
				t.Fatal(err)
			}
			content, text = resp.Choices[0].Logprobs.Content, resp.Choices[0].Message.Content
		}
		if len(content) != 12 {
			t.Fatalf("stream %v: %d logprob entries, want 12", stream, len(content))
		}
		var joined string
		for i, lp := range content {
			if len(lp.TopLogprobs) != 3 || lp.TopLogprobs[0].Token != lp.Token || lp.TopLogprobs[0].Logprob != lp.Logprob || lp.Logprob > 0 {
				t.Errorf("stream %v: entry %d: %+v", stream, i, lp)
			}
			if string(int64sToBytes(lp.Bytes)) != lp.Token {
				t.Errorf("stream %v: entry %d: bytes %v for token %q", stream, i, lp.Bytes, lp.Token)
			}
			if lp.TopLogprobs[1].Logprob > lp.TopLogprobs[0].Logprob {
				t.Errorf("stream %v: entry %d: top logprobs not in order", stream, i)
			}
			joined += lp.Token
		}
		if joined != text {
			t.Errorf("stream %v: tokens join to %q, text %q", stream, joined, text)
		}
	}

	resp, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(storyPrompt)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(10), Logprobs: sdk.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	lp := resp.Choices[0].Logprobs
	if len(lp.Tokens) != 10 || len(lp.TokenLogprobs) != 10 || len(lp.TopLogprobs) != 10 || len(lp.TextOffset) != 10 {
		t.Fatalf("completion logprobs shape: %+v", lp)
	}
	for i := range 10 {
		if len(lp.TopLogprobs[i]) != 2 || lp.TopLogprobs[i][lp.Tokens[i]] != lp.TokenLogprobs[i] {
			t.Errorf("token %d %q (%v): top %v", i, lp.Tokens[i], lp.TokenLogprobs[i], lp.TopLogprobs[i])
		}
		if i > 0 && lp.TextOffset[i] < lp.TextOffset[i-1] {
			t.Errorf("text_offset not increasing: %v", lp.TextOffset)
		}
	}
}

func int64sToBytes(in []int64) []byte {
	out := make([]byte, len(in))
	for i, b := range in {
		out[i] = byte(b)
	}
	return out
}

func TestModelsSDK(t *testing.T) {
	e := newEnv(t, openai.Options{APIKey: "sekret"})
	c := e.client(option.WithAPIKey("sekret"))
	page, err := c.Models.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "stories" || page.Data[0].OwnedBy != "test" || page.Data[0].Created != 1700000000 {
		t.Errorf("models %+v", page.Data)
	}
	m, err := c.Models.Get(testCtx(t), "stories")
	if err != nil || m.ID != "stories" || m.Object != "model" {
		t.Errorf("get: %+v, %v", m, err)
	}
	if _, err := c.Models.Get(testCtx(t), "nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("get unknown model: %v", err)
	}
	// A wrong key through the SDK is a 401.
	if _, err := e.client(option.WithAPIKey("wrong")).Models.List(testCtx(t)); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong key: %v", err)
	}
}
