package openai_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tandem/llm"
	"tandem/openai"
	"tandem/respstore"
)

// fakeBackend returns a fixed short stream, or err from Generate.
type fakeBackend struct {
	err       error
	tokens    []int32
	failAfter int // >0: Next fails with failErr after this many events
	failErr   error
	worker    string
	opened    atomic.Int64
	closed    atomic.Int64
}

type fakeStream struct {
	b      *fakeBackend
	i      int
	closed atomic.Bool
}

type fakeWorkerStream struct{ *fakeStream }

func (s fakeWorkerStream) Worker() string { return s.b.worker }

func (b *fakeBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	if b.err != nil {
		return nil, b.err
	}
	b.opened.Add(1)
	s := &fakeStream{b: b}
	if b.worker != "" {
		return fakeWorkerStream{s}, nil
	}
	return s, nil
}

func (s *fakeStream) Next(ctx context.Context) (llm.Event, error) {
	if err := ctx.Err(); err != nil {
		return llm.Event{}, err
	}
	if s.b.failAfter > 0 && s.i >= s.b.failAfter {
		return llm.Event{}, s.b.failErr
	}
	if s.i >= len(s.b.tokens) {
		return llm.Event{}, io.EOF
	}
	ev := llm.Event{Token: s.b.tokens[s.i], Logprob: -0.5}
	s.i++
	if s.i == len(s.b.tokens) {
		ev.Finish, ev.Usage = llm.FinishLength, llm.Usage{CompletionTokens: s.i}
	}
	return ev, nil
}

func (s *fakeStream) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.b.closed.Add(1)
	}
	return nil
}

// fakeModel serves the stories tokenizer over a fake backend.
func fakeModel(t testing.TB, id string, b *fakeBackend) *openai.Model {
	m := loadStories(t)
	if b.tokens == nil {
		b.tokens = m.Tokenizer.Encode("Lily went to the park.", false, false)
	}
	return &openai.Model{ID: id, Tokenizer: m.Tokenizer, ContextLen: 128, Backend: b, ChatTemplate: testTemplate}
}

type rawResp struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, method, url, body string, header ...string) rawResp {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResp{resp.StatusCode, resp.Header, data}
}

