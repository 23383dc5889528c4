package openai_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/gguf"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/openai"
	"tandem/tokenizer"
)

// scriptBackend answers every request with the tokens of a fixed text, ending "stop".
type scriptBackend struct {
	tokens []int32
	last   *llm.Request
}

type scriptStream struct {
	tokens []int32
	i      int
}

func (b *scriptBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	b.last = req
	return &scriptStream{tokens: b.tokens}, nil
}

func (s *scriptStream) Next(ctx context.Context) (llm.Event, error) {
	if s.i >= len(s.tokens) {
		return llm.Event{}, io.EOF
	}
	ev := llm.Event{Token: s.tokens[s.i]}
	s.i++
	if s.i == len(s.tokens) {
		ev.Finish, ev.Usage = llm.FinishStop, llm.Usage{CompletionTokens: s.i}
	}
	return ev, nil
}

func (s *scriptStream) Close() error { return nil }

func qwenTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	f, err := gguf.Open(fixtures.Model(t, qwenFixture))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// scripted serves tk with a backend that writes text.
func scripted(t *testing.T, tk *tokenizer.Tokenizer, text string, setup func(*openai.Model)) (*sdk.Client, *scriptBackend) {
	b := &scriptBackend{tokens: tk.Encode(text, false, true)}
	m := &openai.Model{ID: "m", Tokenizer: tk, ContextLen: 4096, Backend: b}
	if setup != nil {
		setup(m)
	}
	srv := httptest.NewServer(openai.NewHandler([]*openai.Model{m}, openai.Options{Logger: discardLogger()}))
	t.Cleanup(srv.Close)
	c := sdk.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	return &c, b
}

// rawString decodes a JSON string field of an SDK value's extra fields ("" if absent).
func rawString(raw string) string {
	var s string
	json.Unmarshal([]byte(raw), &s)
	return s
}

func TestSDKReasoningSplit(t *testing.T) {
	tk := qwenTokenizer(t)
	r1 := "{% for m in messages %}<｜{{ m.role }}｜>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
	cases := []struct {
		name, output       string
		setup              func(*openai.Model)
		opts               []option.RequestOption
		reasoning, content string
	}{
		{"qwen3 thinks", "<think>\nFirst, 2+2.\nThat is 4.\n</think>\n\nIt is 4.", nil, nil, "First, 2+2.\nThat is 4.", "It is 4."},
		{"r1 template opens the block", "Thinking here.\n</think>\n\nAnswer.", func(m *openai.Model) { m.ChatTemplate = r1 }, nil, "Thinking here.", "Answer."},
		{"thinking off", "<think>x</think>y", nil, []option.RequestOption{noThinking}, "", "<think>x</think>y"},
		{"parser none", "<think>x</think>y", func(m *openai.Model) { m.ReasoningParser = "none" }, nil, "", "<think>x</think>y"},
		{"cut off while thinking", "<think>\nstill going", nil, nil, "still going", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := scripted(t, tk, tc.output, tc.setup)
			params := sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("2+2?")}}
			resp, err := c.Chat.Completions.New(testCtx(t), params, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			msg := resp.Choices[0].Message
			rc, r := rawString(msg.JSON.ExtraFields["reasoning_content"].Raw()), rawString(msg.JSON.ExtraFields["reasoning"].Raw())
			if msg.Content != tc.content || rc != tc.reasoning || r != tc.reasoning {
				t.Errorf("content %q reasoning_content %q reasoning %q, want %q and %q", msg.Content, rc, r, tc.content, tc.reasoning)
			}
			stream := c.Chat.Completions.NewStreaming(testCtx(t), params, tc.opts...)
			var content, reasoning, reasoningAlt strings.Builder
			for stream.Next() {
				for _, ch := range stream.Current().Choices {
					content.WriteString(ch.Delta.Content)
					reasoning.WriteString(rawString(ch.Delta.JSON.ExtraFields["reasoning_content"].Raw()))
					reasoningAlt.WriteString(rawString(ch.Delta.JSON.ExtraFields["reasoning"].Raw()))
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if content.String() != tc.content || reasoning.String() != tc.reasoning || reasoningAlt.String() != tc.reasoning {
				t.Errorf("stream: content %q reasoning %q / %q, want %q and %q", content.String(), reasoning.String(), reasoningAlt.String(), tc.content, tc.reasoning)
			}
		})
	}
}

// Calls a model writes under tool_choice auto (no grammar) are parsed, in a stream as
// deltas that OpenAI's SDK accumulates into the same calls.
func TestSDKToolCallsParsed(t *testing.T) {
	tk := qwenTokenizer(t)
	out := "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"query\": \"rain\"}}\n</tool_call>"
	c, b := scripted(t, tk, out, nil)
	params := sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Weather?")}, Tools: testTools(t, false)}
	resp, err := c.Chat.Completions.New(testCtx(t), params, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	if !b.last.Constraint.IsZero() {
		t.Error("auto without strict tools made a grammar")
	}
	check := func(what string, msg sdk.ChatCompletionMessage, finish string) {
		t.Helper()
		if msg.Content != "Let me check.\n" || finish != "tool_calls" || len(msg.ToolCalls) != 2 {
			t.Fatalf("%s: content %q finish %q calls %+v", what, msg.Content, finish, msg.ToolCalls)
		}
		want := []struct{ name, args string }{{"get_weather", `{"city": "Paris", "unit": "c"}`}, {"lookup", `{"query": "rain"}`}}
		for i, w := range want {
			if got := msg.ToolCalls[i].Function; got.Name != w.name || got.Arguments != w.args {
				t.Errorf("%s: call %d %q %q, want %q %q", what, i, got.Name, got.Arguments, w.name, w.args)
			}
		}
		if msg.ToolCalls[0].ID == msg.ToolCalls[1].ID {
			t.Errorf("%s: the calls share an id", what)
		}
	}
	check("not streamed", resp.Choices[0].Message, string(resp.Choices[0].FinishReason))
	got, chunks := streamAll(t, c, params, noThinking)
	check("streamed", got.Choices[0].Message, string(got.Choices[0].FinishReason))
	argDeltas := 0
	for _, ch := range chunks {
		for _, ch := range ch.Choices {
			for _, d := range ch.Delta.ToolCalls {
				if d.Function.Arguments != "" {
					argDeltas++
				}
			}
		}
	}
	if argDeltas < 4 {
		t.Errorf("arguments came in %d deltas; they should stream as the tokens come", argDeltas)
	}
	// tool_choice none: the same text is content.
	params.ToolChoice = sdk.ChatCompletionToolChoiceOptionUnionParam{OfAuto: sdk.String("none")}
	resp, err = c.Chat.Completions.New(testCtx(t), params, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.Choices[0].Message; m.Content != out || len(m.ToolCalls) != 0 || resp.Choices[0].FinishReason != "stop" {
		t.Errorf("tool_choice none: %q %+v %s", m.Content, m.ToolCalls, resp.Choices[0].FinishReason)
	}
	// A call that does not parse is text, counted; not streamed it is returned whole.
	c2, _ := scripted(t, tk, "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"query\": \"x\"", nil)
	params.ToolChoice = sdk.ChatCompletionToolChoiceOptionUnionParam{OfAuto: sdk.String("auto")}
	resp, err = c2.Chat.Completions.New(testCtx(t), params, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.Choices[0].Message; len(m.ToolCalls) != 0 || !strings.Contains(m.Content, `"query": "x"`) || resp.Choices[0].FinishReason != "stop" {
		t.Errorf("broken call: %q %+v %s", m.Content, m.ToolCalls, resp.Choices[0].FinishReason)
	}
}
