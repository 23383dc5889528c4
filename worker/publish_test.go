package worker_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/orpc"
	"tandem/router"
	"tandem/router/live"
	"tandem/worker"
)

// A router and a worker of this version send the worker's load reports and KV event
// batches over its Worker.Publish stream (the router's beats on the registration stream
// tell the worker that it is alive: TestProbeCallsOnlyWithoutBeats); KV-aware routing
// works on them.
func TestReportsOverStream(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond, HeartbeatTimeout: time.Second})
	c.addWorker("w1", c.router.Token.String(), 0)
	c.waitWorkers(1)
	time.Sleep(time.Second)
	complete(t, client(c.router.URL()), longPrompt, 4) // its blocks reach the index as events
	base := c.router.URL()
	waitFor(t, "events on the stream", func() bool {
		return scrape(t, base, "tandem_router:worker_messages_total", `kind="events"`, `via="stream"`) > 0
	})
	byStream := scrape(t, base, "tandem_router:worker_messages_total", `kind="report"`, `via="stream"`)
	byCall := scrape(t, base, "tandem_router:worker_messages_total", `kind="report"`, `via="call"`)
	if byStream < 4 || byCall > byStream/2 {
		t.Errorf("reports: %v on the stream, %v by calls: want them on the stream (calls only before it opened)", byStream, byCall)
	}
	if calls := scrape(t, base, "tandem_router:worker_messages_total", `kind="events"`, `via="call"`); calls > 0 {
		t.Errorf("%v event batches came by calls", calls)
	}
	// KV routing sees the events: the prompt's blocks are the worker's.
	if info, ok := c.worker("w1"); !ok || info.Blocks == 0 {
		t.Errorf("the index holds no blocks of the worker: %+v", info)
	}
}

// oldRouter answers Router.Register, Heartbeat and Events as a router that predates
// Worker.Publish does: it never opens the stream.
type oldRouter struct {
	heartbeats, events atomic.Int64
	addr               string
}

func startOldRouter(t *testing.T, id *orpc.Identity) *oldRouter {
	t.Helper()
	r := &oldRouter{}
	srv := orpc.NewServer(orpc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	orpc.ServerStream(srv, cluster.MethodRegister, func(ctx context.Context, card *cluster.ModelCard, send func(*cluster.RegisterReply) error) error {
		if err := send(&cluster.RegisterReply{WorkerID: 1, HeartbeatMs: 20, Router: "old", DispatchKey: 77, HeartbeatTimeoutMs: 1000}); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	orpc.Unary(srv, cluster.MethodHeartbeat, func(ctx context.Context, _ *cluster.LoadReport) (*cluster.Ack, error) {
		r.heartbeats.Add(1)
		return &cluster.Ack{}, nil
	})
	orpc.Unary(srv, cluster.MethodEvents, func(ctx context.Context, _ *cluster.KVEvents) (*cluster.Ack, error) {
		r.events.Add(1)
		return &cluster.Ack{}, nil
	})
	r.addr = serveORPC(t, srv, id)
	return r
}

// serveORPC serves srv on 127.0.0.1 with identity id until the test ends, and returns its
// address.
func serveORPC(t *testing.T, srv *orpc.Server, id *orpc.Identity) string {
	t.Helper()
	l, err := srv.Listen("127.0.0.1:0", id.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

// A worker of this version under a router that does not open Worker.Publish sends every
// report and event batch as a call, as before.
func TestReportsToOldRouter(t *testing.T) {
	ca, err := orpc.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	rid, _ := ca.NewIdentity("old-router", []string{"127.0.0.1"})
	wid, _ := ca.NewIdentity("w1", []string{"127.0.0.1"})
	r := startOldRouter(t, rid)

	var eng *engine.Engine
	m := runWorker(t, worker.Config{Card: cluster.ModelCard{Model: modelName, BlockSize: 16}, Routers: []string{r.addr}, Identity: wid},
		func(e *engine.Engine) worker.Engine { eng = e; return e })
	// Registered first: blocks stored before the session subscribes to the engine's
	// events are the snapshot's (which this router never asks for), not events.
	waitFor(t, "the first report", func() bool { return r.heartbeats.Load() >= 1 })
	ctx := testCtx(t)
	st, err := eng.Generate(ctx, &llm.Request{Prompt: m.Tokenizer.Encode(longPrompt, true, false), MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Next(ctx); err != nil {
			break
		}
	}
	waitFor(t, "reports and events by calls", func() bool { return r.heartbeats.Load() >= 20 && r.events.Load() >= 1 })
}

// A worker that predates Worker.Publish (the method unknown to it) under a router of this
// version: its reports by calls keep it registered and healthy, and the router says once
// why it reads no stream from it.
func TestReportsFromOldWorker(t *testing.T) {
	dir := t.TempDir()
	c := startRouterIn(t, dir, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond, HeartbeatTimeout: time.Second})
	ca, _, err := orpc.LoadOrCreateCA(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ca.NewIdentity("old1", []string{"127.0.0.1"})

	// Its ORPC server serves a snapshot and nothing else.
	srv := orpc.NewServer(orpc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	orpc.Unary(srv, cluster.MethodSnapshot, func(ctx context.Context, _ *cluster.SnapshotRequest) (*cluster.Snapshot, error) {
		return &cluster.Snapshot{}, nil
	})
	l, err := srv.Listen("127.0.0.1:0", id.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, l)

	path := fixtures.Model(t, "stories260K-f32.gguf")
	format, files, err := cluster.EncodeTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := orpc.Dial(ctx, c.router.ORPCAddr, id.ClientTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	reg, err := cl.Stream(ctx, cluster.MethodRegister, &cluster.ModelCard{Version: cluster.Version, Model: modelName, Node: "old1",
		Addr: "127.0.0.1:" + port, Role: cluster.RoleBoth, HashVersion: kvcache.HashVersion, BlockSize: 16,
		Salt: kvcache.Salt(modelName, "", ""), KVBlocks: 64, ContextLen: 128, TokenizerFormat: format, TokenizerFiles: files})
	if err != nil {
		t.Fatal(err)
	}
	var reply cluster.RegisterReply
	if err := reg.RecvMsg(&reply); err != nil {
		t.Fatal(err)
	}
	// Reports by calls for three heartbeat timeouts.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		r := cluster.LoadReport{WorkerID: reply.WorkerID, Load: llm.Load{Healthy: true}}
		if err := cl.Call(ctx, cluster.MethodHeartbeat, &r, &cluster.Ack{}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
	}
	info, ok := c.worker("old1")
	if !ok || !info.Healthy {
		t.Fatalf("the old worker is not registered and healthy: %+v, %v", info, ok)
	}
	if !strings.Contains(c.logs.String(), "does not publish its reports over a stream") {
		t.Error("the router did not say why it reads no stream from the worker")
	}
}
