package main

import (
	"errors"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"tandem/internal/fixtures"
)

// --tool-call-parser and --reasoning-parser: a bad value is a CLI error naming the flag
// and its values, before any model is loaded.
func TestParserFlagErrors(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"--tool-call-parser", "qwen", "auto, hermes, llama3_json, mistral, none"},
		{"--reasoning-parser", "deepseek", "auto, think, none"},
	} {
		_, errOut, code := runMain(t, "serve", tc.flag, tc.value, "--port", "0", "--model", "/nonexistent.gguf")
		if code != 1 || !strings.Contains(errOut, tc.flag) || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "nonexistent") {
			t.Errorf("%s %s: exit %d, stderr %q", tc.flag, tc.value, code, errOut)
		}
	}
}

// The flag reaches the API: Llama 3's template would choose llama3_json, --tool-call-parser
// hermes makes forced calls come in <tool_call> tags, parsed as calls; none turns tools off.
func TestServeToolCallParserFlag(t *testing.T) {
	model := fixtures.Model(t, "rand-llama-llama3vocab-f32.gguf")
	params := sdk.ChatCompletionNewParams{Model: "llama", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hi")},
		Tools: []sdk.ChatCompletionToolUnionParam{sdk.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "ping",
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{}, "additionalProperties": false}})},
		ToolChoice: sdk.ChatCompletionToolChoiceOptionUnionParam{OfAuto: sdk.String("required")}, MaxCompletionTokens: sdk.Int(100), Temperature: sdk.Float(0)}
	s := startServe(t, "--model", model, "--served-model-name", "llama", "--tool-call-parser", "hermes", "--kv-cache-memory", "64MiB")
	resp, err := s.client().Chat.Completions.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if msg := resp.Choices[0].Message; len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "ping" || resp.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("hermes: %+v (%s)", msg, resp.Choices[0].FinishReason)
	}
	off := startServe(t, "--model", model, "--served-model-name", "llama", "--tool-call-parser", "none", "--kv-cache-memory", "64MiB")
	_, err = off.client().Chat.Completions.New(t.Context(), params)
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "tool-call format") {
		t.Errorf("none: %v, want a 400 about the tool-call format", err)
	}
}
