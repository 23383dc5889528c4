package worker_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/cluster"
	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/openai"
	"tandem/orpc"
	"tandem/router"
	"tandem/router/live"
	"tandem/sim"
	"tandem/worker"
)

const modelName = "stories"

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// node is one engine running as a worker.
type node struct {
	name   string
	eng    *engine.Engine
	m      *model.Model
	w      *worker.Worker
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker and its engine have stopped
	err    error         // Run's result, set before done is closed
	in     *udpRelay     // with workerOpts.relays: the way to the worker's ORPC server
	out    *udpRelay     // and its way to the router
}

// vanish cuts the worker off the network both ways, as a power loss or kill -9 would,
// while it keeps running: nothing it sends (no CONNECTION_CLOSE either) reaches anyone.
func (n *node) vanish() { n.in.Cut(); n.out.Cut() }

// reappear reconnects a vanished worker.
func (n *node) reappear() { n.in.Heal(); n.out.Heal() }

// stop ends the worker and its engine, as a killed process would leave the cluster.
func (n *node) stop() {
	n.cancel()
	<-n.done
}

type testCluster struct {
	slow   time.Duration // pause before each token a worker streams
	t      *testing.T
	router *live.Server
	logs   *syncBuffer
	path   string
}

func startRouter(t *testing.T, mode router.Mode, adjust ...func(*router.Config)) *testCluster {
	t.Helper()
	path := fixtures.Model(t, "stories260K-f32.gguf")
	logs := &syncBuffer{}
	pol := router.DefaultConfig()
	pol.Mode = mode
	for _, f := range adjust {
		f(&pol)
	}
	srv, err := live.StartServer(live.ServerConfig{
		Host: "127.0.0.1", StateDir: t.TempDir(),
		Router: live.Config{Policy: pol, Heartbeat: 50 * time.Millisecond, HeartbeatTimeout: 2 * time.Second},
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
	return &testCluster{t: t, router: srv, logs: logs, path: path}
}

// addWorker starts an engine on the stories fixture and a worker that joins the router with
// token. blockSize 0 means 16.
func (c *testCluster) addWorker(name, token string, blockSize int) *node {
	c.t.Helper()
	return c.addWorkerOpts(name, token, workerOpts{blockSize: blockSize})
}

// addWorkers starts a worker for each name, as addWorker does with the router's token and
// block size 16, each registered before the next starts.
func (c *testCluster) addWorkers(names ...string) map[string]*node {
	c.t.Helper()
	nodes := map[string]*node{}
	for _, name := range names {
		nodes[name] = c.addWorker(name, c.router.Token.String(), 0)
		c.waitWorkers(len(nodes))
	}
	return nodes
}

// workerOpts are addWorkerOpts's choices.
type workerOpts struct {
	blockSize int // 0: 16
	// wrap, if set, gives the engine the worker serves (the cluster's slow setting aside).
	wrap    func(*engine.Engine) worker.Engine
	options []orpc.Option // the worker's ORPC options
	// relays: the worker reaches the router, and the router and other workers reach it,
	// through two udpRelays only (node.in and node.out), which a test cuts to make the
	// worker vanish without a word.
	relays bool
	// stateDir is the worker's state directory ("": a new one); node "" leaves the name to
	// the worker (its stored identity's, else host name and port).
	stateDir string
	node     *string
	// timing, if set, makes the engine a sim engine: modelled forward passes of this
	// duration on the wall clock (sequences that run for a chosen time).
	timing  *sim.Timing
	metrics *metrics.Worker // the worker's membership metrics
	// adapters are LoRA adapters (name → path) the engine loads before it joins.
	adapters      map[string]string
	eventInterval time.Duration // worker.Config.EventInterval
}

// addWorkerOpts is addWorker with more choices.
func (c *testCluster) addWorkerOpts(name, token string, o workerOpts) *node {
	t := c.t
	t.Helper()
	blockSize := o.blockSize
	if blockSize == 0 {
		blockSize = 16
	}
	be := cpu.New(2)
	m, err := model.Load(c.path, be)
	if err != nil {
		t.Fatal(err)
	}
	salt := kvcache.Salt(modelName, "", "")
	var eng *engine.Engine
	ecfg := engine.Config{KVBlocks: 256, BlockSize: blockSize, Salt: salt, ServedName: modelName}
	if o.timing != nil {
		tok := m.Tokenizer
		step, err := simstep.New(simstep.Config{Timing: *o.timing, Vocab: m.Config.VocabSize,
			Skip: func(id int32) bool { return tok.IsEOG(id) || tok.IsControl(id) }})
		if err != nil {
			t.Fatal(err)
		}
		eng, err = engine.NewWithForwarder(m, step, ecfg)
	} else {
		eng, err = engine.New(m, be, ecfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	for name, path := range o.adapters {
		if err := eng.LoadAdapter(context.Background(), name, path); err != nil {
			t.Fatal(err)
		}
	}
	format, files, err := cluster.EncodeTokenizer(c.path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	var we worker.Engine = eng
	switch {
	case o.wrap != nil:
		we = o.wrap(eng)
	case c.slow > 0:
		we = slowEngine{eng, c.slow}
	}
	cfg := worker.Config{
		Engine: we,
		Card: cluster.ModelCard{Model: modelName, HashVersion: kvcache.HashVersion, BlockSize: blockSize, Salt: salt,
			KVBlocks: 256, ContextLen: m.Config.ContextLen, TokenizerFormat: format, TokenizerFiles: files},
		Node: name, Routers: []string{c.router.ORPCAddr}, Token: token, StateDir: o.stateDir, Listen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Options: o.options, Metrics: o.metrics,
		EventInterval: o.eventInterval,
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if o.node != nil {
		cfg.Node = *o.node
	}
	var in, out *udpRelay
	if o.relays {
		in, out = newRelay(t, nil), newRelay(t, udpAddr(t, c.router.ORPCAddr))
		cfg.Advertise, cfg.Routers = in.Addr(), []string{out.Addr()}
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{name: name, eng: eng, m: m, w: w, logs: logs, cancel: cancel, done: make(chan struct{}), in: in, out: out}
	engDone := make(chan struct{})
	go func() { eng.Run(ctx); close(engDone) }()
	go func() {
		err := w.Run(ctx)
		cancel()
		<-engDone
		m.Close()
		be.Close()
		n.err = err
		close(n.done)
	}()
	if in != nil {
		select {
		case <-w.Ready():
			in.setTarget(w.Addr())
		case <-n.done:
			t.Fatalf("worker %s stopped: %v", name, n.err)
		}
	}
	t.Cleanup(func() {
		n.cancel()
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			t.Errorf("worker %s did not stop", name)
		}
		if t.Failed() {
			t.Logf("worker %s log:\n%s", name, logs.String())
		}
	})
	return n
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *testCluster) waitWorkers(n int) {
	waitFor(c.t, "workers to register", func() bool { return len(c.router.Router.Workers()) == n })
}

func (c *testCluster) worker(name string) (live.WorkerInfo, bool) {
	for _, w := range c.router.Router.Workers() {
		if w.Node == name {
			return w, true
		}
	}
	return live.WorkerInfo{}, false
}

func client(base string) *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second))
	return &c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// complete runs a greedy completion and returns it with the serving worker's name.
func complete(t *testing.T, c *sdk.Client, prompt string, maxTokens int) (*sdk.Completion, string) {
	t.Helper()
	var resp *http.Response
	out, err := c.Completions.New(testCtx(t), sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(int64(maxTokens)),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	return out, resp.Header.Get(openai.WorkerHeader)
}

// direct serves the engine's own API, as a single-node tandem serve does.
func direct(t *testing.T, n *node) *sdk.Client {
	srv := httptest.NewServer(openai.NewHandler([]*openai.Model{{ID: modelName, Tokenizer: n.m.Tokenizer,
		ContextLen: n.m.Config.ContextLen, Backend: n.eng}}, openai.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	return client(srv.URL)
}

var longPrompt = strings.Repeat("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. ", 2)

// One router, two engines: greedy completions through the router equal the engine's own,
// every response names its worker, and /v1/models lists the registered model.
func TestClusterGreedyMatchesEngine(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	tok := c.router.Token.String()
	n1 := c.addWorker("w1", tok, 0)
	c.waitWorkers(1)
	c.addWorker("w2", tok, 0)
	c.waitWorkers(2)

	rc := client(c.router.URL())
	models, err := rc.Models.List(testCtx(t))
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != modelName {
		t.Fatalf("models: %+v, %v", models, err)
	}
	dc := direct(t, n1)
	for _, p := range []string{"Once upon a time", "The little dog", longPrompt} {
		want, _ := complete(t, dc, p, 32)
		got, wk := complete(t, rc, p, 32)
		if wk != "w1" && wk != "w2" {
			t.Errorf("%q: X-Tandem-Worker %q", p, wk)
		}
		if got.Choices[0].Text != want.Choices[0].Text || got.Usage.CompletionTokens != want.Usage.CompletionTokens ||
			got.Usage.PromptTokens != want.Usage.PromptTokens {
			t.Errorf("%q: router gave %q (%+v), engine %q (%+v)", p, got.Choices[0].Text, got.Usage, want.Choices[0].Text, want.Usage)
		}
	}

	// Chat and streaming go through the same path.
	stream := rc.Completions.NewStreaming(testCtx(t), sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("The little dog")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(32),
	})
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want, _ := complete(t, dc, "The little dog", 32)
	if text.String() != want.Choices[0].Text {
		t.Errorf("streamed %q, want %q", text.String(), want.Choices[0].Text)
	}
}

// A prompt whose prefix one worker already holds goes to that worker, even when the policy
// would otherwise pick the other, and its response reports cached tokens.
func TestClusterKVAwareRouting(t *testing.T) {
	// At temperature 0 the router picks the cheapest worker, ties going to the one with
	// fewer cached blocks: the default's softmax draw would send the unrelated prompt
	// below, which costs the same on both idle workers, to either.
	c := startRouter(t, router.ModeKV, func(p *router.Config) { p.Temperature = 0 })
	tok := c.router.Token.String()
	c.addWorker("w1", tok, 0)
	c.waitWorkers(1) // w1 registers first: the lower id, preferred on ties
	n2 := c.addWorker("w2", tok, 0)
	c.waitWorkers(2)

	// Warm w2's cache directly, behind the router's back: the router learns of it only
	// through w2's KV events. With empty caches and equal load it would pick w1 (lower id).
	prompt := n2.m.Tokenizer.Encode(longPrompt, true, true)
	st, err := n2.eng.Generate(testCtx(t), &llm.Request{Prompt: prompt, MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := st.Next(testCtx(t))
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	full := len(prompt) / 16
	waitFor(t, "w2's KV events to reach the router", func() bool {
		w, ok := c.worker("w2")
		return ok && w.Blocks >= full && w.Load == 0 // and a load report after the warm-up ended
	})

	rc := client(c.router.URL())
	for i := range 3 {
		// The worker's load report for the previous request can arrive after the
		// request ended; with w2 still counted as busy, the cheaper choice is w1.
		waitFor(t, "w2 to report itself idle", func() bool {
			w, ok := c.worker("w2")
			return ok && w.Load == 0
		})
		out, wk := complete(t, rc, longPrompt, 8)
		if wk != "w2" {
			t.Fatalf("request %d went to %q, want w2 (which holds the prefix)", i, wk)
		}
		if cached := out.Usage.PromptTokensDetails.CachedTokens; cached < int64(16*(full-1)) {
			t.Errorf("request %d: %d cached tokens, want ≥ %d of %d", i, cached, 16*(full-1), len(prompt))
		}
	}
	// A different prompt still goes to the emptier worker.
	waitFor(t, "w2 to report itself idle", func() bool {
		w, ok := c.worker("w2")
		return ok && w.Load == 0
	})
	if _, wk := complete(t, rc, "A short unrelated story about a cat", 4); wk != "w1" {
		t.Errorf("unrelated prompt went to %q, want w1", wk)
	}
}

// A worker with a wrong join token is refused and says so; one whose block size disagrees
// with the model's other workers is refused by the router, loudly, on both sides.
func TestClusterRefusals(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	bad := c.addWorker("intruder", "abcdef.0123456789abcdef", 0)
	select {
	case <-bad.done:
		if !errors.Is(bad.err, orpc.ErrJoinTokenRejected) {
			t.Errorf("wrong token: %v, want a rejected join token", bad.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a worker with a wrong token was not refused")
	}
	if got := scrape(t, c.router.URL(), "tandem_router:join_refusals_total", `reason="token"`); got != 1 {
		t.Errorf("join refusals for the token on /metrics: %v, want 1", got)
	}

	tok := c.router.Token.String()
	c.addWorker("w1", tok, 0)
	c.waitWorkers(1)
	odd := c.addWorker("w-odd", tok, 32)
	waitFor(t, "the refusal", func() bool {
		return strings.Contains(odd.logs.String(), "router refused this worker") &&
			strings.Contains(c.logs.String(), "block size 32, the other workers use 16")
	})
	if len(c.router.Router.Workers()) != 1 {
		t.Errorf("workers %+v, want only w1", c.router.Router.Workers())
	}
}

// A worker that goes away is removed from the router (and its index entries with it);
// requests keep succeeding on the other worker.
func TestClusterWorkerLoss(t *testing.T) {
	c := startRouter(t, router.ModeRoundRobin)
	tok := c.router.Token.String()
	c.addWorker("w1", tok, 0)
	c.waitWorkers(1) // w1 registers first: the lower id, preferred on ties
	n2 := c.addWorker("w2", tok, 0)
	c.waitWorkers(2)
	rc := client(c.router.URL())
	seen := map[string]bool{}
	for range 4 {
		_, wk := complete(t, rc, longPrompt, 4)
		seen[wk] = true
	}
	if !seen["w1"] || !seen["w2"] {
		t.Fatalf("round-robin used %v, want both workers", seen)
	}
	n2.stop()
	c.waitWorkers(1)
	if w, ok := c.worker("w1"); !ok || !w.Healthy {
		t.Fatalf("w1 missing or unhealthy: %+v", c.router.Router.Workers())
	}
	for range 4 {
		if _, wk := complete(t, rc, longPrompt, 4); wk != "w1" {
			t.Errorf("after w2 left, a request went to %q", wk)
		}
	}
}

// slowEngine delays every token, so that a test can act in the middle of a stream.
type slowEngine struct {
	*engine.Engine
	d time.Duration
}

func (e slowEngine) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	st, err := e.Engine.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	return slowStream{st, e.d}, nil
}

type slowStream struct {
	llm.Stream
	d time.Duration
}

func (s slowStream) Next(ctx context.Context) (llm.Event, error) {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return llm.Event{}, ctx.Err()
	}
	return s.Stream.Next(ctx)
}

// A worker that dies in the middle of a stream: the request moves to the other worker with
// the tokens generated so far, and the client gets exactly the uninterrupted greedy text.
func TestClusterMigration(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	c.slow = 5 * time.Millisecond
	tok := c.router.Token.String()
	n1 := c.addWorker("w1", tok, 0)
	c.waitWorkers(1)
	n2 := c.addWorker("w2", tok, 0)
	c.waitWorkers(2)
	const prompt, maxTokens = "Once upon a time", 96
	want, _ := complete(t, direct(t, n1), prompt, maxTokens)

	var resp *http.Response
	stream := client(c.router.URL()).Completions.NewStreaming(testCtx(t), sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(maxTokens),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}, option.WithResponseInto(&resp))
	var text strings.Builder
	chunks, killed := 0, ""
	var usage sdk.CompletionUsage
	for stream.Next() {
		cur := stream.Current()
		for _, ch := range cur.Choices {
			text.WriteString(ch.Text)
		}
		if cur.Usage.TotalTokens > 0 {
			usage = cur.Usage
		}
		if chunks++; chunks == 10 {
			killed = resp.Header.Get(openai.WorkerHeader)
			victim := map[string]*node{"w1": n1, "w2": n2}[killed]
			if victim == nil {
				t.Fatalf("X-Tandem-Worker %q", killed)
			}
			go victim.stop()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if killed == "" {
		t.Fatal("the stream ended before a worker could be stopped")
	}
	if text.String() != want.Choices[0].Text {
		t.Errorf("after losing %s mid-stream got %q, want %q", killed, text.String(), want.Choices[0].Text)
	}
	if usage.CompletionTokens != want.Usage.CompletionTokens || usage.PromptTokens != want.Usage.PromptTokens {
		t.Errorf("usage %+v, want %+v", usage, want.Usage)
	}
	if !strings.Contains(c.logs.String(), "migrating the request") {
		t.Error("the router did not log a migration")
	}
}

// A worker that leaves takes its per-worker KV series off the router's /metrics, those
// labelled by cause too (the resyncs once stayed for every worker that ever joined).
func TestLeftWorkerSeriesRemoved(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	tok := c.router.Token.String()
	c.addWorker("w1", tok, 0)
	n2 := c.addWorker("w2", tok, 0)
	c.waitWorkers(2)
	resyncs := func(name string) float64 {
		return scrape(t, c.router.URL(), "tandem_router:kv_resyncs_total", `worker="`+name+`"`, `cause="join"`)
	}
	waitFor(t, "w2's join resync on /metrics", func() bool { return resyncs("w2") == 1 })
	n2.cancel()
	waitFor(t, "w2 to leave", func() bool { _, ok := c.worker("w2"); return !ok })
	if got := resyncs("w2"); got != -1 {
		t.Errorf("w2's resyncs still on /metrics after it left: %v", got)
	}
	if got := resyncs("w1"); got != 1 {
		t.Errorf("w1's resyncs on /metrics: %v, want 1", got)
	}
}
