package openai_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/prometheus/client_golang/prometheus"

	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/internal/schematest"
	"tandem/metrics"
	"tandem/model"
	"tandem/openai"
)

const (
	qwenFixture  = "rand-qwen2-qwen2vocab-f32.gguf"
	llamaFixture = "rand-llama-llama3vocab-f32.gguf"
)

// fixtureEnv serves a fixture model with the real engine (continuous batching, grammars)
// as model "m".
type fixtureEnv struct {
	m   *model.Model
	srv *httptest.Server
	reg *prometheus.Registry
	om  *openai.Model
}

func newFixtureEnv(t *testing.T, file string, setup func(*openai.Model)) *fixtureEnv {
	t.Helper()
	return newFixtureEnvWith(t, file, setup, openai.Options{})
}

// newFixtureEnvWith is newFixtureEnv with the handler's options (its logger and metrics
// are the test's).
func newFixtureEnvWith(t *testing.T, file string, setup func(*openai.Model), opts openai.Options) *fixtureEnv {
	t.Helper()
	be := cpu.New(0)
	t.Cleanup(func() { be.Close() })
	m, err := model.Load(fixtures.Model(t, file), be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 1024, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	om := &openai.Model{ID: "m", Tokenizer: m.Tokenizer, ContextLen: m.Config.ContextLen, Backend: eng}
	if setup != nil {
		setup(om)
	}
	reg := metrics.NewRegistry()
	opts.Logger, opts.Metrics = discardLogger(), metrics.NewHTTP(reg, "tandem")
	srv := httptest.NewServer(openai.NewHandler([]*openai.Model{om}, opts))
	t.Cleanup(srv.Close)
	return &fixtureEnv{m: m, srv: srv, reg: reg, om: om}
}

func (e *fixtureEnv) client() *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(e.srv.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	return &c
}

func schemaMap(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// noThinking turns Qwen3's thinking off, so that the whole output is the answer.
var noThinking = option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false})

// streamAll reads a chat stream with the SDK's accumulator.
func streamAll(t *testing.T, c *sdk.Client, params sdk.ChatCompletionNewParams, opts ...option.RequestOption) (sdk.ChatCompletion, []sdk.ChatCompletionChunk) {
	t.Helper()
	stream := c.Chat.Completions.NewStreaming(testCtx(t), params, opts...)
	var acc sdk.ChatCompletionAccumulator
	var chunks []sdk.ChatCompletionChunk
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		chunks = append(chunks, chunk)
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return acc.ChatCompletion, chunks
}

// Every output of the schema test set validates, greedy and sampled, streamed and not,
// from random-weight models over the full Qwen and Llama 3 vocabularies.
func TestSDKStructuredOutputs(t *testing.T) {
	for _, file := range []string{qwenFixture, llamaFixture} {
		e := newFixtureEnv(t, file, nil)
		c := e.client()
		for _, tc := range schematest.Cases() {
			t.Run(file+"/"+tc.Name, func(t *testing.T) {
				params := sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Give me JSON.")},
					MaxCompletionTokens: sdk.Int(int64(tc.MaxTokens)), Temperature: sdk.Float(0),
					ResponseFormat: sdk.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
						JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: tc.Name, Schema: schemaMap(t, tc.Schema), Strict: sdk.Bool(true)}}}}
				resp, err := c.Chat.Completions.New(testCtx(t), params, noThinking)
				if err != nil {
					t.Fatal(err)
				}
				ch := resp.Choices[0]
				if ch.FinishReason != "stop" {
					t.Fatalf("greedy: finish %q: %q", ch.FinishReason, ch.Message.Content)
				}
				if err := schematest.Validate([]byte(ch.Message.Content), tc.Schema); err != nil {
					t.Errorf("greedy %q: %v", ch.Message.Content, err)
				}
				params.Temperature, params.Seed = sdk.Float(1), sdk.Int(int64(len(tc.Name)))
				got, _ := streamAll(t, c, params, noThinking)
				content := got.Choices[0].Message.Content
				if got.Choices[0].FinishReason != "stop" {
					t.Fatalf("sampled stream: finish %q: %q", got.Choices[0].FinishReason, content)
				}
				if err := schematest.Validate([]byte(content), tc.Schema); err != nil {
					t.Errorf("sampled stream %q: %v", content, err)
				}
			})
		}
		// json_object: any object.
		resp, err := c.Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("JSON")},
			MaxCompletionTokens: sdk.Int(2000), Temperature: sdk.Float(1), Seed: sdk.Int(3),
			ResponseFormat: sdk.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}}, noThinking)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if out := resp.Choices[0]; out.FinishReason == "stop" && json.Unmarshal([]byte(out.Message.Content), &obj) != nil {
			t.Errorf("%s json_object: %q is not an object", file, out.Message.Content)
		}
	}
}

