package worker_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/openai"
	"tandem/orpc"
	"tandem/router"
	"tandem/router/live"
	"tandem/worker"
)

// longIdle takes QUIC's idle timeout out of these tests: the connections to a vanished
// worker would end by themselves only after two minutes, past the tests' bounds, so what
// ends a request's wait on it is the router's heartbeat timeout alone.
var longIdle = []orpc.Option{orpc.WithIdleTimeout(2 * time.Minute)}

// stallEngine, while stalling is set, streams the first request it gets for `after`
// tokens and then holds it, and holds every later one before its first token: a worker
// that hangs with one request in flight and others queued. Streams started while stalling
// is unset pass through.
type stallEngine struct {
	*engine.Engine
	after    int
	stalling *atomic.Bool
	seen     *atomic.Int64
}

func (e stallEngine) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	st, err := e.Engine.Generate(ctx, req)
	if err != nil || !e.stalling.Load() {
		return st, err
	}
	left := 0
	if e.seen.Add(1) == 1 {
		left = e.after
	}
	return &stallStream{Stream: st, left: left}, nil
}

type stallStream struct {
	llm.Stream
	left int
}

func (s *stallStream) Next(ctx context.Context) (llm.Event, error) {
	if s.left == 0 {
		<-ctx.Done()
		return llm.Event{}, ctx.Err()
	}
	s.left--
	return s.Stream.Next(ctx)
}

type streamResult struct {
	text   string
	usage  sdk.CompletionUsage
	worker string
	err    error
}

// streamGreedy streams a greedy completion in the background; after reports each chunk's
// arrival (the count so far) until it returns false.
func streamGreedy(ctx context.Context, base, prompt string, maxTokens int, chunk func(n int)) <-chan streamResult {
	out := make(chan streamResult, 1)
	go func() {
		var resp *http.Response
		stream := client(base).Completions.NewStreaming(ctx, sdk.CompletionNewParams{
			Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
			Temperature: sdk.Float(0), MaxTokens: sdk.Int(int64(maxTokens)),
			StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
		}, option.WithResponseInto(&resp))
		var r streamResult
		var text strings.Builder
		n := 0
		for stream.Next() {
			cur := stream.Current()
			for _, ch := range cur.Choices {
				text.WriteString(ch.Text)
			}
			if cur.Usage.TotalTokens > 0 {
				r.usage = cur.Usage
			}
			if n++; chunk != nil {
				chunk(n)
			}
		}
		r.text, r.err = text.String(), stream.Err()
		if resp != nil {
			r.worker = resp.Header.Get(openai.WorkerHeader)
		}
		out <- r
	}()
	return out
}

// completeGreedy is complete without t, for goroutines.
func completeGreedy(ctx context.Context, base, prompt string, maxTokens int) streamResult {
	var resp *http.Response
	out, err := client(base).Completions.New(ctx, sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(int64(maxTokens)),
	}, option.WithResponseInto(&resp))
	if err != nil {
		return streamResult{err: err}
	}
	return streamResult{text: out.Choices[0].Text, usage: out.Usage, worker: resp.Header.Get(openai.WorkerHeader)}
}

