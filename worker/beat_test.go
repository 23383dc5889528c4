package worker_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
	"tandem/metrics"
	"tandem/orpc"
	"tandem/router"
	"tandem/router/live"
	"tandem/worker"
)

// fakeRouter answers Router.Register with reply and then, while the registration lasts,
// sends it again every reply.BeatMs, beats times (-1: for as long as the registration
// lasts); with publish it opens the worker's Worker.Publish stream, as a router of this
// version does, and reads it. It answers Router.Heartbeat and Router.Events calls.
type fakeRouter struct {
	reply   cluster.RegisterReply
	beats   int
	publish bool
	ca      *orpc.CA // the cluster's: the router's identity and its worker's
	id      *orpc.Identity
	addr    string

	calls     atomic.Int64 // Router.Heartbeat calls
	published atomic.Int64 // load reports on Worker.Publish
	mu        sync.Mutex
	regAt     []time.Time // when each registration was answered
	silentAt  []time.Time // when each registration sent its last beat
}

func startFakeRouter(t *testing.T, f *fakeRouter) *fakeRouter {
	t.Helper()
	var err error
	if f.ca, err = orpc.NewCA("test"); err != nil {
		t.Fatal(err)
	}
	if f.id, err = f.ca.NewIdentity("fake-router", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	quiet := orpc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := orpc.NewServer(quiet)
	orpc.ServerStream(srv, cluster.MethodRegister, func(ctx context.Context, card *cluster.ModelCard, send func(*cluster.RegisterReply) error) error {
		if err := send(&f.reply); err != nil {
			return err
		}
		f.mu.Lock()
		f.regAt = append(f.regAt, time.Now())
		i := len(f.regAt) - 1
		f.silentAt = append(f.silentAt, time.Now())
		f.mu.Unlock()
		if f.publish {
			c, err := orpc.Dial(ctx, card.Addr, f.id.ClientTLS(), quiet)
			if err != nil {
				return err
			}
			defer c.Close()
			cs, err := c.Stream(ctx, cluster.MethodPublish, &cluster.PublishRequest{DispatchKey: f.reply.DispatchKey})
			if err != nil {
				return err
			}
			defer cs.Close()
			go func() {
				var p cluster.Publication
				for cs.RecvMsg(&p) == nil {
					if p.Kind == cluster.PublishReport {
						f.published.Add(1)
					}
				}
			}()
		}
		if f.reply.BeatMs == 0 {
			<-ctx.Done()
			return nil
		}
		t := time.NewTicker(time.Duration(f.reply.BeatMs) * time.Millisecond)
		defer t.Stop()
		for n := 0; f.beats < 0 || n < f.beats; n++ {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			if err := send(&f.reply); err != nil {
				return err
			}
			f.mu.Lock()
			f.silentAt[i] = time.Now()
			f.mu.Unlock()
		}
		<-ctx.Done() // silent, but the call and the connection stay up
		return nil
	})
	orpc.Unary(srv, cluster.MethodHeartbeat, func(ctx context.Context, _ *cluster.LoadReport) (*cluster.Ack, error) {
		f.calls.Add(1)
		return &cluster.Ack{}, nil
	})
	orpc.Unary(srv, cluster.MethodEvents, func(ctx context.Context, _ *cluster.KVEvents) (*cluster.Ack, error) {
		return &cluster.Ack{}, nil
	})
	f.addr = serveORPC(t, srv, f.id)
	return f
}

func (f *fakeRouter) registrations() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.regAt)
}

