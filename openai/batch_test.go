package openai_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"tandem/llm"
	"tandem/openai"
)

// readyBackend is fakeBackend whose streams say their next event is ready for all but
// every third token (as a router's stream does when several tokens came at once).
type readyBackend struct{ *fakeBackend }

type readyStream struct{ *fakeStream }

func (s readyStream) Ready() bool { return s.i%3 != 0 && s.i < len(s.b.tokens) }

func (b readyBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	st, err := b.fakeBackend.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	return readyStream{st.(*fakeStream)}, nil
}

// countingWriter counts the writes and flushes that reach the connection.
type countingWriter struct {
	*httptest.ResponseRecorder
	writes, flushes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.ResponseRecorder.Write(p)
}

func (w *countingWriter) Flush() {
	w.flushes++
	w.ResponseRecorder.Flush()
}

var volatile = regexp.MustCompile(`"(id|item_id|created|created_at)":("[^"]*"|[0-9]+)|(msg|resp|rs|toolu|call|fc|chatcmpl|cmpl)[-_][0-9a-f]{8,}`)

// A stream whose tokens come several at a time is written in fewer writes and flushes,
// and its bytes are those of the same stream written a token at a time: every token, in
// order, with its finish and usage, for each API that streams.
func TestReadyTokensShareAWrite(t *testing.T) {
	m := loadStories(t)
	tokens := m.Tokenizer.Encode("Lily went to the park. She saw a big dog and they played all day long.", false, false)
	serve := func(b openai.Backend, path, body string, interval int) (string, int) {
		h := openai.NewHandler([]*openai.Model{{ID: "m", Tokenizer: m.Tokenizer, ContextLen: 128, Backend: b, ChatTemplate: testTemplate}},
			openai.Options{Logger: discardLogger(), StreamInterval: interval})
		w := &countingWriter{ResponseRecorder: httptest.NewRecorder()}
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		if w.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, w.Code, w.Body.String())
		}
		return volatile.ReplaceAllString(w.Body.String(), "X"), w.flushes
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"m","prompt":"Once","stream":true,"stream_options":{"include_usage":true}}`},
		{"/v1/completions", `{"model":"m","prompt":"Once","stream":true,"return_token_ids":true}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Hi"}],"stream":true,"logprobs":true,"top_logprobs":2}`},
		{"/v1/completions", `{"model":"m","prompt":"Once","stream":true,"n":2}`},
		{"/v1/messages", `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"Hi"}],"stream":true}`},
		{"/v1/responses", `{"model":"m","input":"Hi","stream":true}`},
	} {
		one, oneFlushes := serve(&fakeBackend{tokens: tokens}, c.path, c.body, 1)
		batched, batchedFlushes := serve(readyBackend{&fakeBackend{tokens: tokens}}, c.path, c.body, 1)
		every4, every4Flushes := serve(&fakeBackend{tokens: tokens}, c.path, c.body, 4)
		if strings.Contains(c.body, `"n":2`) { // two choices interleave as their events come
			one, batched, every4 = sortedLines(one), sortedLines(batched), sortedLines(every4)
		}
		if batched != one {
			t.Errorf("%s %s: written in batches:\n%s\none token at a time:\n%s", c.path, c.body, batched, one)
		}
		if every4 != one {
			t.Errorf("%s %s: written every 4 tokens:\n%s\none token at a time:\n%s", c.path, c.body, every4, one)
		}
		if !strings.Contains(c.body, `"n":2`) && batchedFlushes >= oneFlushes {
			t.Errorf("%s %s: %d flushes with tokens ready, %d one at a time", c.path, c.body, batchedFlushes, oneFlushes)
		}
		// The first token at once, then every 4: fewer than half the flushes (the
		// events before the first token and after the last are written as before).
		if !strings.Contains(c.body, `"n":2`) && every4Flushes >= oneFlushes/2 {
			t.Errorf("%s %s: %d flushes every 4 tokens, %d one at a time", c.path, c.body, every4Flushes, oneFlushes)
		}
		if !strings.Contains(one, "[DONE]") && !strings.Contains(one, "message_stop") && !strings.Contains(one, "response.completed") && !strings.Contains(one, "response.incomplete") {
			t.Errorf("%s: the stream did not end: %s", c.path, one)
		}
	}
}

func sortedLines(s string) string {
	lines := strings.Split(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