func await[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// A worker that vanishes without a word (power loss, kill -9: no QUIC CONNECTION_CLOSE
// reaches anyone) while it streams one request and holds another before its first token.
// The router declares it dead when its load reports stop for the heartbeat timeout (QUIC's
// idle timeout is out of reach here): the stream migrates to the other worker and the
// queued request is sent there again, and both get the text of an uninterrupted run. When
// the worker's network comes back, it registers again and serves requests again.
func TestClusterSilentWorker(t *testing.T) {
	pol := router.DefaultConfig()
	pol.Mode = router.ModeRoundRobin
	c := startRouterLive(t, live.Config{Policy: pol, Heartbeat: 50 * time.Millisecond, Options: longIdle})
	tok := c.router.Token.String()
	var stalling atomic.Bool
	var seen atomic.Int64
	stalling.Store(true)
	n1 := c.addWorkerOpts("w1", tok, workerOpts{relays: true, options: longIdle, wrap: func(e *engine.Engine) worker.Engine {
		return stallEngine{Engine: e, after: 5, stalling: &stalling, seen: &seen}
	}})
	c.waitWorkers(1)

	const promptA, promptB, promptC = "Once upon a time", "The little dog ran to the park", "The cat sat on the mat"
	want := map[string]*sdk.Completion{}
	for _, p := range []string{promptA, promptB, promptC} {
		want[p], _ = complete(t, direct(t, n1), p, 48)
	}
	ctx := testCtx(t)
	base := c.router.URL()
	fiveChunks := make(chan struct{})
	resA := streamGreedy(ctx, base, promptA, 48, func(n int) {
		if n == 5 {
			close(fiveChunks)
		}
	})
	await(t, "the first request's first chunks", fiveChunks)
	resB := make(chan streamResult, 1)
	go func() { resB <- completeGreedy(ctx, base, promptB, 48) }()
	waitFor(t, "the second request to reach w1", func() bool { return seen.Load() == 2 })
	c.addWorkerOpts("w2", tok, workerOpts{options: longIdle})
	c.waitWorkers(2)

	t0 := time.Now()
	n1.vanish()
	// A request that arrives before the router noticed: it may be sent to w1 too.
	resC := make(chan streamResult, 1)
	go func() { resC <- completeGreedy(ctx, base, promptC, 48) }()
	a := await(t, "the streamed request", resA)
	tA := time.Since(t0)
	b := await(t, "the queued request", resB)
	tB := time.Since(t0)
	t.Logf("after w1 vanished: the stream completed in %v, the queued request in %v", tA.Round(time.Millisecond), tB.Round(time.Millisecond))
	if a.err != nil || a.text != want[promptA].Choices[0].Text || a.usage.CompletionTokens != want[promptA].Usage.CompletionTokens {
		t.Errorf("stream after w1 vanished: %q (%+v, %v), want %q", a.text, a.usage, a.err, want[promptA].Choices[0].Text)
	}
	if b.err != nil || b.text != want[promptB].Choices[0].Text {
		t.Errorf("queued request after w1 vanished: %q (%v), want %q", b.text, b.err, want[promptB].Choices[0].Text)
	}
	if r := await(t, "the request sent after w1 vanished", resC); r.err != nil || r.text != want[promptC].Choices[0].Text {
		t.Errorf("request sent after w1 vanished, via %s: %q (%v), want %q", r.worker, r.text, r.err, want[promptC].Choices[0].Text)
	}
	if _, ok := c.worker("w1"); ok {
		t.Errorf("w1 is still registered: %+v", c.router.Router.Workers())
	}
	for _, m := range []struct {
		name string
		want float64
	}{
		{"tandem_router:worker_heartbeat_timeouts_total", 1},
		{"tandem_router:worker_losses_total", 1},
		{"tandem_router:migrations_total", 1},      // the stream
		{"tandem_router:request_retries_total", 1}, // the queued request
	} {
		if got := scrape(t, base, m.name); got != m.want {
			t.Errorf("%s = %v, want %v", m.name, got, m.want)
		}
	}
	if strings.Contains(c.logs.String(), "idle timeout") {
		t.Error("a QUIC idle timeout ended a call: the test did not isolate the heartbeat timeout")
	}

	// The network comes back: w1 registers again, healthy, and round-robin sends it work.
	stalling.Store(false)
	n1.reappear()
	waitFor(t, "w1 to register again", func() bool { w, ok := c.worker("w1"); return ok && w.Healthy })
	served := map[string]bool{}
	for i := 0; i < 4 && !served["w1"]; i++ {
		got, wk := complete(t, client(base), promptB, 48)
		if got.Choices[0].Text != want[promptB].Choices[0].Text {
			t.Errorf("request %d after w1 came back, on %s: %q, want %q", i, wk, got.Choices[0].Text, want[promptB].Choices[0].Text)
		}
		served[wk] = true
	}
	if !served["w1"] {
		t.Errorf("w1 came back but served none of 4 round-robin requests (served: %v)", served)
	}
}

// hookEngine is an engine whose prefills and KV exports first run hooks, when set.
type hookEngine struct {
	*engine.Engine
	prefill atomic.Pointer[func()]
	export  atomic.Pointer[func(context.Context) error]
}

func (e *hookEngine) StartPrefill(ctx context.Context, req *llm.Request, ttl time.Duration) (uint64, func() (*engine.PrefillResult, error), error) {
	if f := e.prefill.Load(); f != nil {
		(*f)()
	}
	return e.Engine.StartPrefill(ctx, req, ttl)
}

func (e *hookEngine) ExportBlocks(ctx context.Context, h uint64, want []uint64, fn func(int, uint64, []byte) error) error {
	if f := e.export.Load(); f != nil {
		if err := (*f)(ctx); err != nil {
			return err
		}
	}
	return e.Engine.ExportBlocks(ctx, h, want, fn)
}

// failoverCluster is a router with a prefill worker p1 behind relays (so that it can
// vanish), a decode worker d1, and an aggregated engine of its own for reference answers;
// QUIC's idle timeout and the KV pull's timeout are out of the tests' reach.
type failoverCluster struct {
	srv     *live.Server
	p, d    *peerNode
	hooks   *hookEngine
	in, out *udpRelay
	ref     *sdk.Client
}

func startFailoverCluster(t *testing.T) *failoverCluster {
	t.Helper()
	path := fixtures.Model(t, "stories260K-f32.gguf")
	dis := router.DefaultDisaggConfig()
	dis.MinRemoteTokens, dis.TransferTimeout = 32, 2*time.Minute
	srv := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond,
		Disagg: dis, Options: longIdle}).router
	env := newPeerEnv(t)
	fc := &failoverCluster{srv: srv, in: newRelay(t, nil), out: newRelay(t, udpAddr(t, srv.ORPCAddr))}

	be := cpu.New(1)
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 128, BlockSize: 16, Salt: kvcache.Salt(modelName, "", "")})
	if err != nil {
		t.Fatal(err)
	}
	fc.hooks = &hookEngine{Engine: eng}
	fc.p = env.startEngine("p1", path, m, eng, worker.Config{Engine: fc.hooks, Routers: []string{fc.out.Addr()},
		Advertise: fc.in.Addr(), Token: srv.Token.String(), StateDir: t.TempDir(), Options: longIdle,
		Card: cluster.ModelCard{Role: cluster.RolePrefill}}, func() { m.Close(); be.Close() })
	fc.in.setTarget(fc.p.w.Addr())
	fc.d = env.start("d1", path, worker.Config{Routers: []string{srv.ORPCAddr}, Token: srv.Token.String(),
		StateDir: t.TempDir(), Options: longIdle, Card: cluster.ModelCard{Role: cluster.RoleDecode}})
	waitFor(t, "workers to register", func() bool { return len(srv.Router.Workers()) == 2 })
	agg := newPeerEnv(t).start("agg", path, worker.Config{})
	fc.ref = direct(t, &node{eng: agg.eng, m: agg.m})

	// One request as it should go, which also connects d1 to p1 for its pulls.
	long := "Warm-up. " + disaggPrompt
	want, _ := complete(t, fc.ref, long, 8)
	got, wk := complete(t, client(srv.URL()), long, 8)
	if wk != "p1,d1" || got.Choices[0].Text != want.Choices[0].Text {
		t.Fatalf("warm-up via %q: %q, want %q via p1,d1", wk, got.Choices[0].Text, want.Choices[0].Text)
	}
	return fc
}

