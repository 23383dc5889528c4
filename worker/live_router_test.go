package worker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tandem/engine"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/openai"
	"tandem/router"
	"tandem/router/live"
)

// startRouterWith is startRouter with a chosen policy and queue timeout.
func startRouterWith(t *testing.T, pol router.Config, queueTimeout time.Duration) *testCluster {
	t.Helper()
	return startRouterLive(t, live.Config{Policy: pol, Heartbeat: 50 * time.Millisecond, HeartbeatTimeout: 2 * time.Second,
		QueueTimeout: queueTimeout})
}

// startRouterLive starts a router with cfg's settings.
func startRouterLive(t *testing.T, cfg live.Config) *testCluster {
	t.Helper()
	return startRouterIn(t, t.TempDir(), cfg)
}

// startRouterIn starts a router with cfg's settings whose state (cluster CA and join token)
// is in dir: routers started in one dir form one cluster.
func startRouterIn(t *testing.T, dir string, cfg live.Config) *testCluster {
	t.Helper()
	logs := &syncBuffer{}
	srv, err := live.StartServer(live.ServerConfig{
		Host: "127.0.0.1", StateDir: dir, Router: cfg, ResponsesPath: filepath.Join(t.TempDir(), "responses.db"),
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if t.Failed() {
			t.Logf("router log:\n%s", logs.String())
		}
	})
	return &testCluster{t: t, router: srv, logs: logs, path: fixtures.Model(t, "stories260K-f32.gguf")}
}

// post sends a raw completion request and returns the response, its body and how long it took.
func post(t *testing.T, base, body string, header ...string) (*http.Response, string, time.Duration) {
	t.Helper()
	resp, b, took, err := postErr(base, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b, took
}

func postErr(base, body string, header ...string) (*http.Response, string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return nil, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), time.Since(t0), err
}

// gateEngine holds every stream before its first token until gate is closed. It hides the
// engine's Stats, so the worker reports the requests it serves over ORPC: a held request
// counts as waiting for as long as it is held, however fast the engine itself is.
type gateEngine struct {
	eng  *engine.Engine
	gate chan struct{}
}

func (g gateEngine) Pool() *kvcache.Pool { return g.eng.Pool() }

func (g gateEngine) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	st, err := g.eng.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	return gateStream{st, g.gate}, nil
}

type gateStream struct {
	llm.Stream
	gate chan struct{}
}

func (s gateStream) Next(ctx context.Context) (llm.Event, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return llm.Event{}, ctx.Err()
	}
	return s.Stream.Next(ctx)
}

// Backpressure: while the only worker is busy, a request waits in the router's queue up to
// the queue timeout and then gets 429 with Retry-After; one whose worker frees up within
// the timeout is served.
func TestLiveBackpressure(t *testing.T) {
	pol := router.DefaultConfig()
	pol.BusyKVUsage = 0
	pol.BusyWaiting = 1 // one request without its first token makes the worker busy
	const queueTimeout = time.Second
	c := startRouterWith(t, pol, queueTimeout)
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open)
	addGatedWorker(t, c, "w1", gate)
	c.waitWorkers(1)
	base := c.router.URL()
	body := `{"model":"stories","prompt":"The little dog","max_tokens":4,"temperature":0}`

	// A request held before its first token occupies w1.
	type result struct {
		resp *http.Response
		body string
		took time.Duration
		err  error
	}
	run := func() chan result {
		ch := make(chan result, 1)
		go func() {
			var r result
			r.resp, r.body, r.took, r.err = postErr(base, body)
			ch <- r
		}()
		return ch
	}
	held := run()
	waitFor(t, "w1 to report the held request", func() bool {
		w, ok := c.worker("w1")
		return ok && w.Load > 0
	})

	// Every worker busy: a bounded wait, then 429 with Retry-After.
	resp, text, took := post(t, base, body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("while busy: %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), text)
	}
	if took < queueTimeout-50*time.Millisecond || took > queueTimeout+2*time.Second {
		t.Errorf("while busy: answered after %v, the queue timeout is %v", took, queueTimeout)
	}

	// A request that finds w1 busy waits; when w1 frees up within the timeout it is served.
	queued := run()
	time.Sleep(queueTimeout / 4)
	open()
	for i, ch := range []chan result{held, queued} {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if i == 1 && r.took < queueTimeout/4-50*time.Millisecond {
				t.Errorf("the queued request was answered after %v, before w1 freed up", r.took)
			}
			if r.resp.StatusCode != http.StatusOK || r.resp.Header.Get(openai.WorkerHeader) != "w1" {
				t.Errorf("%d (worker %q) after %v: %s", r.resp.StatusCode, r.resp.Header.Get(openai.WorkerHeader), r.took, r.body)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request did not finish")
		}
	}
}

