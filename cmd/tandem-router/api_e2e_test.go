package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"

	"tandem/internal/fixtures"
	"tandem/openai"
)

// startRouterIn starts a router on a given state directory (a restart keeps it).
func startRouterIn(t *testing.T, label, stateDir string, extra ...string) *e2eRouter {
	p := startProc(t, label, "tandem-router", append([]string{"--port", "0", "--orpc-port", "0", "--state-dir", stateDir,
		"--join-token", e2eToken, "--heartbeat", "100ms", "--heartbeat-timeout", "3s", "--queue-timeout", "2s"}, extra...)...)
	url := p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1]
	addr := p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]
	return &e2eRouter{proc: p, url: url, orpc: addr}
}

func httpDo(t *testing.T, method, url, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data
}

// The second half of the API through a real tandem-router and two real engines: the 503
// before any worker, stored responses found whatever worker served them (even one that is
// gone, and after the router restarts), embeddings, token ids and prompt logprobs, min and
// allowed tokens, and Anthropic's Messages API, streamed and not.
func TestEndToEndAPIThroughRouter(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four processes")
	}
	state := t.TempDir()
	r := startRouterIn(t, "tandem-router", state, "--metrics-prefix", "vllm")
	code, hdr, body := httpDo(t, "POST", r.url+"/v1/chat/completions", `{"model":"qwen","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "before-1")
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "no worker has joined") || hdr.Get("X-Request-Id") != "before-1" {
		t.Errorf("before any worker: %d %s %v", code, body, hdr)
	}
	engines := map[string]*proc{}
	for _, name := range []string{"e1", "e2"} {
		engines[name] = startProc(t, name, "tandem", "serve", "--model", fixtures.Model(t, "rand-qwen2-qwen2vocab-f32.gguf"), "--served-model-name", "qwen",
			"--port", "0", "--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", name, "--kv-cache-memory", "64MiB")
	}
	for name, e := range engines {
		e.wait(t, `registered with router`, 90*time.Second)
		r.wait(t, `worker joined.*worker=`+name, 10*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := sdkClient(r.url)
	noThinking := option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false})

	// A stored response, then its worker dies: the conversation goes on on the other one.
	var raw *http.Response
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Hello")},
		MaxOutputTokens: sdk.Int(6), Temperature: sdk.Float(0)}, noThinking, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	served := raw.Header.Get(openai.WorkerHeader)
	if engines[served] == nil {
		t.Fatalf("served by %q", served)
	}
	streamed := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Hello")},
		MaxOutputTokens: sdk.Int(6), Temperature: sdk.Float(0)}, noThinking)
	var text string
	var types []string
	for streamed.Next() {
		ev := streamed.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
	}
	if streamed.Err() != nil || text != first.OutputText() || types[0] != "response.created" || types[len(types)-1] != "response.incomplete" {
		t.Errorf("streamed through the router: %q (%v), events %v; not streamed %q", text, streamed.Err(), types, first.OutputText())
	}
	engines[served].cmd.Process.Kill()
	r.wait(t, `worker left.*worker=`+served, 15*time.Second)
	next, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "qwen", PreviousResponseID: sdk.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("More")}, MaxOutputTokens: sdk.Int(3)}, noThinking, option.WithResponseInto(&raw))
	if err != nil || raw.Header.Get(openai.WorkerHeader) == served || next.Usage.InputTokens <= first.Usage.InputTokens {
		t.Fatalf("previous_response_id on the other worker: %v, served by %q (the first by %q), %d input tokens", err, raw.Header.Get(openai.WorkerHeader), served, next.Usage.InputTokens)
	}
	other := raw.Header.Get(openai.WorkerHeader)

	// Embeddings: the same bits alone and in a batch, through the router.
	embed := func(input any) []string {
		data, _ := json.Marshal(map[string]any{"model": "qwen", "input": input, "encoding_format": "base64"})
		code, _, body := httpDo(t, "POST", r.url+"/v1/embeddings", string(data))
		var out struct{ Data []struct{ Embedding string } }
		if json.Unmarshal(body, &out) != nil || code != 200 {
			t.Fatalf("embeddings: %d %s", code, body)
		}
		var vecs []string
		for _, d := range out.Data {
			b, _ := base64.StdEncoding.DecodeString(d.Embedding)
			if len(b) == 0 {
				t.Fatalf("empty embedding: %s", body)
			}
			vecs = append(vecs, d.Embedding)
		}
		return vecs
	}
	if alone, batch := embed("on the mat"), embed([]string{"the cat", "on the mat"}); alone[0] != batch[1] {
		t.Error("embeddings through the router: alone and in a batch differ")
	}
	emb, err := c.Embeddings.New(ctx, sdk.EmbeddingNewParams{Model: "qwen", Input: sdk.EmbeddingNewParamsInputUnion{OfString: sdk.String("x")}, Dimensions: sdk.Int(16)})
	if err != nil || len(emb.Data[0].Embedding) != 16 {
		t.Errorf("SDK embeddings through the router: %v", err)
	}

	// Token ids, prompt logprobs, min and allowed tokens through the router, streamed and not.
	eos := 151643 // <|endoftext|>, the Qwen2 vocabulary's EOS
	promptLen := -1
	for _, stream := range []bool{false, true} {
		params := sdk.CompletionNewParams{Model: "qwen", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("One two three")},
			MaxTokens: sdk.Int(12), Temperature: sdk.Float(0), LogitBias: map[string]int64{fmt.Sprint(eos): 100}}
		opts := []option.RequestOption{option.WithJSONSet("return_token_ids", true), option.WithJSONSet("prompt_logprobs", 1),
			option.WithJSONSet("min_tokens", 4), option.WithJSONSet("allowed_token_ids", []int{eos, 1000, 2000})}
		var ids []int32
		var plp []json.RawMessage
		if stream {
			s := c.Completions.NewStreaming(ctx, params, opts...)
			for s.Next() {
				f := s.Current().Choices[0].JSON.ExtraFields
				var more []int32
				json.Unmarshal([]byte(f["token_ids"].Raw()), &more)
				ids = append(ids, more...)
				if raw := f["prompt_logprobs"].Raw(); raw != "" && raw != "null" {
					json.Unmarshal([]byte(raw), &plp)
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			out, err := c.Completions.New(ctx, params, opts...)
			if err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(out.Choices[0].JSON.ExtraFields["token_ids"].Raw()), &ids)
			json.Unmarshal([]byte(out.Choices[0].JSON.ExtraFields["prompt_logprobs"].Raw()), &plp)
			promptLen = int(out.Usage.PromptTokens)
		}
		if len(ids) != 5 || ids[4] != int32(eos) || slices.Contains(ids[:4], int32(eos)) {
			t.Errorf("stream %v: ids %v: want 4 allowed tokens (min_tokens) then the EOS the bias forces", stream, ids)
		}
		for _, id := range ids[:4] {
			if id != 1000 && id != 2000 {
				t.Errorf("stream %v: token %d outside allowed_token_ids", stream, id)
			}
		}
		if len(plp) != promptLen || string(plp[0]) != "null" {
			t.Errorf("stream %v: prompt_logprobs %s", stream, plp)
		}
	}

	// echo scores a prompt alone; continue_final_message and echo in a chat stream;
	// return_tokens_as_token_ids; a forced function call in the Responses API.
	scored, err := c.Completions.New(ctx, sdk.CompletionNewParams{Model: "qwen", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("One two three")},
		MaxTokens: sdk.Int(0), Echo: sdk.Bool(true), Logprobs: sdk.Int(1)}, option.WithJSONSet("return_tokens_as_token_ids", true))
	if err != nil || scored.Choices[0].Text != "One two three" || len(scored.Choices[0].Logprobs.Tokens) != promptLen ||
		!strings.HasPrefix(scored.Choices[0].Logprobs.Tokens[0], "token_id:") || !strings.HasPrefix(scored.Choices[0].Logprobs.JSON.TokenLogprobs.Raw(), "[null,") {
		t.Errorf("echo with max_tokens 0 through the router: %v %+v", err, scored)
	}
	cs := c.Chat.Completions.NewStreaming(ctx, sdk.ChatCompletionNewParams{Model: "qwen", MaxCompletionTokens: sdk.Int(3), Temperature: sdk.Float(0),
		Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Tell a story"), sdk.AssistantMessage("Once upon a time")}},
		option.WithJSONSet("continue_final_message", true), option.WithJSONSet("echo", true), noThinking)
	var content string
	for cs.Next() {
		for _, ch := range cs.Current().Choices {
			content += ch.Delta.Content
		}
	}
	if cs.Err() != nil || !strings.HasPrefix(content, "Once upon a time") || len(content) == len("Once upon a time") {
		t.Errorf("continue_final_message and echo through the router: %q %v", content, cs.Err())
	}
	var weather map[string]any
	json.Unmarshal([]byte(`{"type":"object","properties":{"city":{"type":"string","maxLength":10}},"required":["city"],"additionalProperties":false}`), &weather)
	called, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Weather in Oslo?")},
		Tools:           []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "get_weather", Parameters: weather, Strict: sdk.Bool(true)}}},
		ToolChoice:      responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: param.NewOpt(responses.ToolChoiceOptionsRequired)},
		MaxOutputTokens: sdk.Int(80), Temperature: sdk.Float(0)}, noThinking)
	if err != nil || len(called.Output) == 0 || called.Output[len(called.Output)-1].Type != "function_call" || !json.Valid([]byte(called.Output[len(called.Output)-1].Arguments.OfString)) {
		t.Errorf("a forced call in the Responses API through the router: %v %+v", err, called)
	}

	// Anthropic's Messages API through the router, streamed and not.
	msg := `{"model":"qwen","max_tokens":5,"temperature":0,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"Hi"}]`
	code, _, body = httpDo(t, "POST", r.url+"/v1/messages", msg+`}`, "x-api-key", "none", "anthropic-version", "2023-06-01")
	var m struct {
		Type       string
		StopReason string `json:"stop_reason"`
		Content    []struct{ Text string }
	}
	if json.Unmarshal(body, &m) != nil || code != 200 || m.Type != "message" || m.StopReason != "max_tokens" || len(m.Content) == 0 {
		t.Fatalf("messages: %d %s", code, body)
	}
	code, _, body = httpDo(t, "POST", r.url+"/v1/messages", msg+`,"stream":true}`)
	var events []string
	var deltas string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, ev)
		}
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var d struct{ Delta struct{ Text string } }
			json.Unmarshal([]byte(data), &d)
			deltas += d.Delta.Text
		}
	}
	if code != 200 || len(events) < 6 || events[0] != "message_start" || events[len(events)-1] != "message_stop" || deltas != m.Content[0].Text {
		t.Errorf("messages stream: %d %v %q (not streamed %q)", code, events, deltas, m.Content[0].Text)
	}

	code, _, scrape := httpDo(t, "GET", r.url+"/metrics", "")
	if code != 200 || !strings.Contains(string(scrape), "vllm:request_params_n_bucket") || !strings.Contains(string(scrape), "tandem_router:responses_stored 4") {
		t.Errorf("router /metrics: the vllm: aliases or the stored responses are missing:\n%s", grepStored(string(scrape)))
	}

	// The router restarts on its state directory: the responses are still there.
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the router did not exit")
	}
	r2 := startRouterIn(t, "tandem-router-2", state)
	got, err := sdkClient(r2.url).Responses.Get(ctx, next.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != next.OutputText() || got.PreviousResponseID != first.ID {
		t.Errorf("after the router restarted: %v %+v", err, got)
	}
	if other == "" {
		t.Error("the continued response names no worker")
	}
}

func grepStored(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "responses_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