type errBody struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// checkError asserts an OpenAI-shaped error body.
func checkError(t *testing.T, name string, r rawResp, status int, param, code, msgPart string) {
	t.Helper()
	var b errBody
	if err := json.Unmarshal(r.body, &b); err != nil || b.Error == nil || b.Error.Message == "" || b.Error.Type == "" {
		t.Errorf("%s: body %q is not an OpenAI error (%v)", name, r.body, err)
		return
	}
	if r.status != status {
		t.Errorf("%s: status %d, want %d (%s)", name, r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: content type %q", name, ct)
	}
	if param != "" && (b.Error.Param == nil || *b.Error.Param != param) {
		t.Errorf("%s: param %v, want %q (%s)", name, b.Error.Param, param, r.body)
	}
	if code != "" && (b.Error.Code == nil || *b.Error.Code != code) {
		t.Errorf("%s: code %v, want %q", name, b.Error.Code, code)
	}
	if !strings.Contains(b.Error.Message, msgPart) {
		t.Errorf("%s: message %q lacks %q", name, b.Error.Message, msgPart)
	}
}

func TestErrors(t *testing.T) {
	broken := &fakeBackend{}
	queue := &fakeBackend{err: fmt.Errorf("%w: 10 waiting", llm.ErrQueueFull)}
	down := &fakeBackend{err: fmt.Errorf("%w: no workers", llm.ErrUnavailable)}
	boom := &fakeBackend{err: errors.New("boom")}
	invalid := &fakeBackend{err: fmt.Errorf("%w: bad thing", llm.ErrInvalid)}
	long := &fakeBackend{err: fmt.Errorf("%w: 900 prompt tokens do not fit the KV cache", llm.ErrPromptTooLong)}
	raise := fakeModel(t, "raise", broken)
	raise.ChatTemplate = "{{ raise_exception('only user messages, please') }}"
	nochat := fakeModel(t, "nochat", &fakeBackend{})
	nochat.ChatTemplate = ""
	e := newEnv(t, openai.Options{MaxBodyBytes: 4096}, raise, nochat,
		fakeModel(t, "queue", queue), fakeModel(t, "down", down), fakeModel(t, "boom", boom),
		fakeModel(t, "invalid", invalid), fakeModel(t, "long", long))
	chat, comp := e.srv.URL+"/v1/chat/completions", e.srv.URL+"/v1/completions"
	msgs := `"messages":[{"role":"user","content":"Hi"}]`
	huge := strings.Repeat("a ", 3000)

	cases := []struct {
		name, method, url, body string
		status                  int
		param, code, msg        string
		retryAfter              bool
	}{
		{"invalid json", "POST", chat, `{"model":`, 400, "", "", "not valid JSON", false},
		{"empty body", "POST", chat, ``, 400, "", "", "empty", false},
		{"array body", "POST", chat, `[1,2]`, 400, "", "", "JSON object", false},
		{"wrong type", "POST", chat, `{"model":"stories",` + msgs + `,"n":"two"}`, 400, "n", "", "n", false},
		{"unknown model", "POST", chat, `{"model":"gpt-9",` + msgs + `}`, 404, "model", "model_not_found", "gpt-9", false},
		{"missing model, several served", "POST", chat, `{` + msgs + `}`, 400, "model", "", "model", false},
		{"too large", "POST", chat, `{"model":"stories","messages":[{"role":"user","content":"` + huge + `"}]}`, 413, "", "request_too_large", "4096", false},
		{"no messages", "POST", chat, `{"model":"stories","messages":[]}`, 400, "messages", "", "non-empty", false},
		{"function role", "POST", chat, `{"model":"stories","messages":[{"role":"function","content":"x","name":"f"}]}`, 400, "messages[0].role", "", "function", false},
		{"unknown role", "POST", chat, `{"model":"stories","messages":[{"role":"wizard","content":"x"}]}`, 400, "messages[0].role", "", "wizard", false},
		{"image part", "POST", chat, `{"model":"stories","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "", "image_url", false},
		{"content number", "POST", chat, `{"model":"stories","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content", "", "string", false},
		{"user content null", "POST", chat, `{"model":"stories","messages":[{"role":"user","content":null}]}`, 400, "messages[0].content", "", "required", false},
		{"tools without a format", "POST", chat, `{"model":"stories",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, 400, "tools", "", "tool-call format", false},
		{"unsupported schema", "POST", chat, `{"model":"stories",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","not":{}}}}}`, 400, "response_format.json_schema.schema", "", `"not" is not supported`, false},
		{"schema missing", "POST", chat, `{"model":"stories",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}`, 400, "response_format.json_schema.schema", "", "required", false},
		{"structural tag", "POST", chat, `{"model":"stories",` + msgs + `,"response_format":{"type":"structural_tag"}}`, 400, "response_format.type", "", "structural_tag", false},
		{"two formats", "POST", chat, `{"model":"stories",` + msgs + `,"guided_regex":"a+","guided_choice":["a"]}`, 400, "guided_choice", "", "Only one", false},
		{"bad regex", "POST", comp, `{"model":"stories","prompt":"x","guided_regex":"(?=a)"}`, 400, "guided_regex", "", "regular expression", false},
		{"bad grammar", "POST", comp, `{"model":"stories","prompt":"x","guided_grammar":"root ::= ("}`, 400, "guided_grammar", "", "unclosed", false},
		{"left recursion", "POST", comp, `{"model":"stories","prompt":"x","guided_grammar":"root ::= root \"a\" | \"b\""}`, 400, "guided_grammar", "", "left-recursive", false},
		{"empty choice", "POST", comp, `{"model":"stories","prompt":"x","guided_choice":[]}`, 400, "guided_choice", "", "non-empty", false},
		{"whitespace pattern", "POST", comp, `{"model":"stories","prompt":"x","guided_json":{},"guided_whitespace_pattern":" *"}`, 400, "guided_whitespace_pattern", "", "not supported", false},
		{"structured outputs two", "POST", comp, `{"model":"stories","prompt":"x","structured_outputs":{"regex":"a","choice":["b"]}}`, 400, "structured_outputs", "", "only one", false},
		{"stream_options without stream", "POST", comp, `{"model":"stories","prompt":"x","stream_options":{"include_usage":true}}`, 400, "stream_options", "", "stream is true", false},
		{"prompt_logprobs out of range", "POST", comp, `{"model":"stories","prompt":"x","prompt_logprobs":50}`, 400, "prompt_logprobs", "", "between 0 and 20", false},
		{"min_tokens negative", "POST", chat, `{"model":"stories",` + msgs + `,"min_tokens":-1}`, 400, "min_tokens", "", "at least 0", false},
		{"min_tokens over max_tokens", "POST", chat, `{"model":"stories",` + msgs + `,"min_tokens":9,"max_tokens":3}`, 400, "min_tokens", "", "must not exceed max_tokens", false},
		{"beam search", "POST", chat, `{"model":"stories",` + msgs + `,"use_beam_search":true}`, 400, "use_beam_search", "", "beam", false},
		{"allowed_token_ids empty", "POST", comp, `{"model":"stories","prompt":"x","allowed_token_ids":[]}`, 400, "allowed_token_ids", "", "must not be empty", false},
		{"allowed_token_ids outside", "POST", comp, `{"model":"stories","prompt":"x","allowed_token_ids":[1,99999]}`, 400, "allowed_token_ids", "", "outside the vocabulary", false},
		{"continue_final_message with add_generation_prompt", "POST", chat, `{"model":"stories",` + msgs + `,"continue_final_message":true,"add_generation_prompt":true}`, 400, "continue_final_message", "", "cannot both be true", false},
		{"legacy functions", "POST", chat, `{"model":"stories",` + msgs + `,"functions":[{"name":"f"}]}`, 400, "functions", "", "use tools", false},
		{"required without tools", "POST", chat, `{"model":"stories",` + msgs + `,"tool_choice":"required"}`, 400, "tool_choice", "", "needs tools", false},
		{"template kwargs messages", "POST", chat, `{"model":"stories",` + msgs + `,"chat_template_kwargs":{"messages":[]}}`, 400, "chat_template_kwargs", "", "messages", false},
		{"temperature", "POST", chat, `{"model":"stories",` + msgs + `,"temperature":-1}`, 400, "temperature", "", "temperature", false},
		{"top_p", "POST", chat, `{"model":"stories",` + msgs + `,"top_p":1.5}`, 400, "top_p", "", "top_p", false},
		{"presence", "POST", chat, `{"model":"stories",` + msgs + `,"presence_penalty":3}`, 400, "presence_penalty", "", "presence_penalty", false},
		{"n zero", "POST", chat, `{"model":"stories",` + msgs + `,"n":0}`, 400, "n", "", "n must be", false},
		{"n huge", "POST", chat, `{"model":"stories",` + msgs + `,"n":1000}`, 400, "n", "", "n must be", false},
		{"max_tokens zero", "POST", chat, `{"model":"stories",` + msgs + `,"max_tokens":0}`, 400, "max_tokens", "", "at least 1", false},
		{"max_completion_tokens", "POST", chat, `{"model":"stories",` + msgs + `,"max_completion_tokens":-5}`, 400, "max_completion_tokens", "", "at least 1", false},
		{"top_logprobs without logprobs", "POST", chat, `{"model":"stories",` + msgs + `,"top_logprobs":2}`, 400, "top_logprobs", "", "logprobs", false},
		{"top_logprobs too many", "POST", chat, `{"model":"stories",` + msgs + `,"logprobs":true,"top_logprobs":50}`, 400, "top_logprobs", "", "top_logprobs", false},
		{"logit_bias key", "POST", chat, `{"model":"stories",` + msgs + `,"logit_bias":{"abc":1}}`, 400, "logit_bias", "", "abc", false},
		{"logit_bias id", "POST", chat, `{"model":"stories",` + msgs + `,"logit_bias":{"99999":1}}`, 400, "logit_bias", "", "99999", false},
		{"stop type", "POST", chat, `{"model":"stories",` + msgs + `,"stop":5}`, 400, "stop", "", "stop", false},
		{"stop_token_ids", "POST", chat, `{"model":"stories",` + msgs + `,"stop_token_ids":[-1]}`, 400, "stop_token_ids", "", "-1", false},
		{"context", "POST", chat, `{"model":"stories","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("Lily ", 40) + `"}]}`, 400, "messages", "context_length_exceeded", "maximum context length is 128 tokens. However, you requested", false},
		{"context no max", "POST", comp, `{"model":"stories","prompt":"` + strings.Repeat("Lily ", 200) + `"}`, 400, "prompt", "context_length_exceeded", "maximum context length is 128", false},
		{"template error", "POST", chat, `{"model":"raise",` + msgs + `}`, 400, "messages", "", "only user messages, please", false},
		{"no template", "POST", chat, `{"model":"nochat",` + msgs + `}`, 400, "messages", "", "no chat template", false},
		{"token out of vocab", "POST", comp, `{"model":"stories","prompt":[1,2,512]}`, 400, "prompt", "", "512", false},
		{"token lists out of vocab", "POST", comp, `{"model":"stories","prompt":[[1,2],[1,-3]]}`, 400, "prompt", "", "prompt[1]", false},
		{"token float", "POST", comp, `{"model":"stories","prompt":[1,2.5]}`, 400, "prompt", "", "token ids", false},
		{"prompt object", "POST", comp, `{"model":"stories","prompt":{"a":1}}`, 400, "prompt", "", "prompt", false},
		{"prompt empty list", "POST", comp, `{"model":"stories","prompt":[]}`, 400, "prompt", "", "empty", false},
		{"prompt missing", "POST", comp, `{"model":"stories"}`, 400, "prompt", "", "required", false},
		{"prompt mixed", "POST", comp, `{"model":"stories","prompt":["a",1]}`, 400, "prompt", "", "strings", false},
		{"logprobs too many", "POST", comp, `{"model":"stories","prompt":"a","logprobs":21}`, 400, "logprobs", "", "logprobs", false},
		{"best_of", "POST", comp, `{"model":"stories","prompt":"a","best_of":3}`, 400, "best_of", "", "best_of", false},
		{"queue full", "POST", comp, `{"model":"queue","prompt":"a"}`, 429, "", "", "busy", true},
		{"unavailable", "POST", chat, `{"model":"down",` + msgs + `}`, 503, "", "", "unavailable", true},
		{"internal", "POST", comp, `{"model":"boom","prompt":"a"}`, 500, "", "", "boom", false},
		{"backend invalid", "POST", comp, `{"model":"invalid","prompt":"a"}`, 400, "", "", "bad thing", false},
		{"backend too long", "POST", comp, `{"model":"long","prompt":"a"}`, 400, "", "context_length_exceeded", "KV cache", false},
		{"backend error streaming", "POST", comp, `{"model":"boom","prompt":"a","stream":true}`, 500, "", "", "boom", false},
		{"wrong method", "GET", chat, ``, 405, "", "method_not_allowed", "POST", false},
		{"wrong method models", "POST", e.srv.URL + "/v1/models", `{}`, 405, "", "", "GET", false},
		{"unknown path", "GET", e.srv.URL + "/v1/nothing", ``, 404, "", "not_found", "/v1/nothing", false},
		{"unknown root path", "GET", e.srv.URL + "/", ``, 404, "", "not_found", "", false},
		{"unknown model get", "GET", e.srv.URL + "/v1/models/nope", ``, 404, "model", "model_not_found", "nope", false},
		{"tokenize nothing", "POST", e.srv.URL + "/tokenize", `{"model":"stories"}`, 400, "", "", "prompt", false},
		{"detokenize bad id", "POST", e.srv.URL + "/detokenize", `{"model":"stories","tokens":[1,9999]}`, 400, "tokens", "", "9999", false},
	}
	for _, c := range cases {
		r := do(t, c.method, c.url, c.body)
		checkError(t, c.name, r, c.status, c.param, c.code, c.msg)
		if c.retryAfter != (r.header.Get("Retry-After") != "") {
			t.Errorf("%s: Retry-After %q", c.name, r.header.Get("Retry-After"))
		}
		if c.status == 405 && r.header.Get("Allow") == "" {
			t.Errorf("%s: no Allow header", c.name)
		}
		// The server still serves.
		if r := do(t, "POST", comp, `{"model":"stories","prompt":"Once","max_tokens":2,"temperature":0}`); r.status != 200 {
			t.Fatalf("after %s: %d %s", c.name, r.status, r.body)
		}
	}
}

func TestOddShapes(t *testing.T) {
	e := newEnv(t, openai.Options{})
	chat, comp := e.srv.URL+"/v1/chat/completions", e.srv.URL+"/v1/completions"
	ok := []struct{ name, url, body string }{
		{"no model, one served", chat, `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3}`},
		{"developer role and parts", chat, `{"model":"stories","max_tokens":3,"messages":[{"role":"developer","content":"Be nice."},{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}]},{"role":"assistant","content":null},{"role":"user","content":"More"}]}`},
		{"all sampling knobs", chat, `{"model":"stories","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"presence_penalty":0.5,"frequency_penalty":0.5,"repetition_penalty":1.1,"seed":-3,"logit_bias":{"13":-100},"user":"u","priority":2,"ignore_eos":true,"stop":["x","y","z","w","v","u"],"stop_token_ids":[13],"tools":[],"tool_choice":"none","response_format":{"type":"text"},"unknown_field":{"a":[1]},"skip_special_tokens":true,"min_tokens":0,"use_beam_search":false,"length_penalty":1.0,"return_token_ids":false,"guided_decoding_backend":"xgrammar","echo":false,"modalities":["text"]}`},
		{"top_p zero", chat, `{"model":"stories","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],"top_p":0}`},
		{"null fields", comp, `{"model":"stories","prompt":"Once","max_tokens":null,"stop":null,"n":null,"temperature":null,"logprobs":null,"seed":null}`},
		{"empty string prompt (BOS only)", comp, `{"model":"stories","prompt":"","max_tokens":2}`},
		{"best_of equal n", comp, `{"model":"stories","prompt":"a","max_tokens":2,"best_of":1}`},
	}
	for _, c := range ok {
		r := do(t, "POST", c.url, c.body)
		if r.status != 200 {
			t.Errorf("%s: %d %s", c.name, r.status, r.body)
		}
	}
	// Greedy with top_p 0 equals temperature 0.
	a := do(t, "POST", comp, `{"model":"stories","prompt":"Once","max_tokens":10,"top_p":0,"temperature":1.5}`)
	b := do(t, "POST", comp, `{"model":"stories","prompt":"Once","max_tokens":10,"temperature":0}`)
	var ra, rb struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	json.Unmarshal(a.body, &ra)
	json.Unmarshal(b.body, &rb)
	if len(ra.Choices) != 1 || len(rb.Choices) != 1 || ra.Choices[0].Text != rb.Choices[0].Text {
		t.Errorf("top_p 0: %s; temperature 0: %s", a.body, b.body)
	}
	// A prompt with the stop token id ends there, giving no text for it.
	r := do(t, "POST", comp, `{"model":"stories","prompt":"Once upon a time","max_tokens":60,"temperature":0,"stop_token_ids":[13]}`)
	var rs struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(r.body, &rs) != nil || len(rs.Choices) != 1 || rs.Choices[0].FinishReason != "stop" || strings.Contains(rs.Choices[0].Text, "\n") {
		t.Errorf("stop_token_ids: %s", r.body)
	}
}

func TestAPIKey(t *testing.T) {
	e := newEnv(t, openai.Options{APIKey: "k3y"})
	url := e.srv.URL + "/v1/completions"
	body := `{"model":"stories","prompt":"Once","max_tokens":1}`
	for _, c := range []struct {
		name   string
		header []string
		status int
	}{
		{"none", nil, 401},
		{"wrong", []string{"Authorization", "Bearer nope"}, 401},
		{"not bearer", []string{"Authorization", "Basic k3y"}, 401},
		{"right", []string{"Authorization", "Bearer k3y"}, 200},
	} {
		r := do(t, "POST", url, body, c.header...)
		if r.status != c.status {
			t.Errorf("%s: %d %s", c.name, r.status, r.body)
		}
		if c.status == 401 {
			checkError(t, c.name, r, 401, "", "invalid_api_key", "API key")
		}
	}
	if r := do(t, "GET", e.srv.URL+"/v1/nothing", ""); r.status != 401 {
		t.Errorf("unknown /v1 path without a key: %d", r.status)
	}
	// /tokenize and /detokenize are outside /v1 and were open; they need the key too.
	for _, path := range []string{"/tokenize", "/detokenize"} {
		body := `{"prompt":"Hi"}`
		if path == "/detokenize" {
			body = `{"tokens":[1,2]}`
		}
		if r := do(t, "POST", e.srv.URL+path, body); r.status != 401 {
			t.Errorf("%s without a key: %d %s", path, r.status, r.body)
		}
		if r := do(t, "POST", e.srv.URL+path, body, "Authorization", "Bearer k3y"); r.status != 200 {
			t.Errorf("%s with the key: %d %s", path, r.status, r.body)
		}
	}
}

func TestModelsRaw(t *testing.T) {
	slash := fakeModel(t, "org/model-7b", &fakeBackend{})
	e := newEnv(t, openai.Options{}, slash)
	r := do(t, "GET", e.srv.URL+"/v1/models", "")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy string
			MaxModelLen         int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || r.status != 200 || list.Object != "list" || len(list.Data) != 2 ||
		list.Data[0].ID != "stories" || list.Data[0].MaxModelLen != 128 || list.Data[1].ID != "org/model-7b" {
		t.Errorf("models: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", e.srv.URL+"/v1/models/org/model-7b", ""); r.status != 200 || !strings.Contains(string(r.body), `"id":"org/model-7b"`) {
		t.Errorf("model with a slash: %d %s", r.status, r.body)
	}
}

func TestTokenize(t *testing.T) {
	e := newEnv(t, openai.Options{})
	tok := e.m.Tokenizer
	type tokResp struct {
		Tokens      []int32  `json:"tokens"`
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		TokenStrs   []string `json:"token_strs"`
	}
	post := func(path, body string) (tokResp, string) {
		r := do(t, "POST", e.srv.URL+path, body)
		if r.status != 200 {
			t.Fatalf("%s %s: %d %s", path, body, r.status, r.body)
		}
		var out tokResp
		json.Unmarshal(r.body, &out)
		return out, string(r.body)
	}
	text := "Once upon a time, Lily saw a <s> dog."
	got, _ := post("/tokenize", fmt.Sprintf(`{"model":"stories","prompt":%q,"return_token_strs":true}`, text))
	want := tok.Encode(text, true, true)
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want) || got.Count != len(want) || got.MaxModelLen != 128 || len(got.TokenStrs) != len(want) {
		t.Errorf("tokenize: %+v, want %v", got, want)
	}
	noSpecial, _ := post("/tokenize", fmt.Sprintf(`{"model":"stories","prompt":%q,"add_special_tokens":false}`, text))
	if len(noSpecial.Tokens) != len(want)-1 {
		t.Errorf("add_special_tokens false: %v", noSpecial.Tokens)
	}
	ids, _ := json.Marshal(got.Tokens[1:])
	var detok struct {
		Prompt string `json:"prompt"`
	}
	r := do(t, "POST", e.srv.URL+"/detokenize", fmt.Sprintf(`{"model":"stories","tokens":%s}`, ids))
	if json.Unmarshal(r.body, &detok) != nil || detok.Prompt != tok.Decode(got.Tokens[1:]) || !strings.Contains(detok.Prompt, "Lily saw a") {
		t.Errorf("detokenize: %s", r.body)
	}
	// Chat messages tokenize as the chat endpoint encodes them: one BOS.
	chat, _ := post("/tokenize", `{"model":"stories","messages":[{"role":"user","content":"Hi"}]}`)
	if fmt.Sprint(chat.Tokens) != fmt.Sprint(e.chatPromptTokens()) {
		t.Errorf("tokenize messages: %v, want %v", chat.Tokens, e.chatPromptTokens())
	}
	noGen, _ := post("/tokenize", `{"model":"stories","messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false}`)
	if len(noGen.Tokens) >= len(chat.Tokens) {
		t.Errorf("add_generation_prompt false: %v", noGen.Tokens)
	}
}

// sseEvents reads data events until [DONE] or the end of the body.
func sseEvents(t *testing.T, body io.Reader) (events []string, done bool) {
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			return events, true
		}
		events = append(events, data)
	}
	return events, false
}

func TestStreamErrorMidway(t *testing.T) {
	b := &fakeBackend{failAfter: 2, failErr: fmt.Errorf("%w: worker lost", llm.ErrUnavailable)}
	e := newEnv(t, openai.Options{}, fakeModel(t, "flaky", b))
	resp, err := http.Post(e.srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"flaky","stream":true,"messages":[{"role":"user","content":"Hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events, done := sseEvents(t, resp.Body)
	if !done || len(events) < 2 {
		t.Fatalf("events %v, done %v", events, done)
	}
	var last errBody
	if json.Unmarshal([]byte(events[len(events)-1]), &last) != nil || last.Error == nil || !strings.Contains(last.Error.Message, "worker lost") {
		t.Errorf("last event %s", events[len(events)-1])
	}
	b.settle(t, 1)
}

// settle waits, boundedly, until n streams were opened and all were closed
// (the handler closes them as it returns, just after the response is sent).
func (b *fakeBackend) settle(t *testing.T, n int64) {
	t.Helper()
	for start := time.Now(); b.opened.Load() != n || b.closed.Load() != n; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("streams opened %d, closed %d, want %d", b.opened.Load(), b.closed.Load(), n)
		}
	}
}

func TestWorkerHeaderAndLog(t *testing.T) {
	b := &fakeBackend{worker: "w-17"}
	e := newEnv(t, openai.Options{}, fakeModel(t, "routed", b))
	for _, stream := range []string{"false", "true"} {
		r := do(t, "POST", e.srv.URL+"/v1/completions", `{"model":"routed","prompt":"Hi","n":2,"stream":`+stream+`}`)
		if r.status != 200 || r.header.Get("X-Tandem-Worker") != "w-17" {
			t.Errorf("stream %s: status %d, worker header %q", stream, r.status, r.header.Get("X-Tandem-Worker"))
		}
	}
	b.settle(t, 4)
	logs := e.logs.String()
	for start := time.Now(); strings.Count(logs, "worker=w-17") < 2 && time.Since(start) < 5*time.Second; time.Sleep(time.Millisecond) {
		logs = e.logs.String() // the line is written as the handler returns, after the response
	}
	for _, want := range []string{"method=POST", "path=/v1/completions", "model=routed", "status=200", "prompt_tokens=", fmt.Sprintf("completion_tokens=%d", 2*len(b.tokens)), "worker=w-17", "duration="} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

func TestClientDisconnectClosesStream(t *testing.T) {
	e := newEnv(t, openai.Options{})
	e.be.delay = 20 * time.Millisecond
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		for _, stream := range []bool{true, false} {
			ctx, cancel := context.WithCancel(context.Background())
			body := fmt.Sprintf(`{"model":"stories","stream":%v,"ignore_eos":true,"max_tokens":100,"messages":[{"role":"user","content":"Hi"}],"prompt":"Once"}`, stream)
			req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+path, strings.NewReader(body))
			closedBefore := e.be.closed.Load()
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				if stream {
					br := bufio.NewReader(resp.Body)
					br.ReadString('\n') // the first event arrived: generation is under way
					cancel()
				}
				io.Copy(io.Discard, resp.Body)
			}()
			if !stream {
				time.Sleep(100 * time.Millisecond) // a few tokens in
				cancel()
			}
			start := time.Now()
			for e.be.closed.Load() == closedBefore || e.be.running.Load() != 0 {
				if time.Since(start) > time.Second { // the full generation would take 2s
					t.Fatalf("%s stream=%v: the stream was not closed after the client left (closed %d, running %d)", path, stream, e.be.closed.Load(), e.be.running.Load())
				}
				time.Sleep(2 * time.Millisecond)
			}
			<-done
			cancel()
		}
	}
	if !strings.Contains(e.logs.String(), "status=499") && !strings.Contains(e.logs.String(), "status=200") {
		t.Errorf("logs: %s", e.logs.String())
	}
}

// FuzzChatRequest feeds arbitrary bodies to the handler: it must not panic,
// and every non-2xx answer carries an OpenAI error body.
func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"Hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}],"stream":true,"n":3,"stop":["a","</s>"]}`,
		`{"messages":[{"role":"system","content":"x"},{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":5,"max_tokens":3}`,
		`{"messages":[{"role":"user","content":"Hi"}],"temperature":1e309,"logit_bias":{"1":5}}`,
		`{"prompt":[[1,2],[3]],"n":2,"logprobs":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":"Once","stop":"e","include_stop_str_in_output":true}`,
		`[]`, `null`, `{"messages":null}`, `"x"`, `{"n":-1}`,
	} {
		f.Add(s)
	}
	m := loadStories(f)
	b := &fakeBackend{tokens: m.Tokenizer.Encode("Lily went to the park.", false, false)}
	h := openai.NewHandler([]*openai.Model{{ID: "m", Tokenizer: m.Tokenizer, ContextLen: 128, Backend: b, ChatTemplate: testTemplate}},
		openai.Options{MaxBodyBytes: 1 << 16, Logger: discardLogger()})
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/tokenize"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
			if rec.Code/100 == 2 {
				continue
			}
			var eb errBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error == nil || eb.Error.Message == "" {
				t.Fatalf("%s %q: status %d, body %q", path, body, rec.Code, rec.Body.String())
			}
		}
		if b.opened.Load() != b.closed.Load() {
			t.Fatalf("streams opened %d, closed %d", b.opened.Load(), b.closed.Load())
		}
	})
}