var disaggPrompt = strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3)

func (fc *failoverCluster) vanishP() { fc.in.Cut(); fc.out.Cut() }

// checkPGone checks that the router declared p1 dead and removed it.
func (fc *failoverCluster) checkPGone(t *testing.T) {
	t.Helper()
	for _, w := range fc.srv.Router.Workers() {
		if w.Node == "p1" {
			t.Errorf("p1 is still registered: %+v", w)
		}
	}
	if n := scrape(t, fc.srv.URL(), "tandem_router:worker_heartbeat_timeouts_total"); n != 1 {
		t.Errorf("heartbeat timeouts %v, want 1", n)
	}
}

// The prefill worker vanishes as it starts a request's prefill: the router's call to it
// fails when the router declares it dead, and the decode worker, whose pull from it would
// hang, prefills the request itself; the request gets the text of an aggregated run. When
// p1 comes back, long prompts are prefilled on it again.
func TestDisaggregatedPrefillWorkerVanishes(t *testing.T) {
	fc := startFailoverCluster(t)
	base := fc.srv.URL()
	vanish := func() { fc.vanishP() }
	fc.hooks.prefill.Store(&vanish)

	prompt := "Story one. " + disaggPrompt
	want, _ := complete(t, fc.ref, prompt, 8)
	t0 := time.Now()
	res := completeGreedy(testCtx(t), base, prompt, 8)
	t.Logf("the request whose prefill worker vanished completed in %v", time.Since(t0).Round(time.Millisecond))
	if res.err != nil || res.text != want.Choices[0].Text || res.worker != "d1" {
		t.Errorf("after p1 vanished: %q via %q (%v), want %q via d1", res.text, res.worker, res.err, want.Choices[0].Text)
	}
	fc.checkPGone(t)
	if n := scrape(t, base, "tandem_router:remote_prefill_fallbacks_total", `stage="prefill"`); n != 1 {
		t.Errorf("prefill fallbacks %v, want 1", n)
	}
	fc.d.idle(t)

	fc.hooks.prefill.Store(nil)
	fc.in.Heal()
	fc.out.Heal()
	waitFor(t, "p1 to register again", func() bool {
		for _, w := range fc.srv.Router.Workers() {
			if w.Node == "p1" && w.Healthy {
				return true
			}
		}
		return false
	})
	prompt = "Story two. " + disaggPrompt
	want, _ = complete(t, fc.ref, prompt, 8)
	got, wk := complete(t, client(base), prompt, 8)
	if wk != "p1,d1" || got.Choices[0].Text != want.Choices[0].Text {
		t.Errorf("after p1 came back: %q via %q, want %q via p1,d1", got.Choices[0].Text, wk, want.Choices[0].Text)
	}
}

