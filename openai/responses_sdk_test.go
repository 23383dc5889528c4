package openai_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"

	"tandem/openai"
	"tandem/respstore"
)

func newResponsesEnv(t *testing.T, file string) *fixtureEnv {
	return newFixtureEnvWith(t, file, nil, openai.Options{Responses: respstore.NewMemory(respstore.Options{})})
}

// streamResponse reads a Responses stream and returns the event types in order, the text
// its deltas add up to, and the final response.
func streamResponse(t *testing.T, c *sdk.Client, params responses.ResponseNewParams, opts ...option.RequestOption) ([]string, string, responses.Response) {
	t.Helper()
	s := c.Responses.NewStreaming(testCtx(t), params, opts...)
	var types []string
	var text strings.Builder
	var final responses.Response
	seq := int64(-1)
	for s.Next() {
		ev := s.Current()
		types = append(types, ev.Type)
		if ev.SequenceNumber != seq+1 {
			t.Errorf("event %s: sequence number %d after %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq = ev.SequenceNumber
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			final = ev.Response
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return types, text.String(), final
}

// A response, streamed and not: the same text greedily, OpenAI's events in OpenAI's order,
// stored and found by id, its input items listed, deleted.
func TestSDKResponses(t *testing.T) {
	e := newResponsesEnv(t, llamaFixture)
	c := e.client()
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Tell me a story")},
		Instructions: sdk.String("Be brief."), MaxOutputTokens: sdk.Int(12), Temperature: sdk.Float(0)}
	resp, err := c.Responses.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.ID, "resp_") || resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens" ||
		resp.Usage.OutputTokens != 12 || resp.OutputText() == "" || resp.Instructions.OfString != "Be brief." {
		t.Fatalf("response: %s", resp.RawJSON())
	}
	if got := resp.Output[0]; got.Type != "message" || got.Role != "assistant" || !strings.HasPrefix(got.ID, "msg_") {
		t.Errorf("output item %s", got.RawJSON())
	}

	types, text, final := streamResponse(t, c, params)
	if text != resp.OutputText() || final.OutputText() != text || final.Status != "incomplete" {
		t.Errorf("streamed %q (final %q, %s), not streamed %q", text, final.OutputText(), final.Status, resp.OutputText())
	}
	// created, in_progress, item added, part added, deltas, text done, part done, item done, incomplete.
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	if len(types) < 9 || !slices.Equal(types[:4], want) || !slices.Equal(types[len(types)-4:],
		[]string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}) {
		t.Errorf("event order %v", types)
	}
	for _, typ := range types[4 : len(types)-4] {
		if typ != "response.output_text.delta" {
			t.Errorf("between the part and its end: %s", typ)
		}
	}

	got, err := c.Responses.Get(testCtx(t), resp.ID, responses.ResponseGetParams{})
	if err != nil || got.ID != resp.ID || got.OutputText() != resp.OutputText() {
		t.Fatalf("GET: %v %+v", err, got)
	}
	items, err := c.Responses.InputItems.List(testCtx(t), resp.ID, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].Type != "message" || items.Data[0].ID == "" {
		t.Fatalf("input items: %v %+v", err, items)
	}
	if err := c.Responses.Delete(testCtx(t), resp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Responses.Get(testCtx(t), resp.ID, responses.ResponseGetParams{}); err == nil {
		t.Error("a deleted response was found")
	}
	if r := do(t, "DELETE", e.srv.URL+"/v1/responses/"+resp.ID, ""); r.status != http.StatusNotFound {
		t.Errorf("second DELETE: %d", r.status)
	}

	// store false: not kept.
	params.Store = sdk.Bool(false)
	resp, err = c.Responses.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if r := do(t, "GET", e.srv.URL+"/v1/responses/"+resp.ID, ""); r.status != http.StatusNotFound || !strings.Contains(resp.RawJSON(), `"store":false`) {
		t.Errorf("store false: GET %d, response %s", r.status, resp.RawJSON())
	}
}

// previous_response_id continues the conversation: the next prompt is the chat of the
// earlier input, its output and the new input (the instructions are not carried over).
func TestSDKResponsesConversation(t *testing.T) {
	e := newResponsesEnv(t, qwenFixture)
	c := e.client()
	first, err := c.Responses.New(testCtx(t), responses.ResponseNewParams{Model: "m", Instructions: sdk.String("Be kind."),
		Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Hello")}, MaxOutputTokens: sdk.Int(6), Temperature: sdk.Float(0)}, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Responses.New(testCtx(t), responses.ResponseNewParams{Model: "m", PreviousResponseID: sdk.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("And then?")}, MaxOutputTokens: sdk.Int(6), Temperature: sdk.Float(0)}, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	// The same conversation as chat messages gives the same prompt.
	chat, err := c.Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "m", MaxCompletionTokens: sdk.Int(1),
		Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hello"), sdk.AssistantMessage(first.OutputText()), sdk.UserMessage("And then?")}}, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	if second.Usage.InputTokens != chat.Usage.PromptTokens || second.PreviousResponseID != first.ID {
		t.Errorf("second response: %d input tokens, the chat of the conversation %d", second.Usage.InputTokens, chat.Usage.PromptTokens)
	}
	checkError(t, "unknown previous", do(t, "POST", e.srv.URL+"/v1/responses", `{"input":"x","previous_response_id":"resp_nope"}`),
		http.StatusNotFound, "previous_response_id", "previous_response_not_found", "not found")
	for _, tc := range []struct{ body, param string }{
		{`{"input":"x","background":true}`, "background"},
		{`{"input":"x","include":["reasoning.encrypted_content"]}`, "include"},
		{`{"input":"x","truncation":"auto"}`, "truncation"},
		{`{"input":[{"type":"web_search_call"}]}`, "input[0].type"},
		{`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].type"},
		{`{"input":"x","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{`{"input":"x","max_output_tokens":0}`, "max_output_tokens"},
	} {
		checkError(t, tc.body, do(t, "POST", e.srv.URL+"/v1/responses", tc.body), 400, tc.param, "", "")
	}
}

// Tools: a forced call comes back as a function_call item whose arguments follow the
// schema, streamed as argument deltas; its output goes back in the next request.
func TestSDKResponsesTools(t *testing.T) {
	e := newResponsesEnv(t, qwenFixture)
	c := e.client()
	var schema map[string]any
	json.Unmarshal([]byte(`{"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false}`), &schema)
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Weather in Oslo?")},
		Tools:           []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "get_weather", Parameters: schema, Strict: sdk.Bool(true)}}},
		ToolChoice:      responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: param.NewOpt(responses.ToolChoiceOptionsRequired)},
		MaxOutputTokens: sdk.Int(80), Temperature: sdk.Float(0)}
	resp, err := c.Responses.New(testCtx(t), params, noThinking)
	if err != nil {
		t.Fatal(err)
	}
	var call responses.ResponseOutputItemUnion
	for _, it := range resp.Output {
		if it.Type == "function_call" {
			call = it
		}
	}
	var args struct{ City *string }
	if call.Name != "get_weather" || !strings.HasPrefix(call.CallID, "call_") || json.Unmarshal([]byte(call.Arguments.OfString), &args) != nil || args.City == nil {
		t.Fatalf("function call: %s", resp.RawJSON())
	}
	types, _, final := streamResponse(t, c, params, noThinking)
	if !slices.Contains(types, "response.function_call_arguments.delta") || !slices.Contains(types, "response.function_call_arguments.done") {
		t.Errorf("streamed tool call events %v", types)
	}
	if final.Output[len(final.Output)-1].Type != "function_call" {
		t.Errorf("streamed final output %s", final.RawJSON())
	}
	// The call's output goes back with previous_response_id.
	next, err := c.Responses.New(testCtx(t), responses.ResponseNewParams{Model: "m", PreviousResponseID: sdk.String(resp.ID), MaxOutputTokens: sdk.Int(4), Tools: params.Tools},
		option.WithJSONSet("input", []map[string]any{{"type": "function_call_output", "call_id": call.CallID, "output": "Sunny, 21 C"}}), noThinking)
	if err != nil {
		t.Fatal(err)
	}
	if next.Usage.InputTokens <= resp.Usage.InputTokens {
		t.Errorf("the tool result did not reach the prompt: %d input tokens, %d before", next.Usage.InputTokens, resp.Usage.InputTokens)
	}
	rendered := e.renderedPrompt(t, map[string]any{"messages": []map[string]any{
		{"role": "user", "content": "Weather in Oslo?"},
		{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": call.CallID, "type": "function", "function": map[string]any{"name": "get_weather", "arguments": call.Arguments.OfString}}}},
		{"role": "tool", "tool_call_id": call.CallID, "content": "Sunny, 21 C"}},
		"tools":                []map[string]any{{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": schema, "strict": true}}},
		"chat_template_kwargs": map[string]any{"enable_thinking": false}})
	if !strings.Contains(rendered, "Sunny, 21 C") {
		t.Fatalf("rendered prompt lacks the tool result: %q", rendered)
	}
}