// runFakeWorker runs a worker of this version under f until the test ends, and waits for
// its registration. It returns the worker's membership metrics.
func runFakeWorker(t *testing.T, f *fakeRouter) *metrics.Worker {
	t.Helper()
	id, err := f.ca.NewIdentity("w1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	met := metrics.NewWorker(prometheus.NewRegistry())
	runWorker(t, worker.Config{Card: cluster.ModelCard{Model: modelName, BlockSize: 16}, Routers: []string{f.addr}, Identity: id, Metrics: met}, nil)
	waitFor(t, "the registration", func() bool { return f.registrations() >= 1 })
	return met
}

// A router that beats (RegisterReply.BeatMs) tells its workers that it is alive by
// repeating its reply on the registration stream: a worker whose reports go on
// Worker.Publish then makes no Router.Heartbeat call at all, where it made one every
// heartbeat timeout under a router that does not beat (a router before this version),
// which it still does.
func TestProbeCallsOnlyWithoutBeats(t *testing.T) {
	for _, beat := range []int{0, 200} {
		f := startFakeRouter(t, &fakeRouter{beats: -1, publish: true, reply: cluster.RegisterReply{WorkerID: 1, HeartbeatMs: 50,
			Router: "fake", DispatchKey: 77, HeartbeatTimeoutMs: 300, BeatMs: beat}})
		met := runFakeWorker(t, f)
		waitFor(t, "reports on the stream", func() bool { return f.published.Load() > 0 })
		before := f.calls.Load()
		time.Sleep(1500 * time.Millisecond) // five heartbeat timeouts
		calls := f.calls.Load() - before
		switch {
		case beat == 0 && calls < 3:
			t.Errorf("router without beats: %d probe calls in five heartbeat timeouts, want one every timeout", calls)
		case beat > 0 && calls != 0:
			t.Errorf("router beating every %d ms: %d probe calls in five heartbeat timeouts, want none", beat, calls)
		}
		if n := f.registrations(); n != 1 {
			t.Errorf("beat %d ms: %d registrations, want the first to hold", beat, n)
		}
		// The fallback to probe calls is counted, once a registration.
		if got, want := testutil.ToFloat64(met.ProbedRegistrations), float64(f.registrations()); beat == 0 && got != want || beat > 0 && got != 0 {
			t.Errorf("beat %d ms: %v registrations counted as probed, of %v", beat, got, want)
		}
	}
}

// A router that stops beating is lost to its workers once it has been silent for three
// heartbeat timeouts and one beat, even while its connection stays up and it answers
// calls (a router stuck, as a router whose host is cut off looks to QUIC until its idle
// timeout): the worker ends the registration, as it does on a lost router, and
// registers again. Not sooner: the silence is counted from the last beat.
func TestWorkerLeavesRouterThatStopsBeating(t *testing.T) {
	const ht, beat = 300 * time.Millisecond, 200 * time.Millisecond
	f := startFakeRouter(t, &fakeRouter{beats: 2, reply: cluster.RegisterReply{WorkerID: 1, HeartbeatMs: 50,
		Router: "fake", DispatchKey: 77, HeartbeatTimeoutMs: int(ht / time.Millisecond), BeatMs: int(beat / time.Millisecond)}})
	met := runFakeWorker(t, f)
	waitFor(t, "a second registration", func() bool { return f.registrations() >= 2 })
	f.mu.Lock()
	gap := f.regAt[1].Sub(f.silentAt[0])
	f.mu.Unlock()
	t.Logf("registered again %v after the router's last beat", gap.Round(time.Millisecond))
	// Lost after 3 × 300 ms + 200 ms of silence, checked every report interval (50 ms);
	// then the reconnection's first backoff (100 ms) and a handshake.
	if lost := 3*ht + beat; gap < lost-50*time.Millisecond || gap > lost+1500*time.Millisecond {
		t.Errorf("registered again %v after the last beat, want a little over %v", gap, lost)
	}
	if f.calls.Load() == 0 {
		t.Error("no report calls: the router answered calls all along, which is not what ended the registration")
	}
	if got := testutil.ToFloat64(met.RouterLosses.WithLabelValues("beats")); got < 1 {
		t.Errorf("%v losses to the beats' silence counted, want the registration that ended so", got)
	}
}

// An idle fleet under a router of this version keeps its registrations on both sides for
// longer than a worker's loss timeout (three heartbeat timeouts and a beat) and QUIC's
// idle timeout: the router's beats and the workers' unchanged reports, sent less often,
// are enough, with no probe call and no keepalive between them needed.
func TestIdleFleetStaysRegistered(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 100 * time.Millisecond, HeartbeatTimeout: time.Second})
	var nodes []*node
	for _, name := range []string{"a", "b", "c"} {
		nodes = append(nodes, c.addWorker(name, c.router.Token.String(), 0))
	}
	c.waitWorkers(3)
	url := c.router.URL()
	waitFor(t, "reports on the streams", func() bool {
		return scrape(t, url, "tandem_router:worker_messages_total", `kind="report"`, `via="stream"`) >= 3
	})
	calls := scrape(t, url, "tandem_router:worker_messages_total", `kind="report"`, `via="call"`)
	for end := time.Now().Add(orpc.DefaultIdleTimeout + time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for _, n := range nodes {
			if len(n.w.Connected()) != 1 {
				t.Fatalf("worker %s let go of its router while idle", n.name)
			}
		}
	}
	if got := scrape(t, url, "tandem_router:worker_joins_total"); got != 3 {
		t.Errorf("%v registrations, want the first three to hold", got)
	}
	if got := scrape(t, url, "tandem_router:worker_losses_total"); got != 0 {
		t.Errorf("%v workers lost while idle", got)
	}
	if got := scrape(t, url, "tandem_router:worker_messages_total", `kind="report"`, `via="call"`) - calls; got != 0 {
		t.Errorf("%v report calls after the streams opened, want none", got)
	}
	for _, n := range nodes {
		if logs := n.logs.String(); strings.Contains(logs, "router connection lost") {
			t.Errorf("worker %s lost its router while idle:\n%s", n.name, logs)
		}
	}
}

