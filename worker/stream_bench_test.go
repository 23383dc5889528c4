package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/costs"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/router"
	"tandem/router/live"
	"tandem/worker"
)

// pacedEngine answers every request with n tokens, one per step of a clock shared by all
// its streams, as a decode batch gives them: at each step every running stream gets its
// token at once. The model is not run: what is measured is the way of a token from the
// engine's stream to the client.
type pacedEngine struct {
	*engine.Engine
	n    int
	step time.Duration

	mu      sync.Mutex
	waiters []chan struct{}
	once    sync.Once
}

func (e *pacedEngine) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	e.once.Do(func() { go e.tick() })
	return &pacedStream{e: e, wake: make(chan struct{}, 1), prompt: len(req.Prompt)}, nil
}

// tick wakes every waiting stream once per step.
func (e *pacedEngine) tick() {
	t := time.NewTicker(e.step)
	defer t.Stop()
	for range t.C {
		e.mu.Lock()
		for _, w := range e.waiters {
			select {
			case w <- struct{}{}:
			default:
			}
		}
		e.waiters = e.waiters[:0]
		e.mu.Unlock()
	}
}

type pacedStream struct {
	e      *pacedEngine
	wake   chan struct{}
	i      int
	prompt int
}

func (s *pacedStream) Next(ctx context.Context) (llm.Event, error) {
	if s.i >= s.e.n {
		return llm.Event{}, io.EOF
	}
	s.e.mu.Lock()
	s.e.waiters = append(s.e.waiters, s.wake)
	s.e.mu.Unlock()
	select {
	case <-s.wake:
	case <-ctx.Done():
		return llm.Event{}, ctx.Err()
	}
	s.i++
	ev := llm.Event{Token: int32(100 + s.i%50), Logprob: -0.5}
	if s.i == s.e.n {
		ev.Finish, ev.Usage = llm.FinishLength, llm.Usage{PromptTokens: s.prompt, CompletionTokens: s.e.n}
	}
	return ev, nil
}

func (s *pacedStream) Close() error { return nil }

// BenchmarkStreamRouted: a token's whole way through a live router, in one process: a
// worker's engine stream (pacedEngine: a token every 2 ms for each of its streams at once),
// Worker.Generate over ORPC/QUIC, the router's stream and API layer, SSE over loopback
// HTTP to a client that reads it. One op is one token delivered; cpu-µs/token is the
// process's CPU (router, worker and client together) per token, datagrams/token the UDP
// datagrams sent on the host per token (both directions: tokens and ACKs). streams is how
// many requests run at once on the one worker; interval the router's --stream-interval.
func BenchmarkStreamRouted(b *testing.B) {
	for _, c := range []struct{ streams, interval int }{{1, 1}, {8, 1}, {8, 16}} {
		b.Run(fmt.Sprintf("streams=%d/interval=%d", c.streams, c.interval), func(b *testing.B) {
			const tokens = 100
			eng := &pacedEngine{n: tokens, step: 2 * time.Millisecond}
			srv := benchCluster(b, live.Config{Policy: router.DefaultConfig(), Heartbeat: 250 * time.Millisecond,
				StreamInterval: c.interval}, eng)
			body := []byte(`{"model":"stories","prompt":"Once upon a time","max_tokens":100,"stream":true}`)
			url := srv.URL() + "/v1/completions"
			run := func() {
				resp, err := http.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
				}
			}
			run() // the connections made
			rounds := max(1, b.N/(tokens*c.streams))
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, dg0 := costs.ProcessCPU(), costs.UDPDatagramsSent()
			for range rounds {
				var wg sync.WaitGroup
				for range c.streams {
					wg.Add(1)
					go func() { defer wg.Done(); run() }()
				}
				wg.Wait()
			}
			b.StopTimer()
			n := float64(rounds * tokens * c.streams)
			b.ReportMetric(float64(costs.ProcessCPU()-cpu0)/1e3/n, "cpu-µs/token")
			b.ReportMetric(float64(costs.UDPDatagramsSent()-dg0)/n, "datagrams/token")
		})
	}
}

// benchCluster starts a router with cfg and one worker serving eng (over the stories model,
// whose tokenizer the router uses), and waits for the worker to register.
func benchCluster(b *testing.B, cfg live.Config, eng *pacedEngine) *live.Server {
	b.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := live.StartServer(live.ServerConfig{Host: "127.0.0.1", StateDir: b.TempDir(), Router: cfg, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	format, files, err := cluster.EncodeTokenizer(fixtures.Model(b, "stories260K-f32.gguf"))
	if err != nil {
		b.Fatal(err)
	}
	salt := kvcache.Salt(modelName, "", "")
	runWorker(b, worker.Config{Node: "w1", Routers: []string{srv.ORPCAddr}, Token: srv.Token.String(),
		Card: cluster.ModelCard{Model: modelName, HashVersion: kvcache.HashVersion, BlockSize: 16, Salt: salt,
			KVBlocks: 256, ContextLen: 128, TokenizerFormat: format, TokenizerFiles: files}},
		func(e *engine.Engine) worker.Engine { eng.Engine = e; return eng })
	for deadline := time.Now().Add(20 * time.Second); len(srv.Router.Workers()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the worker did not register")
		}
	}
	return srv
}

// runWorker runs a worker with cfg (its state directory, listen address and logger
// filled in) over an engine on the stories model, wrapped by wrap when it is set, until
// the test ends; it returns the model.
func runWorker(tb testing.TB, cfg worker.Config, wrap func(*engine.Engine) worker.Engine) *model.Model {
	tb.Helper()
	be := cpu.New(1)
	m, err := model.Load(fixtures.Model(tb, "stories260K-f32.gguf"), be)
	if err != nil {
		tb.Fatal(err)
	}
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 256, BlockSize: 16, Salt: kvcache.Salt(modelName, "", ""), ServedName: modelName})
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Engine = eng
	if wrap != nil {
		cfg.Engine = wrap(eng)
	}
	cfg.StateDir, cfg.Listen = tb.TempDir(), "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := worker.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	engDone, wDone := make(chan struct{}), make(chan struct{})
	go func() { eng.Run(ctx); close(engDone) }()
	go func() { w.Run(ctx); close(wDone) }()
	tb.Cleanup(func() {
		cancel()
		<-wDone
		<-engDone
		m.Close()
		be.Close()
	})
	return m
}
