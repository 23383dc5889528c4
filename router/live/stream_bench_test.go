package live

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"tandem/internal/costs"
	"tandem/llm"
	"tandem/openai"
)

// tokensBackend answers every request with a stream of n tokens (words of the Llama 3
// vocabulary), each Ready when ready is set, as the router's stream is when tokens came
// several to a message.
type tokensBackend struct {
	ids   []int32
	n     int
	ready bool
}

func (b *tokensBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	return &tokensStream{b: b}, nil
}

type tokensStream struct {
	b *tokensBackend
	i int
}

func (s *tokensStream) Next(ctx context.Context) (llm.Event, error) {
	if s.i >= s.b.n {
		return llm.Event{}, io.EOF
	}
	ev := llm.Event{Token: s.b.ids[s.i%len(s.b.ids)], Logprob: -0.25}
	s.i++
	if s.i == s.b.n {
		ev.Finish, ev.Usage = llm.FinishLength, llm.Usage{PromptTokens: 16, CompletionTokens: s.b.n}
	}
	return ev, nil
}

func (s *tokensStream) Ready() bool  { return s.b.ready && s.i < s.b.n }
func (s *tokensStream) Close() error { return nil }

// streamHandler is the API handler over tokensBackend, with the Llama 3 vocabulary.
func streamHandler(b *testing.B, be *tokensBackend, interval int) http.Handler {
	b.Helper()
	tok := llama3Tokenizer(b)
	be.ids = tok.Encode(" Once upon a time, a small dog named Max lived in a quiet town by the sea, and every morning he ran to the beach.", false, false)
	models := []*openai.Model{{ID: "m", Tokenizer: tok, ContextLen: 1 << 17, Backend: be}}
	return openai.NewHandler(models, openai.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StreamInterval: interval})
}

// streamCases are the streamed answers BenchmarkStream* write: completions and chat, one
// token at a time (each token's event written and flushed alone, as when tokens come one
// to a message) or ready in a row (as when several came in one), and every 16 tokens
// (--stream-interval 16).
var streamCases = []struct {
	name, path, body string
	ready            bool
	interval         int
}{
	{"completions", "/v1/completions", `{"model":"m","prompt":"Hi","max_tokens":256,"stream":true}`, false, 1},
	{"completions-ready", "/v1/completions", `{"model":"m","prompt":"Hi","max_tokens":256,"stream":true}`, true, 1},
	{"completions-interval16", "/v1/completions", `{"model":"m","prompt":"Hi","max_tokens":256,"stream":true}`, false, 16},
	{"chat", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":256,"stream":true,"stream_options":{"include_usage":true}}`, false, 1},
	{"messages", "/v1/messages", `{"model":"m","max_tokens":256,"messages":[{"role":"user","content":"Hi"}],"stream":true}`, false, 1},
	{"responses", "/v1/responses", `{"model":"m","input":"Hi","stream":true}`, false, 1},
}

// BenchmarkStreamSSE: the API layer's cost per streamed token, without the network: a
// 256-token answer written to a recorder. One op is one token; allocs/op are per token
// (the request's own, about 100, spread over its 256 tokens, included).
func BenchmarkStreamSSE(b *testing.B) {
	const tokens = 256
	for _, c := range streamCases {
		b.Run(c.name, func(b *testing.B) {
			be := &tokensBackend{n: tokens, ready: c.ready}
			h := streamHandler(b, be, c.interval)
			path := c.path
			body := []byte(c.body)
			perToken(b, tokens, func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			})
		})
	}
}

// BenchmarkStreamHTTP: BenchmarkStreamSSE's answers over a real HTTP/1.1 connection on
// loopback, where every flush is a write system call (the client reads in the same
// process, and its CPU counts too): one write per token, or per tokens ready together, or
// per interval.
func BenchmarkStreamHTTP(b *testing.B) {
	const tokens = 256
	for _, c := range streamCases[:3] {
		b.Run(c.name, func(b *testing.B) {
			be := &tokensBackend{n: tokens, ready: c.ready}
			srv := httptest.NewServer(streamHandler(b, be, c.interval))
			defer srv.Close()
			client := srv.Client()
			url, body := srv.URL+c.path, []byte(c.body)
			perToken(b, tokens, func() { postOK(b, client, url, body) })
		})
	}
}

// perToken times answer, a request answered with tokens tokens, until b.N tokens are
// answered (one op is one token), and reports the process's CPU per token.
func perToken(b *testing.B, tokens int, answer func()) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := costs.ProcessCPU()
	reqs := 0
	for n := 0; n < b.N; n += tokens {
		answer()
		reqs++
	}
	b.ReportMetric(float64(costs.ProcessCPU()-cpu0)/float64(reqs*tokens), "cpu-ns/token")
}

// postOK posts body to url with client and reads the answer to its end, failing b unless
// it is 200 OK.
func postOK(b *testing.B, client *http.Client, url string, body []byte) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	drainStatus(b, resp, http.StatusOK)
}
