package openai_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"tandem/openai"
)

// The Anthropic Messages API has no Go SDK here: these tests speak its documented wire
// format (https://docs.anthropic.com/en/api/messages, .../messages-streaming) over raw HTTP.

type anthropicEvent struct {
	name string
	data map[string]any
}

// postMessages sends a Messages request and returns the status, the JSON body (not
// streamed) or the events (streamed).
func postMessages(t *testing.T, url, body string, header ...string) (int, map[string]any, []anthropicEvent) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var out map[string]any
		data, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("body %q: %v", data, err)
		}
		return resp.StatusCode, out, nil
	}
	var events []anthropicEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("event %s: %v", name, err)
			}
			if d["type"] != name {
				t.Errorf("event %q carries type %v", name, d["type"])
			}
			events = append(events, anthropicEvent{name, d})
		}
	}
	return resp.StatusCode, nil, events
}

// text of the streamed blocks of one type, and the event names in order.
func streamed(events []anthropicEvent, deltaType, field string) (string, []string) {
	var sb strings.Builder
	var names []string
	for _, ev := range events {
		names = append(names, ev.name)
		if d, ok := ev.data["delta"].(map[string]any); ok && d["type"] == deltaType {
			sb.WriteString(d[field].(string))
		}
	}
	return sb.String(), names
}

