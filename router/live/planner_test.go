package live

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/planner"
)

// stubbornConnector runs no workers and answers every Scale with err: a connector whose
// quota is spent (planner.ErrRefused) or whose API is down. The local connector cannot be
// made to refuse; the Kubernetes one can, and this is its contract.
type stubbornConnector struct {
	err   error
	mu    sync.Mutex
	calls []int
}

func (c *stubbornConnector) Replicas(planner.Pool) []planner.Replica { return nil }

func (c *stubbornConnector) Scale(_ context.Context, _ planner.Pool, n int, _ []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, n)
	return c.err
}

func (c *stubbornConnector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// flatPerf is a worker that prefills 0.1 ms a token and decodes a step in 10 ms.
type flatPerf struct{}

func (flatPerf) Prefill(n int, _ float64) time.Duration {
	return time.Duration(n) * 100 * time.Microsecond
}
func (flatPerf) Decode(int, int) time.Duration { return 10 * time.Millisecond }

// syncBuffer is a bytes.Buffer the router's goroutines may log to.
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

// counterValue is the value of the counter name with every label given, from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestPlannerCountsRefusedAndFailedScaling: a connector that refuses or fails every
// request leaves its pool short; each attempt is counted on /metrics (refused with reason
// connector, or connector errors) and the state is logged once, not once per attempt.
func TestPlannerCountsRefusedAndFailedScaling(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		metric string
		labels map[string]string
	}{
		{"refused", fmt.Errorf("quota of 0 engines: %w", planner.ErrRefused), "tandem_router:planner_refused_total", map[string]string{"pool": "both", "reason": "connector"}},
		{"failed", errors.New("api server unreachable"), "tandem_router:planner_connector_errors_total", map[string]string{"pool": "both"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			reg := prometheus.NewRegistry()
			l := newTestRouter(t, Config{Registry: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			conn := &stubbornConnector{err: tc.err}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				done <- l.RunPlanner(ctx, PlannerConfig{Connector: conn, Planner: planner.Config{
					Perf: flatPerf{}, Interval: 20 * time.Millisecond, LoadInterval: 10 * time.Millisecond}})
			}()
			deadline := time.Now().Add(20 * time.Second)
			for conn.count() < 4 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			calls := conn.count()
			if calls < 4 {
				t.Fatalf("the planner asked the connector %d times in 20 s, want it to keep asking", calls)
			}
			if got := counterValue(t, reg, tc.metric, tc.labels); int(got) != calls {
				t.Errorf("%s %v = %v, want %d (one per attempt)", tc.metric, tc.labels, got, calls)
			}
			if n := strings.Count(logs.String(), "the connector did not scale"); n != 1 {
				t.Errorf("logged the failure %d times over %d attempts, want once:\n%s", n, calls, logs.String())
			}
			if err := l.RunPlanner(context.Background(), PlannerConfig{}); err == nil {
				t.Error("a planner without a connector was accepted")
			}
		})
	}
}