// A handler with no model yet (a router before its first worker) answers 503 with a
// message that says so, not a 404 about the model; every response names its request.
func TestNoModelsYet(t *testing.T) {
	srv := httptest.NewServer(openai.NewHandler(nil, openai.Options{Logger: discardLogger()}))
	defer srv.Close()
	for path, body := range map[string]string{"/v1/chat/completions": `{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		"/v1/completions": `{"model":"m","prompt":"x"}`, "/v1/embeddings": `{"model":"m","input":"x"}`, "/v1/responses": `{"model":"m","input":"x"}`} {
		r := do(t, "POST", srv.URL+path, body)
		checkError(t, path, r, http.StatusServiceUnavailable, "", "no_model", "no worker has joined")
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After", path)
		}
	}
	r := do(t, "GET", srv.URL+"/v1/models/m", "", "X-Request-Id", "abc-1")
	checkError(t, "get model", r, http.StatusServiceUnavailable, "", "no_model", "")
	if r.header.Get("X-Request-Id") != "abc-1" {
		t.Errorf("request id %q", r.header.Get("X-Request-Id"))
	}
	if r := do(t, "GET", srv.URL+"/v1/models", ""); r.status != 200 || !strings.Contains(string(r.body), `"data":[]`) || len(r.header.Get("X-Request-Id")) != 24 {
		t.Errorf("models: %d %s %v", r.status, r.body, r.header)
	}
}

// The Responses, Messages and embeddings parsers: any body gets a 2xx or an error in the
// endpoint's shape, never a crash, and every stream opened is closed.
func FuzzAgentAPIs(f *testing.F) {
	for _, s := range []string{
		`{"input":"Hi","instructions":"x","max_output_tokens":3}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}],"stream":true}`,
		`{"input":"x","previous_response_id":"resp_x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}}`,
		`{"max_tokens":3,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}],"stream":true}`,
		`{"max_tokens":3,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}},{"type":"thinking","thinking":"hm"}]}]}`,
		`{"input":["a","b"],"dimensions":4,"encoding_format":"base64"}`,
		`{"input":[[1,2],[3]]}`, `[]`, `null`, `{"input":null}`, `{"messages":7}`,
	} {
		f.Add(s)
	}
	m := loadStories(f)
	b := &fakeBackend{tokens: m.Tokenizer.Encode("Lily went to the park.", false, false)}
	h := openai.NewHandler([]*openai.Model{{ID: "m", Tokenizer: m.Tokenizer, ContextLen: 128, Backend: b, ChatTemplate: testTemplate}},
		openai.Options{MaxBodyBytes: 1 << 16, Logger: discardLogger(), Responses: respstore.NewMemory(respstore.Options{})})
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/embeddings"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
			if rec.Code/100 == 2 {
				continue
			}
			var eb errBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error == nil || eb.Error.Message == "" || eb.Error.Type == "" {
				t.Fatalf("%s %q: status %d, body %q", path, body, rec.Code, rec.Body.String())
			}
		}
		if b.opened.Load() != b.closed.Load() {
			t.Fatalf("streams opened %d, closed %d", b.opened.Load(), b.closed.Load())
		}
	})
}
