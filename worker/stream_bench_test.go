package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
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

// benchCPU is the process's user and system CPU time.
func benchCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// udpSent reads the host's UDP OutDatagrams (Linux; 0 elsewhere).
func udpSent() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "Udp:") && strings.HasPrefix(lines[i+1], "Udp:") {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for k, n := range names {
				if n == "OutDatagrams" && k < len(vals) {
					v, _ := strconv.ParseInt(vals[k], 10, 64)
					return v
				}
			}
		}
	}
	return 0
}

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
			cpu0, dg0 := benchCPU(), udpSent()
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
			b.ReportMetric(float64(benchCPU()-cpu0)/1e3/n, "cpu-µs/token")
			b.ReportMetric(float64(udpSent()-dg0)/n, "datagrams/token")
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
	path := fixtures.Model(b, "stories260K-f32.gguf")
	be := cpu.New(1)
	m, err := model.Load(path, be)
	if err != nil {
		b.Fatal(err)
	}
	salt := kvcache.Salt(modelName, "", "")
	e, err := engine.New(m, be, engine.Config{KVBlocks: 256, BlockSize: 16, Salt: salt, ServedName: modelName})
	if err != nil {
		b.Fatal(err)
	}
	eng.Engine = e
	format, files, err := cluster.EncodeTokenizer(path)
	if err != nil {
		b.Fatal(err)
	}
	w, err := worker.New(worker.Config{Engine: eng, Node: "w1", Routers: []string{srv.ORPCAddr}, Token: srv.Token.String(),
		StateDir: b.TempDir(), Listen: "127.0.0.1:0", Logger: quiet,
		Card: cluster.ModelCard{Model: modelName, HashVersion: kvcache.HashVersion, BlockSize: 16, Salt: salt,
			KVBlocks: 256, ContextLen: m.Config.ContextLen, TokenizerFormat: format, TokenizerFiles: files}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	engDone, wDone := make(chan struct{}), make(chan struct{})
	go func() { e.Run(ctx); close(engDone) }()
	go func() { w.Run(ctx); close(wDone) }()
	b.Cleanup(func() {
		cancel()
		<-wDone
		<-engDone
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
		m.Close()
		be.Close()
	})
	for deadline := time.Now().Add(20 * time.Second); len(srv.Router.Workers()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the worker did not register")
		}
	}
	return srv
}