// A router cut off without a word (SIGKILL, its host lost) is noticed by its worker at
// QUIC's idle timeout on the router's own connection to the worker, which carries the
// worker's reports and so times out first: the router drops a registration whose
// connection to the worker ends, so the worker ends it too and does not wait for its
// registration's connection, quiet between beats, to time out later, nor for the beats'
// silence (three heartbeat timeouts, a minute here).
func TestWorkerLeavesRouterWhoseConnectionTimesOut(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 100 * time.Millisecond, HeartbeatTimeout: 20 * time.Second})
	met := metrics.NewWorker(prometheus.NewRegistry())
	n := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{relays: true, metrics: met})
	c.waitWorkers(1)
	url := c.router.URL()
	waitFor(t, "reports on the stream", func() bool {
		return scrape(t, url, "tandem_router:worker_messages_total", `kind="report"`, `via="stream"`) >= 1
	})
	n.vanish()
	cut := time.Now()
	for len(n.w.Connected()) > 0 {
		if time.Since(cut) > 2*orpc.DefaultIdleTimeout {
			t.Fatalf("the worker still holds its registration %v after its router was cut off", time.Since(cut).Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(cut)
	t.Logf("the worker let go of its router %v after it was cut off", took.Round(time.Millisecond))
	// The idle timeout, counted from the first report the router did not acknowledge.
	if took < orpc.DefaultIdleTimeout-500*time.Millisecond || took > orpc.DefaultIdleTimeout+2*time.Second {
		t.Errorf("the worker let go of its router %v after it was cut off, want QUIC's idle timeout (%v) and a report interval", took, orpc.DefaultIdleTimeout)
	}
	if logs := n.logs.String(); !strings.Contains(logs, "the router's connection to this worker ended") {
		t.Errorf("want the loss put down to the router's connection to the worker:\n%s", logs)
	}
	if got := testutil.ToFloat64(met.RouterLosses.WithLabelValues("connection")); got != 1 {
		t.Errorf("%v losses to the router's connection ending counted, want 1", got)
	}
}
