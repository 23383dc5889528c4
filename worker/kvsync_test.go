package worker_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/orpc"
	"tandem/router"
	"tandem/router/live"
)

// fakeWorker speaks the worker's side of the cluster protocol over real ORPC on loopback,
// with the test in charge of what it sends: its KV events (ids skipped, or none at all),
// its load reports and whether its snapshots succeed. A worker built on a real engine
// cannot be made to misbehave this way.
type fakeWorker struct {
	t    *testing.T
	name string
	cl   *orpc.Client
	id   uint64 // the router's id for it
	reg  *orpc.ClientStream

	mu       sync.Mutex
	snap     kvcache.Snapshot
	snapErr  error
	snapshot int // Snapshot calls served
}

func newFakeWorker(t *testing.T, c *testCluster, name string, snapErr error) *fakeWorker {
	t.Helper()
	ctx := testCtx(t)
	tok, err := orpc.ParseToken(c.router.Token.String())
	if err != nil {
		t.Fatal(err)
	}
	id, err := orpc.Join(ctx, c.router.ORPCAddr, tok, name, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeWorker{t: t, name: name, snapErr: snapErr}
	srv := orpc.NewServer()
	orpc.Unary(srv, cluster.MethodSnapshot, func(context.Context, *cluster.SnapshotRequest) (*cluster.Snapshot, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.snapshot++
		if f.snapErr != nil {
			return nil, f.snapErr
		}
		return &cluster.Snapshot{Snapshot: f.snap}, nil
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := srv.ListenPacket(pc, id.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(sctx, l) }()
	t.Cleanup(func() { stop(); <-done; pc.Close() })

	if f.cl, err = orpc.Dial(ctx, c.router.ORPCAddr, id.ClientTLS()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cl.Close() })
	format, files, err := cluster.EncodeTokenizer(c.path)
	if err != nil {
		t.Fatal(err)
	}
	card := cluster.ModelCard{Version: cluster.Version, Model: modelName, Node: name, Addr: pc.LocalAddr().String(),
		HashVersion: kvcache.HashVersion, BlockSize: 16, Salt: kvcache.Salt(modelName, "", ""), KVBlocks: 256,
		ContextLen: 512, TokenizerFormat: format, TokenizerFiles: files}
	if f.reg, err = f.cl.Stream(context.Background(), cluster.MethodRegister, &card); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.reg.Close() })
	var reply cluster.RegisterReply
	if err := f.reg.RecvMsg(&reply); err != nil {
		t.Fatal(err)
	}
	f.id = reply.WorkerID
	return f
}

func (f *fakeWorker) setSnapshot(s kvcache.Snapshot, err error) {
	f.mu.Lock()
	f.snap, f.snapErr = s, err
	f.mu.Unlock()
}

func (f *fakeWorker) snapshots() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snapshot
}

func (f *fakeWorker) report(l llm.Load) {
	f.t.Helper()
	l.Healthy = true
	if err := f.cl.Call(testCtx(f.t), cluster.MethodHeartbeat, &cluster.LoadReport{WorkerID: f.id, Load: l}, &cluster.Ack{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeWorker) send(evs ...kvcache.Event) {
	f.t.Helper()
	if err := f.cl.Call(testCtx(f.t), cluster.MethodEvents, &cluster.KVEvents{WorkerID: f.id, Events: evs}, &cluster.Ack{}); err != nil {
		f.t.Fatal(err)
	}
}

// fakeStored is event id storing n blocks of a chain of its own (base names the chain).
func fakeStored(id uint64, base, n int) kvcache.Event {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(base)<<20 | uint64(i+1)
	}
	return kvcache.Event{ID: id, Kind: kvcache.EventStored, Hashes: hs}
}

func (c *testCluster) fakeBlocks(name string) int {
	for _, w := range c.router.Router.Workers() {
		if w.Node == name {
			return w.Blocks
		}
	}
	return -1
}

func health(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + strings.TrimSpace(string(b))
}

func kvRouter(t *testing.T, cfg live.Config) *testCluster {
	t.Helper()
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 50 * time.Millisecond
	}
	cfg.HeartbeatTimeout = time.Minute // the fakes report when the test says
	cfg.Policy = router.DefaultConfig()
	return startRouterLive(t, cfg)
}

