package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"tandem/internal/fixtures"
	"tandem/internal/schematest"
	"tandem/openai"
)

// Constraints cross the wire: a real tandem-router in front of real engines serving the
// Qwen and Llama 3 vocabulary fixtures follows JSON Schemas, guided choices and forced
// tool calls, and parses the calls in each model's format (chosen from the chat
// template the worker's card carries).
func TestEndToEndStructuredOutputs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	r := startRouterProc(t)
	for _, e := range []struct{ name, model, file string }{{"eq", "qwen", "rand-qwen2-qwen2vocab-f32.gguf"}, {"el", "llama", "rand-llama-llama3vocab-f32.gguf"}} {
		p := startProc(t, e.name, "tandem", "serve", "--model", fixtures.Model(t, e.file), "--served-model-name", e.model,
			"--port", "0", "--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", e.name, "--kv-cache-memory", "64MiB")
		p.wait(t, `tandem serve: http://`, 60*time.Second)
		p.wait(t, `registered with router`, 30*time.Second)
		r.wait(t, `worker joined.*worker=`+e.name, 10*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := sdkClient(r.url)
	noThinking := option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false})

	for _, tc := range schematest.Cases() {
		var schema map[string]any
		json.Unmarshal(tc.Schema, &schema)
		for _, m := range []string{"qwen", "llama"} {
			var resp *http.Response
			out, err := c.Chat.Completions.New(ctx, sdk.ChatCompletionNewParams{Model: m, Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("JSON please")},
				MaxCompletionTokens: sdk.Int(int64(tc.MaxTokens)), Temperature: sdk.Float(1), Seed: sdk.Int(5),
				ResponseFormat: sdk.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
					JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: tc.Name, Schema: schema, Strict: sdk.Bool(true)}}}},
				noThinking, option.WithResponseInto(&resp))
			if err != nil {
				t.Fatalf("%s %s: %v", m, tc.Name, err)
			}
			if wk := resp.Header.Get(openai.WorkerHeader); wk != map[string]string{"qwen": "eq", "llama": "el"}[m] {
				t.Errorf("%s served by %q", m, wk)
			}
			ch := out.Choices[0]
			if err := schematest.Validate([]byte(ch.Message.Content), tc.Schema); err != nil || ch.FinishReason != "stop" {
				t.Errorf("%s %s through the router: %q (%s): %v", m, tc.Name, ch.Message.Content, ch.FinishReason, err)
			}
		}
	}

	choices := []string{"left", "right", "up"}
	for seed := range int64(4) {
		out, err := c.Completions.New(ctx, sdk.CompletionNewParams{Model: "llama", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Go")},
			MaxTokens: sdk.Int(20), Temperature: sdk.Float(1), Seed: sdk.Int(seed)}, option.WithJSONSet("guided_choice", choices))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(choices, out.Choices[0].Text) {
			t.Errorf("guided_choice through the router: %q", out.Choices[0].Text)
		}
	}

	params := func(m string) sdk.ChatCompletionNewParams {
		var weather map[string]any
		json.Unmarshal([]byte(`{"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": false}`), &weather)
		return sdk.ChatCompletionNewParams{Model: m, Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Weather in Oslo?")},
			Tools:      []sdk.ChatCompletionToolUnionParam{sdk.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Parameters: weather})},
			ToolChoice: sdk.ChatCompletionToolChoiceOptionUnionParam{OfAuto: sdk.String("required")}, MaxCompletionTokens: sdk.Int(200), Temperature: sdk.Float(0)}
	}
	for _, m := range []string{"qwen", "llama"} {
		out, err := c.Chat.Completions.New(ctx, params(m), noThinking)
		if err != nil {
			t.Fatalf("%s tools: %v", m, err)
		}
		msg := out.Choices[0].Message
		if out.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) == 0 || msg.ToolCalls[0].Function.Name != "get_weather" {
			t.Fatalf("%s: forced tool call through the router: %+v (%s)", m, msg, out.Choices[0].FinishReason)
		}
		var args struct{ City *string }
		if err := json.Unmarshal([]byte(msg.ToolCalls[0].Function.Arguments), &args); err != nil || args.City == nil {
			t.Errorf("%s: arguments %q do not parse: %v", m, msg.ToolCalls[0].Function.Arguments, err)
		}
	}
}
