package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/metrics"
	"tandem/router"
	"tandem/router/live"
	"tandem/sim"
)

// A router that dies without a word (SIGKILL; here it is cut off the network) leaves its
// requests running on the engines. The engine takes heartbeats unanswered for the router's
// heartbeat timeout (1 s here) for the router's loss and cancels the requests it sent, so
// their sequences are freed well before QUIC's idle timeout would end their calls (5 s by
// default; two minutes here, and the requests would run for 10 s on their own). Counted on
// the worker's metrics, logged once.
func TestWorkerCancelsRequestsOfLostRouter(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 100 * time.Millisecond,
		HeartbeatTimeout: time.Second, Options: longIdle})
	met := metrics.NewWorker(prometheus.NewRegistry())
	// Modelled decode steps of 100 ms: a 100-token request runs for 10 s.
	n := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{relays: true, options: longIdle,
		timing: &sim.Timing{DecodeBase: 100}, metrics: met})
	c.waitWorkers(1)
	// The router lists the worker before its registration reply reaches the worker, which
	// only then starts its heartbeats: cut the network before that and it never learns of
	// the loss (on a busy machine that took long enough to fail this test half the time).
	waitFor(t, "the worker to hold its registration", func() bool { return len(n.w.Connected()) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const streams = 2
	var started sync.WaitGroup
	started.Add(streams)
	for i := range streams {
		var once sync.Once
		streamGreedy(ctx, c.router.URL(), fmt.Sprintf("Stream %d of the router that dies", i), 100, func(int) { once.Do(started.Done) })
	}
	started.Wait()
	waitFor(t, "both sequences to run", func() bool { return n.eng.Stats().Running == streams })

	n.vanish() // from the engine's side, the router is dead: nothing it sends arrives, nothing reaches it
	cut := time.Now()
	waitFor(t, "the engine to free the lost router's sequences", func() bool {
		st := n.eng.Stats()
		return st.Running+st.Waiting == 0
	})
	took := time.Since(cut)
	t.Logf("the sequences were freed %v after the router died", took.Round(time.Millisecond))
	if took > 6*time.Second { // the worker gives its router three heartbeat timeouts (3 s here)
		t.Errorf("the sequences of the lost router ran on for %v after it died; want them canceled once three of its heartbeat timeouts passed", took)
	}
	if got := testutil.ToFloat64(met.OrphansCanceled); got != streams {
		t.Errorf("canceled requests on /metrics: %v, want %d", got, streams)
	}
	if logs := n.logs.String(); strings.Count(logs, "router lost; canceled the requests it had sent") != 1 || !strings.Contains(logs, fmt.Sprintf("canceled=%d", streams)) {
		t.Errorf("want one log of the %d canceled requests:\n%s", streams, logs)
	}
}