// A worker that skips an event id: the router counts the gap on /metrics per worker,
// fetches a snapshot once, and continues from it.
func TestKVSyncSkippedID(t *testing.T) {
	c := kvRouter(t, live.Config{})
	f := newFakeWorker(t, c, "skipper", nil)
	waitFor(t, "the join snapshot", func() bool { return f.snapshots() == 1 })
	f.send(fakeStored(1, 1, 3), fakeStored(2, 2, 2))
	waitFor(t, "5 blocks indexed", func() bool { return c.fakeBlocks("skipper") == 5 })
	// Event 3 never comes; the worker's cache (its snapshot) holds 4 blocks after event 4.
	f.setSnapshot(kvcache.Snapshot{LastID: 4, Blocks: []kvcache.CachedBlock{{Hash: 9}, {Hash: 10}, {Hash: 11}, {Hash: 12}}}, nil)
	f.send(fakeStored(4, 4, 1))
	waitFor(t, "the resync", func() bool { return c.fakeBlocks("skipper") == 4 && f.snapshots() == 2 })
	f.send(fakeStored(5, 5, 2)) // continues from the snapshot
	waitFor(t, "event 5 applied", func() bool { return c.fakeBlocks("skipper") == 6 })
	url := c.router.URL()
	if n := scrape(t, url, "tandem_router:kv_event_gaps_total", `worker="skipper"`); n != 1 {
		t.Errorf("gaps on /metrics: %v, want 1", n)
	}
	if n := scrape(t, url, "tandem_router:kv_resyncs_total", `worker="skipper"`, `cause="gap"`); n != 1 {
		t.Errorf("gap resyncs on /metrics: %v, want 1", n)
	}
	if n := strings.Count(c.logs.String(), "KV event gap; fetching a snapshot"); n != 1 {
		t.Errorf("%d gap logs, want 1", n)
	}
}

// A report that overtakes its event batch is no gap: no snapshot while events still come.
// A report that stays ahead with no event arriving is one (an event lost at the end of a
// burst). A report whose cache size differs from the index's, both at the same event id,
// is drift.
func TestKVSyncReportsAhead(t *testing.T) {
	c := kvRouter(t, live.Config{Heartbeat: 100 * time.Millisecond}) // behind grace: 1 s
	f := newFakeWorker(t, c, "ahead", nil)
	waitFor(t, "the join snapshot", func() bool { return f.snapshots() == 1 })
	for id := uint64(1); id <= 6; id++ {
		f.report(llm.Load{LastEventID: id}) // the report first: it overtook the batch
		time.Sleep(300 * time.Millisecond)
		f.send(fakeStored(id, int(id), 1))
	}
	f.report(llm.Load{LastEventID: 6, CachedBlocks: 6})
	if n := f.snapshots(); n != 1 {
		t.Fatalf("%d snapshots, want only the join's: reports ahead of their events are no gap", n)
	}
	// Event 7 is lost: the reports stay ahead and nothing comes.
	f.setSnapshot(kvcache.Snapshot{LastID: 7, Blocks: []kvcache.CachedBlock{{Hash: 1}}}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for f.snapshots() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no snapshot for a report that stayed ahead")
		}
		f.report(llm.Load{LastEventID: 7})
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, "the snapshot applied", func() bool { return c.fakeBlocks("ahead") == 1 })
	url := c.router.URL()
	if n := scrape(t, url, "tandem_router:kv_resyncs_total", `worker="ahead"`, `cause="behind"`); n != 1 {
		t.Errorf("behind resyncs %v, want 1", n)
	}
	// Drift: at event 7 the worker says 3 blocks, the index holds 1.
	f.setSnapshot(kvcache.Snapshot{LastID: 7, Blocks: []kvcache.CachedBlock{{Hash: 1}, {Hash: 2}, {Hash: 3}}}, nil)
	f.report(llm.Load{LastEventID: 7, CachedBlocks: 3})
	waitFor(t, "the drift resync", func() bool { return c.fakeBlocks("ahead") == 3 })
	if n := scrape(t, url, "tandem_router:kv_index_drift_total", `worker="ahead"`); n != 1 {
		t.Errorf("drift %v, want 1", n)
	}
	f.report(llm.Load{LastEventID: 7, CachedBlocks: 3})
	if n := scrape(t, url, "tandem_router:kv_index_drift_total", `worker="ahead"`); n != 1 || f.snapshots() != 3 {
		t.Errorf("drift %v, snapshots %d after an agreeing report; want 1 and 3", n, f.snapshots())
	}
}

