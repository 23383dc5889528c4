package live

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"tandem/gguf"
	"tandem/internal/costs"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/openai"
	"tandem/router"
	"tandem/tokenizer"
)

// decideBackend is the router's work between the API layer and the wire, without the
// wire: the prompt's block hashes, a decision over a pool of workers under one lock, and
// the in-flight record dropped again when the one-token answer ends. It measures what
// the router's front end costs per request on its own.
type decideBackend struct {
	mu    sync.Mutex
	state *router.State
	salt  uint64
	block int
}

func (b *decideBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	hashes := kvcache.HashBlocks(b.salt, req.Prompt, b.block, nil)
	b.mu.Lock()
	d, err := b.state.Decide(router.Request{Hashes: hashes, PromptTokens: len(req.Prompt), SessionID: req.Session, Now: time.Now()})
	if err == nil {
		b.state.RemoveInflight(d.Inflight)
	}
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &oneToken{n: len(req.Prompt)}, nil
}

// oneToken answers one token and stops.
type oneToken struct {
	n    int
	sent bool
}

func (s *oneToken) Next(ctx context.Context) (llm.Event, error) {
	if s.sent {
		return llm.Event{}, io.EOF
	}
	s.sent = true
	return llm.Event{Token: 42, Finish: llm.FinishLength, Usage: llm.Usage{PromptTokens: s.n, CompletionTokens: 1}}, nil
}

func (s *oneToken) Close() error { return nil }

// llama3Tokenizer is the tokenizer of Llama 3's 128k vocabulary.
func llama3Tokenizer(b *testing.B) *tokenizer.Tokenizer {
	b.Helper()
	f, err := gguf.Open(fixtures.Model(b, "rand-llama-llama3vocab-f32.gguf"))
	if err != nil {
		b.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	return tok
}

// frontEndHandler is the router's API handler over decideBackend: a Llama-3 vocabulary
// (128k tokens), 16-token blocks and 64 idle workers.
func frontEndHandler(b *testing.B) (http.Handler, *tokenizer.Tokenizer) {
	b.Helper()
	tok := llama3Tokenizer(b)
	st, err := router.NewState(router.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	salt := kvcache.Salt("m", "", "")
	card := router.Card{Model: "m", HashVersion: kvcache.HashVersion, BlockSize: 16, Salt: salt, KVBlocks: 1 << 16}
	for w := range router.WorkerID(64) {
		if err := st.AddWorker(w, card); err != nil {
			b.Fatal(err)
		}
	}
	be := &decideBackend{state: st, salt: salt, block: 16}
	models := []*openai.Model{{ID: "m", Tokenizer: tok, ContextLen: 1 << 17, Backend: be}}
	return openai.NewHandler(models, openai.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}), tok
}

// idsBody is a completions body whose prompt is n token ids, as `tandem bench --workload
// mooncake` sends them.
func idsBody(n, vocab int) []byte {
	var buf bytes.Buffer
	buf.WriteString(`{"model":"m","max_tokens":1,"user":"session-7","prompt":[`)
	x := uint32(12345)
	for i := range n {
		if i > 0 {
			buf.WriteByte(',')
		}
		x = x*1664525 + 1013904223
		buf.WriteString(strconv.Itoa(int(x>>8) % vocab))
	}
	buf.WriteString(`]}`)
	return buf.Bytes()
}

// BenchmarkFrontEnd: the router's CPU per routed request, from the HTTP request to the
// response written (parse, validate, hash, decide, answer), for a Mooncake-sized prompt of
// token ids and for small ones. cpu-µs/req is the process's CPU time (every goroutine,
// the collector's included) over requests, the measure; ns/op is wall time.
func BenchmarkFrontEnd(b *testing.B) {
	h, tok := frontEndHandler(b)
	vocab := tok.VocabSize()
	cases := []struct {
		name string
		path string
		body []byte
	}{
		{"ids-16k", "/v1/completions", idsBody(16_000, vocab)},
		{"ids-60k", "/v1/completions", idsBody(60_000, vocab)},
		{"ids-64", "/v1/completions", idsBody(64, vocab)},
		{"text-small", "/v1/completions", []byte(`{"model":"m","max_tokens":1,"prompt":"Tell me a story about a cat who learns to fly, in three sentences."}`)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			rd := bytes.NewReader(c.body)
			req := httptest.NewRequest(http.MethodPost, c.path, rd)
			req.Header.Set("Content-Type", "application/json")
			var w *httptest.ResponseRecorder
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			cpu0 := costs.ProcessCPU()
			for b.Loop() {
				rd.Reset(c.body)
				req.Body = io.NopCloser(rd)
				req.ContentLength = int64(len(c.body))
				w = httptest.NewRecorder()
				h.ServeHTTP(w, req)
			}
			cpu := costs.ProcessCPU() - cpu0
			if w.Code != http.StatusOK {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
		})
	}
}

// BenchmarkFrontEndHTTP: BenchmarkFrontEnd's requests over a real HTTP/1.1 connection on
// loopback (one client, keep-alive). cpu-µs/req counts the client's CPU too: the
// process holds both ends.
func BenchmarkFrontEndHTTP(b *testing.B) {
	h, tok := frontEndHandler(b)
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	vocab := tok.VocabSize()
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"ids-16k", idsBody(16_000, vocab)},
		{"ids-64", idsBody(64, vocab)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			cpu0 := costs.ProcessCPU()
			for b.Loop() {
				postOK(b, client, srv.URL+"/v1/completions", c.body)
			}
			cpu := costs.ProcessCPU() - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
		})
	}
}
