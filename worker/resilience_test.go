package worker_test

import (
	"strings"
	"testing"
	"time"

	"tandem/router"
	"tandem/router/live"
)

// A request that finds no healthy worker (its only worker suspect for a moment) waits in
// the router's queue and is served when the worker reports again, instead of failing at
// once with 503; the wait is counted on /metrics and logged once.
func TestNoHealthyWorkerWaits(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 100 * time.Millisecond,
		HeartbeatTimeout: 20 * time.Second, QueueTimeout: 15 * time.Second, Options: longIdle})
	n := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{relays: true, options: longIdle})
	c.waitWorkers(1)
	n.vanish()
	waitFor(t, "the worker to turn suspect", func() bool {
		w, ok := c.worker("w1")
		return ok && !w.Healthy
	})
	go func() {
		time.Sleep(time.Second)
		n.reappear()
	}()
	resp, body, took := post(t, c.router.URL(), `{"model":"`+modelName+`","prompt":"Once upon a time","max_tokens":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d after %v: %s", resp.StatusCode, took, body)
	}
	if took < 500*time.Millisecond {
		t.Errorf("answered after %v: it did not wait for the worker", took)
	}
	if got := scrape(t, c.router.URL(), "tandem_router:requests_queued_total", `cause="no_workers"`); got != 1 {
		t.Errorf("queued for no worker on /metrics: %v, want 1", got)
	}
	if logs := c.logs.String(); strings.Count(logs, "no healthy worker: requests wait") != 1 {
		t.Errorf("want one log of the wait:\n%s", logs)
	}
}

// When most workers go silent at once (the router's own host or network, far likelier
// than a whole fleet dying in one instant), none is declared dead: they keep their
// registrations and serve again when their reports return. One worker silent alone is
// still declared dead.
func TestMassSilenceDeclaresNoneDead(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 100 * time.Millisecond,
		HeartbeatTimeout: time.Second, Options: longIdle})
	var nodes []*node
	for _, name := range []string{"a", "b", "c"} {
		nodes = append(nodes, c.addWorkerOpts(name, c.router.Token.String(), workerOpts{relays: true, options: longIdle}))
	}
	c.waitWorkers(3)
	for _, n := range nodes {
		n.vanish()
	}
	time.Sleep(2 * time.Second) // past the heartbeat timeout, within three of them
	url := c.router.URL()
	if got := scrape(t, url, "tandem_router:worker_heartbeat_timeouts_total"); got != 0 {
		t.Errorf("%v workers declared dead, want none", got)
	}
	if got := scrape(t, url, "tandem_router:heartbeat_mass_silence_total"); got != 1 {
		t.Errorf("mass silences %v, want 1", got)
	}
	if ws := c.router.Router.Workers(); len(ws) != 3 {
		t.Errorf("%d workers registered after the silence, want 3", len(ws))
	}
	// (Cut off as long, the workers take the router for lost on their side and register
	// again: that is their judgement, and replaces the registrations the router kept.)
	for _, n := range nodes {
		n.reappear()
	}
	waitFor(t, "the workers healthy again", func() bool {
		ws := c.router.Router.Workers()
		ok := len(ws) == 3
		for _, w := range ws {
			ok = ok && w.Healthy
		}
		return ok
	})
	resp, body, _ := post(t, url, `{"model":"`+modelName+`","prompt":"Once upon a time","max_tokens":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("after the silence: %d %s", resp.StatusCode, body)
	}

	before := scrape(t, url, "tandem_router:worker_heartbeat_timeouts_total")
	nodes[0].vanish() // alone: dead
	waitFor(t, "a declared dead", func() bool { _, ok := c.worker("a"); return !ok })
	if got := scrape(t, url, "tandem_router:worker_heartbeat_timeouts_total"); got != before+1 {
		t.Errorf("%v workers declared dead, want %v", got, before+1)
	}
}
