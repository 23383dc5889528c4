package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"tandem/engine"
	"tandem/llm"
	"tandem/openai"
	"tandem/router"
	"tandem/router/live"
	"tandem/worker"
)

// staleStats is an engine whose Stats stay, from each request's arrival on, what they were
// then: every load report the worker makes afterwards is one made before the request's
// first token, however late it reaches the router. So the router meets, on its Publish
// stream, reports older than the first token and the end it has already seen on the
// request's Generate stream: the order that a loaded machine gives now and then.
type staleStats struct {
	*engine.Engine
	mu     sync.Mutex
	frozen *engine.Stats
}

func (e *staleStats) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	// The census before the request arrived, with the request in the inbox: what Stats
	// says just after its arrival, before any step could give it a token.
	snap := e.Engine.Stats()
	snap.Waiting++
	snap.WaitingTokens += len(req.Prompt)
	st, err := e.Engine.Generate(ctx, req)
	if err == nil {
		e.mu.Lock()
		e.frozen = &snap
		e.mu.Unlock()
	}
	return st, err
}

func (e *staleStats) Stats() engine.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.frozen != nil {
		return *e.frozen
	}
	return e.Engine.Stats()
}

// A load report made before a request's first token that reaches the router after the
// request's end does not count the request again: the report's step is before the steps
// of the first token and the end, which the router saw. With round-robin routing and one
// waiting request making a worker busy, a conversation's next turn stays on its worker
// (session affinity holds only while the worker is not busy); before steps, the stale
// report made it busy until the next report, and the turn went elsewhere.
func TestLiveStaleReportAfterEnd(t *testing.T) {
	pol := router.DefaultConfig()
	pol.Mode = router.ModeRoundRobin
	pol.BusyKVUsage = 0
	pol.BusyWaiting = 1
	c := startRouterWith(t, pol, 0)
	tok := c.router.Token.String()
	for _, name := range []string{"w1", "w2"} {
		c.addWorkerOpts(name, tok, workerOpts{wrap: func(e *engine.Engine) worker.Engine { return &staleStats{Engine: e} }})
	}
	c.waitWorkers(2)
	base := c.router.URL()
	turn := func(i int) string {
		t.Helper()
		body := fmt.Sprintf(`{"model":"stories","prompt":"Turn %d of a story","max_tokens":3,"temperature":0}`, i)
		resp, text, _ := post(t, base, body, live.SessionHeader, "conv-1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d: %d: %s", i, resp.StatusCode, text)
		}
		return resp.Header.Get(openai.WorkerHeader)
	}
	bound := turn(0)
	for i := 1; i <= 3; i++ {
		ended := time.Now()
		// A report made before this turn's first token, applied after its end.
		var st router.WorkerState
		waitFor(t, "a stale report after the turn's end", func() bool {
			var ok bool
			st, ok = c.router.Router.Policy(modelName, bound)
			return ok && st.ReportedAt.After(ended) && st.Report.Waiting == 1 && st.Report.Received >= uint64(i) && st.Report.Step > 0
		})
		if st.Waiting() != 0 {
			t.Fatalf("after turn %d: the worker predicts %d waiting from a report of step %d made before the turn's first token",
				i-1, st.Waiting(), st.Report.Step)
		}
		if wk := turn(i); wk != bound {
			t.Fatalf("turn %d went to %q, the conversation is on %q", i, wk, bound)
		}
	}
}