// The prefill worker answers the first token and then vanishes while the decode worker
// pulls the prompt's KV from it: the router, once it declares p1 dead, ends the decode
// worker's wait and migrates the request, which completes with the aggregated text.
func TestDisaggregatedPrefillWorkerVanishesMidPull(t *testing.T) {
	fc := startFailoverCluster(t)
	base := fc.srv.URL()
	stall := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	fc.hooks.export.Store(&stall) // p1 answers, but sends no block

	prompt := "Story three. " + disaggPrompt
	want, _ := complete(t, fc.ref, prompt, 8)
	remote := scrape(t, base, "tandem_router:prefills_total", `where="remote"`)
	ctx := testCtx(t)
	res := streamGreedy(ctx, base, prompt, 8, nil)
	waitFor(t, "p1's first token", func() bool {
		return scrape(t, base, "tandem_router:prefills_total", `where="remote"`) == remote+1
	})
	t0 := time.Now()
	fc.vanishP()
	r := await(t, "the request", res)
	t.Logf("the request whose prefill worker vanished during the pull completed %v after", time.Since(t0).Round(time.Millisecond))
	if r.err != nil || r.text != want.Choices[0].Text || r.usage.CompletionTokens != 8 {
		t.Errorf("after p1 vanished mid-pull: %q (%+v, %v), want %q", r.text, r.usage, r.err, want.Choices[0].Text)
	}
	fc.checkPGone(t)
	if n := scrape(t, base, "tandem_router:migrations_total"); n != 1 {
		t.Errorf("migrations %v, want 1", n)
	}
	fc.d.idle(t)
}

// With migrations off, a stream whose worker vanishes mid-stream ends with a clear 503
// error event instead of hanging.
func TestClusterSilentWorkerNoMigration(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond,
		MaxMigrations: -1, Options: longIdle})
	var stalling atomic.Bool
	var seen atomic.Int64
	stalling.Store(true)
	n1 := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{relays: true, options: longIdle, wrap: func(e *engine.Engine) worker.Engine {
		return stallEngine{Engine: e, after: 3, stalling: &stalling, seen: &seen}
	}})
	c.waitWorkers(1)
	three := make(chan struct{})
	res := streamGreedy(testCtx(t), c.router.URL(), "Once upon a time", 32, func(n int) {
		if n == 3 {
			close(three)
		}
	})
	await(t, "three chunks", three)
	n1.vanish()
	r := await(t, "the stream's end", res)
	t.Logf("text %q, error %v", r.text, r.err)
	if r.err == nil || !strings.Contains(r.err.Error(), "service_unavailable") || !strings.Contains(r.err.Error(), "declared dead") {
		t.Errorf("stream after w1 vanished with migrations off: %q, %v; want a service_unavailable error", r.text, r.err)
	}
}