func TestMessagesAPI(t *testing.T) {
	e := newFixtureEnv(t, qwenFixture, nil)
	body := `{"model":"m","max_tokens":10,"temperature":0,"system":"Be brief.","thinking":{"type":"disabled"},"messages":[{"role":"user","content":"Hello"}]`
	status, out, _ := postMessages(t, e.srv.URL, body+`}`)
	if status != 200 || out["type"] != "message" || out["role"] != "assistant" || out["stop_reason"] != "max_tokens" || !strings.HasPrefix(out["id"].(string), "msg_") {
		t.Fatalf("%d %v", status, out)
	}
	content := out["content"].([]any)
	text := content[0].(map[string]any)["text"].(string)
	if u := out["usage"].(map[string]any); u["output_tokens"].(float64) != 10 || u["input_tokens"].(float64) == 0 || text == "" {
		t.Errorf("usage %v, text %q", u, text)
	}
	_, _, events := postMessages(t, e.srv.URL, body+`,"stream":true}`)
	got, names := streamed(events, "text_delta", "text")
	if got != text {
		t.Errorf("streamed %q, not streamed %q", got, text)
	}
	want := []string{"message_start", "ping", "content_block_start"}
	if len(names) < 7 || !slices.Equal(names[:3], want) || !slices.Equal(names[len(names)-3:], []string{"content_block_stop", "message_delta", "message_stop"}) {
		t.Errorf("event order %v", names)
	}
	if d := events[len(events)-2].data; d["delta"].(map[string]any)["stop_reason"] != "max_tokens" || d["usage"].(map[string]any)["output_tokens"].(float64) != 10 {
		t.Errorf("message_delta %v", d)
	}

	// A stop sequence: stop_reason stop_sequence, naming it.
	if r := []rune(text); len(r) > 3 {
		seq := string(r[1:3])
		stop, _ := json.Marshal([]string{seq})
		_, out, _ = postMessages(t, e.srv.URL, `{"model":"m","max_tokens":10,"temperature":0,"system":"Be brief.","thinking":{"type":"disabled"},"stop_sequences":`+string(stop)+`,"messages":[{"role":"user","content":"Hello"}]}`)
		if out["stop_reason"] != "stop_sequence" || out["stop_sequence"] != seq {
			t.Errorf("stop sequence %q: %v", seq, out)
		}
	}

	// count_tokens: the prompt as /v1/messages renders it.
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/messages/count_tokens", strings.NewReader(`{"model":"m","system":"Be brief.","thinking":{"type":"disabled"},"messages":[{"role":"user","content":"Hello"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var count map[string]float64
	json.NewDecoder(resp.Body).Decode(&count)
	resp.Body.Close()
	if u := out["usage"].(map[string]any); count["input_tokens"] != u["input_tokens"].(float64)+u["cache_read_input_tokens"].(float64) {
		t.Errorf("count_tokens %v, the request's usage %v", count, out["usage"])
	}

	// Errors have Anthropic's shape.
	for _, tc := range []struct {
		body   string
		status int
		typ    string
	}{
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{`{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, 400, "invalid_request_error"},
		{`{"model":"m","max_tokens":1,"tools":[{"type":"web_search_20250305","name":"w"}],"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
	} {
		status, out, _ := postMessages(t, e.srv.URL, tc.body)
		errObj, _ := out["error"].(map[string]any)
		if status != tc.status || out["type"] != "error" || errObj["type"] != tc.typ || errObj["message"] == "" {
			t.Errorf("%s: %d %v", tc.body, status, out)
		}
	}
}

// Tools: a forced tool use comes back as a tool_use block whose input follows the schema,
// stop_reason tool_use, streamed as input_json_delta; its result goes back as tool_result.
func TestMessagesTools(t *testing.T) {
	e := newFixtureEnv(t, qwenFixture, nil)
	tools := `"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false}}]`
	body := `{"model":"m","max_tokens":80,"temperature":0,"thinking":{"type":"disabled"},` + tools + `,"tool_choice":{"type":"tool","name":"get_weather"},"messages":[{"role":"user","content":"Weather in Oslo?"}]`
	status, out, _ := postMessages(t, e.srv.URL, body+`}`)
	if status != 200 || out["stop_reason"] != "tool_use" {
		t.Fatalf("%d %v", status, out)
	}
	var use map[string]any
	for _, b := range out["content"].([]any) {
		if b := b.(map[string]any); b["type"] == "tool_use" {
			use = b
		}
	}
	input, _ := use["input"].(map[string]any)
	if use["name"] != "get_weather" || !strings.HasPrefix(use["id"].(string), "toolu_") || input["city"] == nil {
		t.Fatalf("tool_use %v", out["content"])
	}
	_, _, events := postMessages(t, e.srv.URL, body+`,"stream":true}`)
	partial, _ := streamed(events, "input_json_delta", "partial_json")
	var args map[string]any
	if err := json.Unmarshal([]byte(partial), &args); err != nil || args["city"] != input["city"] {
		t.Errorf("streamed input %q (%v), not streamed %v", partial, err, input)
	}
	var started map[string]any
	for _, ev := range events {
		if ev.name == "content_block_start" {
			started = ev.data["content_block"].(map[string]any)
		}
	}
	if started["type"] != "tool_use" || started["name"] != "get_weather" {
		t.Errorf("content_block_start %v", started)
	}

	// The round trip: the tool_use and its tool_result in the history.
	inputJSON, _ := json.Marshal(input)
	history := `{"model":"m","max_tokens":4,"thinking":{"type":"disabled"},` + tools + `,"messages":[{"role":"user","content":"Weather in Oslo?"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":` + string(inputJSON) + `}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"Sunny, 21 C"}]}]}`
	if status, out, _ := postMessages(t, e.srv.URL, history); status != 200 || out["type"] != "message" {
		t.Errorf("tool_result round trip: %d %v", status, out)
	}
}

// x-api-key is accepted like the bearer key; errors then are Anthropic's too.
func TestMessagesAPIKey(t *testing.T) {
	e := newEnv(t, openai.Options{APIKey: "sekret"})
	body := `{"model":"stories","max_tokens":2,"messages":[{"role":"user","content":"Hi"}]}`
	if status, out, _ := postMessages(t, e.srv.URL, body); status != 401 || out["error"].(map[string]any)["type"] != "authentication_error" {
		t.Errorf("no key: %d %v", status, out)
	}
	if status, out, _ := postMessages(t, e.srv.URL, body, "x-api-key", "sekret"); status != 200 {
		t.Errorf("x-api-key: %d %v", status, out)
	}
	if r := do(t, "GET", e.srv.URL+"/v1/models", "", "X-Api-Key", "sekret"); r.status != 200 {
		t.Errorf("x-api-key on /v1/models: %d", r.status)
	}
}