// vLLM's guided_regex, guided_choice, guided_grammar and structured_outputs, on chat and
// completions, streamed and not.
func TestSDKGuidedDecoding(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, nil)
	c := e.client()
	regexPattern := `[A-Z][a-z]{2,6}-[0-9]{3}`
	re := regexp.MustCompile(`^` + regexPattern + `$`)
	choices := []string{"alpha", "beta gamma", "δέλτα"}
	grammarSrc := "root ::= greeting \" \" name \"!\"\ngreeting ::= \"hello\" | \"hi\"\nname ::= [a-z]{1,8}"
	grammarRE := regexp.MustCompile(`^(hello|hi) [a-z]{1,8}!$`)
	cases := []struct {
		name  string
		field string
		value any
		check func(string) bool
	}{
		{"guided_regex", "guided_regex", regexPattern, re.MatchString},
		{"guided_choice", "guided_choice", choices, func(s string) bool { return slices.Contains(choices, s) }},
		{"guided_grammar", "guided_grammar", grammarSrc, grammarRE.MatchString},
		{"structured_outputs.regex", "structured_outputs", map[string]any{"regex": regexPattern}, re.MatchString},
		{"structured_outputs.choice", "structured_outputs", map[string]any{"choice": choices}, func(s string) bool { return slices.Contains(choices, s) }},
		{"structured_outputs.grammar", "structured_outputs", map[string]any{"grammar": grammarSrc}, grammarRE.MatchString},
		{"structured_outputs.json", "structured_outputs", map[string]any{"json": map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}, "required": []string{"ok"}}},
			func(s string) bool {
				var v struct{ Ok *bool }
				return json.Unmarshal([]byte(s), &v) == nil && v.Ok != nil
			}},
		{"guided_json as text", "guided_json", `{"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3}`,
			func(s string) bool {
				var v []int
				return json.Unmarshal([]byte(s), &v) == nil && len(v) >= 1 && len(v) <= 3
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opt := option.WithJSONSet(tc.field, tc.value)
			for seed := range int64(3) {
				comp, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{Model: "m", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Output:")},
					MaxTokens: sdk.Int(100), Temperature: sdk.Float(1), Seed: sdk.Int(seed)}, opt)
				if err != nil {
					t.Fatal(err)
				}
				if out := comp.Choices[0]; !tc.check(out.Text) || out.FinishReason != "stop" {
					t.Errorf("completion seed %d: %q (%s)", seed, out.Text, out.FinishReason)
				}
			}
			got, _ := streamAll(t, c, sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Go")},
				MaxCompletionTokens: sdk.Int(100), Temperature: sdk.Float(0)}, opt)
			if out := got.Choices[0]; !tc.check(out.Message.Content) || out.FinishReason != "stop" {
				t.Errorf("chat stream: %q (%s)", out.Message.Content, out.FinishReason)
			}
			// A completion stream too.
			stream := c.Completions.NewStreaming(testCtx(t), sdk.CompletionNewParams{Model: "m", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Out:")},
				MaxTokens: sdk.Int(100), Temperature: sdk.Float(1), Seed: sdk.Int(9)}, opt)
			var text strings.Builder
			for stream.Next() {
				for _, ch := range stream.Current().Choices {
					text.WriteString(ch.Text)
				}
			}
			if err := stream.Err(); err != nil || !tc.check(text.String()) {
				t.Errorf("completion stream: %q (%v)", text.String(), err)
			}
		})
	}
}