// A worker with load that sends no KV events is marked stale (counted, logged once, /health
// degraded) until its events come; with RequireKVEvents the policy keeps requests off it.
func TestKVSyncStale(t *testing.T) {
	c := kvRouter(t, live.Config{StaleAfter: 300 * time.Millisecond})
	f := newFakeWorker(t, c, "silent", nil)
	waitFor(t, "the join snapshot", func() bool { return f.snapshots() == 1 })
	if h := health(t, c.router.URL()); h != "200 OK ok" {
		t.Fatalf("health before: %q", h)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(health(t, c.router.URL()), "degraded") {
		if time.Now().After(deadline) {
			t.Fatal("never marked stale")
		}
		f.report(llm.Load{Running: 2, Waiting: 1}) // busy, event ids stuck at 0
		time.Sleep(50 * time.Millisecond)
	}
	if h := health(t, c.router.URL()); h != "200 OK degraded: 1 worker without KV events (stale index: overlap unknown)" {
		t.Errorf("health while stale: %q", h)
	}
	for range 5 {
		f.report(llm.Load{Running: 2, Waiting: 1})
	}
	url := c.router.URL()
	if n := scrape(t, url, "tandem_router:kv_stale_total", `worker="silent"`); n != 1 {
		t.Errorf("stale count %v, want 1", n)
	}
	if n := scrape(t, url, "tandem_router:kv_stale_workers"); n != 1 {
		t.Errorf("stale workers gauge %v, want 1", n)
	}
	if n := strings.Count(c.logs.String(), "worker's KV index is stale"); n != 1 {
		t.Errorf("%d stale logs, want 1", n)
	}
	if w := stateOf(t, c, "silent"); !w.Stale {
		t.Errorf("the policy does not see the worker stale: %+v", w)
	}
	f.send(fakeStored(1, 1, 2))
	f.report(llm.Load{Running: 2, Waiting: 1, LastEventID: 1, CachedBlocks: 2})
	waitFor(t, "health back", func() bool { return health(t, url) == "200 OK ok" })
	if w := stateOf(t, c, "silent"); w.Stale {
		t.Errorf("still stale after events: %+v", w)
	}
}

// stateOf returns the policy's view of a worker.
func stateOf(t *testing.T, c *testCluster, name string) router.WorkerState {
	t.Helper()
	st, ok := c.router.Router.Policy(modelName, name)
	if !ok {
		t.Fatalf("no worker %s", name)
	}
	return st
}

// A worker whose snapshot fails stays registered, stale, and the router retries with
// backoff, counting the failures, until one succeeds.
func TestKVSyncSnapshotFails(t *testing.T) {
	c := kvRouter(t, live.Config{})
	fw := newFakeWorker(t, c, "nosnap", errors.New("fake: snapshot refused"))
	waitFor(t, "a failed snapshot and its retry", func() bool { return fw.snapshots() >= 2 })
	url := c.router.URL()
	if n := scrape(t, url, "tandem_router:kv_resync_failures_total", `worker="nosnap"`); n < 1 {
		t.Errorf("failures on /metrics %v", n)
	}
	if c.fakeBlocks("nosnap") < 0 {
		t.Fatal("the worker was removed for a failed snapshot")
	}
	if h := health(t, url); !strings.HasPrefix(h, "200 OK degraded: 1 worker") {
		t.Errorf("health %q", h)
	}
	if n := strings.Count(c.logs.String(), "msg=\"KV snapshot failed;"); n != 1 {
		t.Errorf("%d snapshot failure logs, want 1 (one per streak)", n)
	}
	fw.setSnapshot(kvcache.Snapshot{LastID: 3, Blocks: []kvcache.CachedBlock{{Hash: 5}, {Hash: 6}}}, nil)
	waitFor(t, "a snapshot that succeeds", func() bool { return c.fakeBlocks("nosnap") == 2 })
	waitFor(t, "health back", func() bool { return health(t, url) == "200 OK ok" })
	fw.send(fakeStored(4, 1, 1))
	waitFor(t, "events after the snapshot", func() bool { return c.fakeBlocks("nosnap") == 3 })
}