// addGatedWorker starts an engine behind a gateEngine as worker name of c.
func addGatedWorker(t *testing.T, c *testCluster, name string, gate chan struct{}) {
	t.Helper()
	startGatedWorker(t, c.path, name, []string{c.router.ORPCAddr}, c.router.Token.String(), gate)
}

// Session affinity: requests of one session (X-Session-Id, or the user field) stay on one
// worker although the mode would spread them; when that worker leaves, the session is
// rebound to another and stays there.
func TestLiveSessionAffinity(t *testing.T) {
	pol := router.DefaultConfig()
	pol.Mode = router.ModeRoundRobin
	c := startRouterWith(t, pol, 0)
	nodes := c.addWorkers("w1", "w2")
	base := c.router.URL()
	served := func(body string, header ...string) string {
		t.Helper()
		resp, text, _ := post(t, base, body, header...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d: %s", resp.StatusCode, text)
		}
		return resp.Header.Get(openai.WorkerHeader)
	}
	body := func(i int, user string) string {
		u := ""
		if user != "" {
			u = fmt.Sprintf(`,"user":%q`, user)
		}
		return fmt.Sprintf(`{"model":"stories","prompt":"Turn %d of a story","max_tokens":2,"temperature":0%s}`, i, u)
	}

	// Without a session, round-robin alternates.
	seen := map[string]bool{}
	for i := range 4 {
		seen[served(body(i, ""))] = true
	}
	if !seen["w1"] || !seen["w2"] {
		t.Fatalf("round-robin used %v, want both workers", seen)
	}

	// With one, every request goes where the first went, by header or by user field.
	bound := served(body(0, ""), live.SessionHeader, "conv-1")
	byUser := served(body(0, "alice"))
	for i := 1; i < 6; i++ {
		if wk := served(body(i, ""), live.SessionHeader, "conv-1"); wk != bound {
			t.Fatalf("turn %d of conv-1 went to %q, the session is on %q", i, wk, bound)
		}
		if wk := served(body(i, "alice")); wk != byUser {
			t.Fatalf("turn %d of user alice went to %q, the session is on %q", i, wk, byUser)
		}
	}

	// The bound worker leaves: the session moves to the other worker and stays there.
	other := map[string]string{"w1": "w2", "w2": "w1"}[bound]
	nodes[bound].stop()
	c.waitWorkers(1)
	for i := range 4 {
		if wk := served(body(10+i, ""), live.SessionHeader, "conv-1"); wk != other {
			t.Fatalf("after %s left, turn %d of conv-1 went to %q, want %q", bound, i, wk, other)
		}
	}
	// A new worker joining does not pull the rebound session away.
	c.addWorker("w3", c.router.Token.String(), 0)
	c.waitWorkers(2)
	for i := range 4 {
		if wk := served(body(20+i, ""), live.SessionHeader, "conv-1"); wk != other {
			t.Fatalf("after w3 joined, turn %d of conv-1 went to %q, want %q", i, wk, other)
		}
	}
}