var weatherSchema = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}`
var lookupSchema = `{"type": "object", "properties": {"query": {"type": "string", "maxLength": 16}, "limit": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["query"], "additionalProperties": false}`

func testTools(t *testing.T, strict bool) []sdk.ChatCompletionToolUnionParam {
	return []sdk.ChatCompletionToolUnionParam{
		sdk.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Description: sdk.String("The weather in a city"),
			Parameters: shared.FunctionParameters(schemaMap(t, []byte(weatherSchema))), Strict: sdk.Bool(strict)}),
		sdk.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "lookup", Description: sdk.String("Search"),
			Parameters: shared.FunctionParameters(schemaMap(t, []byte(lookupSchema))), Strict: sdk.Bool(strict)}),
	}
}

var toolSchemas = map[string]string{"get_weather": weatherSchema, "lookup": lookupSchema}

// checkCalls asserts tool calls whose arguments validate against their tool's schema.
func checkCalls(t *testing.T, what string, msg sdk.ChatCompletionMessage, finish string, n int) {
	t.Helper()
	if finish != "tool_calls" {
		t.Errorf("%s: finish %q, want tool_calls (content %q)", what, finish, msg.Content)
	}
	if len(msg.ToolCalls) == 0 || n > 0 && len(msg.ToolCalls) != n {
		t.Fatalf("%s: %d tool calls, want %d (content %q)", what, len(msg.ToolCalls), n, msg.Content)
	}
	for _, tc := range msg.ToolCalls {
		schema, ok := toolSchemas[tc.Function.Name]
		if !ok || tc.Type != "function" || !strings.HasPrefix(tc.ID, "call_") {
			t.Errorf("%s: call %+v", what, tc)
			continue
		}
		if err := schematest.Validate([]byte(tc.Function.Arguments), []byte(schema)); err != nil {
			t.Errorf("%s: %s arguments %q: %v", what, tc.Function.Name, tc.Function.Arguments, err)
		}
	}
}

// assistantWith is the history message of a response that called tools.
func assistantWith(msg sdk.ChatCompletionMessage) sdk.ChatCompletionMessageParamUnion {
	var calls []sdk.ChatCompletionMessageToolCallUnionParam
	for _, tc := range msg.ToolCalls {
		calls = append(calls, tc.ToParam())
	}
	return sdk.ChatCompletionMessageParamUnion{OfAssistant: &sdk.ChatCompletionAssistantMessageParam{ToolCalls: calls}}
}

// renderedPrompt is the text of the prompt a chat request renders (vLLM's /tokenize).
func (e *fixtureEnv) renderedPrompt(t *testing.T, body map[string]any) string {
	t.Helper()
	data, _ := json.Marshal(body)
	r := do(t, "POST", e.srv.URL+"/tokenize", string(data))
	if r.status != 200 {
		t.Fatalf("/tokenize: %d %s", r.status, r.body)
	}
	var out struct{ Tokens []int32 }
	json.Unmarshal(r.body, &out)
	return e.m.Tokenizer.Decode(out.Tokens)
}

// toolRoundTrip drives one model through the tool-call paths: required (every call
// valid), a named function streamed (one call, the SDK's accumulator), no parallel calls,
// and the calls and their results sent back in the history, rendered by the template.
func toolRoundTrip(t *testing.T, e *fixtureEnv, opts []option.RequestOption, strictAuto bool, wantInPrompt func(call sdk.ChatCompletionMessageToolCallUnion) []string) {
	c := e.client()
	user := sdk.UserMessage("What is the weather in Paris?")
	params := sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{user}, Tools: testTools(t, false),
		ToolChoice: sdk.ChatCompletionToolChoiceOptionUnionParam{OfAuto: sdk.String("required")}, MaxCompletionTokens: sdk.Int(300), Temperature: sdk.Float(0)}
	resp, err := c.Chat.Completions.New(testCtx(t), params, opts...)
	if err != nil {
		t.Fatal(err)
	}
	checkCalls(t, "required", resp.Choices[0].Message, string(resp.Choices[0].FinishReason), 0)

	named := params
	named.ToolChoice = sdk.ToolChoiceOptionFunctionToolChoice(sdk.ChatCompletionNamedToolChoiceFunctionParam{Name: "lookup"})
	named.Temperature, named.Seed = sdk.Float(1), sdk.Int(4)
	got, chunks := streamAll(t, c, named, opts...)
	checkCalls(t, "named, streamed", got.Choices[0].Message, string(got.Choices[0].FinishReason), 1)
	if name := got.Choices[0].Message.ToolCalls[0].Function.Name; name != "lookup" {
		t.Errorf("named: called %q", name)
	}
	// As OpenAI streams them: the first delta of a call has its id, type and name.
	firstCall := -1
	for i, ch := range chunks {
		if len(ch.Choices) > 0 && len(ch.Choices[0].Delta.ToolCalls) > 0 {
			firstCall = i
			break
		}
	}
	if firstCall < 0 {
		t.Fatal("no tool_calls delta in the stream")
	}
	d := chunks[firstCall].Choices[0].Delta.ToolCalls[0]
	if d.ID == "" || d.Type != "function" || d.Function.Name != "lookup" || d.Index != 0 {
		t.Errorf("first tool call delta %+v", d)
	}

	single := params
	single.ParallelToolCalls = sdk.Bool(false)
	single.Temperature, single.Seed = sdk.Float(1.2), sdk.Int(7)
	resp2, err := c.Chat.Completions.New(testCtx(t), single, opts...)
	if err != nil {
		t.Fatal(err)
	}
	checkCalls(t, "parallel_tool_calls false", resp2.Choices[0].Message, string(resp2.Choices[0].FinishReason), 1)

	// Round trip: the call and its result go back; the template writes both.
	call := resp.Choices[0].Message.ToolCalls[0]
	history := []sdk.ChatCompletionMessageParamUnion{user, assistantWith(resp.Choices[0].Message),
		sdk.ToolMessage(`{"temperature": 21}`, call.ID)}
	var body map[string]any
	raw, _ := json.Marshal(sdk.ChatCompletionNewParams{Model: "m", Messages: history, Tools: testTools(t, false)})
	json.Unmarshal(raw, &body)
	for k, v := range extraBody(opts) {
		body[k] = v
	}
	prompt := e.renderedPrompt(t, body)
	for _, want := range append(wantInPrompt(call), `{"temperature": 21}`) {
		if !strings.Contains(prompt, want) {
			t.Errorf("the rendered history lacks %q:\n%s", want, prompt)
		}
	}
	next, err := c.Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "m", Messages: history, Tools: testTools(t, true),
		MaxCompletionTokens: sdk.Int(40), Temperature: sdk.Float(0)}, opts...)
	if !strictAuto {
		// The format's marker is a control token no grammar over text can write.
		var apiErr *sdk.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "tool_choice auto") {
			t.Errorf("strict tools under auto: %v, want a 400", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("the second turn: %v", err)
	}
	// Auto with strict tools: text, or calls whose arguments validate.
	if msg := next.Choices[0].Message; len(msg.ToolCalls) > 0 {
		checkCalls(t, "auto strict", msg, string(next.Choices[0].FinishReason), 0)
	}
}

// extraBody is the extra JSON fields of the options the tests use (chat_template_kwargs).
func extraBody(opts []option.RequestOption) map[string]any {
	if len(opts) > 0 {
		return map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}
	}
	return nil
}

// Qwen's real template: <tool_call> tags (the hermes format), written by the template.
func TestSDKToolsHermesQwen(t *testing.T) {
	e := newFixtureEnv(t, qwenFixture, nil)
	toolRoundTrip(t, e, []option.RequestOption{noThinking}, true, func(call sdk.ChatCompletionMessageToolCallUnion) []string {
		return []string{"<tools>\n{\"function\": {\"description\": \"The weather in a city\", \"name\": \"get_weather\"", "<tool_call>\n{\"name\": \"" + call.Function.Name + "\", \"arguments\": {",
			"<tool_response>\n"}
	})
	if n := e.counter("tandem:chat_template_fallbacks_total"); n != 0 {
		t.Errorf("%v template fallbacks with a template that writes tools", n)
	}
}

// Llama 3's base template writes no tools: the server presents them in a system
// message and writes the calls in the history in the llama3_json format, and counts it.
func TestSDKToolsLlama3Fallback(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, nil)
	toolRoundTrip(t, e, nil, true, func(call sdk.ChatCompletionMessageToolCallUnion) []string {
		return []string{"Given the following functions", `"name":"get_weather"`, "{\"name\": \"" + call.Function.Name + "\", \"parameters\": "}
	})
	if n := e.counter("tandem:chat_template_fallbacks_total"); n == 0 {
		t.Error("the template fallback was not counted")
	}
}

// mistralTemplate is a Mistral-style template of ours ([INST], [TOOL_CALLS] and
// [AVAILABLE_TOOLS]), served with the Llama 3 vocabulary.
const mistralTemplate = `{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}` +
	`{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]` +
	`{% elif m.role == 'assistant' %}{% if m.tool_calls %}[TOOL_CALLS] [{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}{% if not loop.last %}, {% endif %}{% endfor %}]{% else %}{{ m.content }}{% endif %}{{ eos_token }}` +
	`{% elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]{% endif %}{% endfor %}`

func TestSDKToolsMistral(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, func(m *openai.Model) { m.ChatTemplate = mistralTemplate })
	toolRoundTrip(t, e, nil, false, func(call sdk.ChatCompletionMessageToolCallUnion) []string {
		return []string{"[AVAILABLE_TOOLS] [{\"function\": {\"description\": \"The weather in a city\", \"name\": \"get_weather\"", "[TOOL_CALLS] [{\"name\": \"" + call.Function.Name + "\", \"arguments\": {", "[TOOL_RESULTS] "}
	})
	// --tool-call-parser overrides the template's format.
	f := newFixtureEnv(t, llamaFixture, func(m *openai.Model) { m.ChatTemplate = mistralTemplate; m.ToolCallParser = "hermes" })
	resp, err := f.client().Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("x")},
		Tools: testTools(t, false), ToolChoice: sdk.ChatCompletionToolChoiceOptionUnionParam{OfAuto: sdk.String("required")}, MaxCompletionTokens: sdk.Int(300), Temperature: sdk.Float(0)})
	if err != nil {
		t.Fatal(err)
	}
	checkCalls(t, "hermes override", resp.Choices[0].Message, string(resp.Choices[0].FinishReason), 0)
}

// counter is the sum of a counter's series.
func (e *fixtureEnv) counter(name string) float64 {
	mfs, _ := e.reg.Gather()
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// With thinking on (Qwen3's default), a constrained answer follows the reasoning block:
// biased to open and close one at once, the reasoning is empty and the answer valid.
func TestSDKReasoningThenSchema(t *testing.T) {
	e := newFixtureEnv(t, qwenFixture, nil)
	tk := e.m.Tokenizer
	open, _ := tk.TokenID("<think>")
	closeID, _ := tk.TokenID("</think>")
	var tc schematest.Case
	for _, c := range schematest.Cases() {
		if c.Name == "enums" {
			tc = c
		}
	}
	resp, err := e.client().Chat.Completions.New(testCtx(t), sdk.ChatCompletionNewParams{Model: "m", Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Pick")},
		MaxCompletionTokens: sdk.Int(int64(tc.MaxTokens)), Temperature: sdk.Float(0),
		LogitBias: map[string]int64{fmt.Sprint(open): 50, fmt.Sprint(closeID): 100},
		ResponseFormat: sdk.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "x", Schema: schemaMap(t, tc.Schema)}}}})
	if err != nil {
		t.Fatal(err)
	}
	msg := resp.Choices[0].Message
	if err := schematest.Validate([]byte(msg.Content), tc.Schema); err != nil {
		t.Errorf("answer %q: %v", msg.Content, err)
	}
	if r, ok := msg.JSON.ExtraFields["reasoning_content"]; ok && r.Raw() != `""` && r.Raw() != "null" {
		t.Errorf("reasoning %s, want none", r.Raw())
	}
	if strings.Contains(msg.Content, "think>") && !strings.HasPrefix(strings.TrimSpace(msg.Content), "{") {
		t.Errorf("the think block leaked into the answer: %q", msg.Content)
	}
}

// A backend that cannot follow grammars (a router whose workers predate them) gets no
// constrained request: they are refused, not served unconstrained.
func TestNoConstraintsRefused(t *testing.T) {
	b := &fakeBackend{}
	m := fakeModel(t, "stories", b)
	m.NoConstraints = true
	srv := httptest.NewServer(openai.NewHandler([]*openai.Model{m}, openai.Options{Logger: discardLogger()}))
	defer srv.Close()
	for _, body := range []string{
		`{"prompt":"x","guided_choice":["a","b"]}`,
		`{"prompt":"x","response_format":{"type":"json_object"}}`,
	} {
		r := do(t, "POST", srv.URL+"/v1/completions", body)
		checkError(t, body, r, 400, "", "", "predate constrained decoding")
	}
	if b.opened.Load() != 0 {
		t.Errorf("%d constrained requests reached the backend", b.opened.Load())
	}
	// Unconstrained requests still go through.
	if r := do(t, "POST", srv.URL+"/v1/completions", `{"prompt":"x","max_tokens":2}`); r.status != 200 {
		t.Errorf("an unconstrained request: %d %s", r.status, r.body)
	}
}
