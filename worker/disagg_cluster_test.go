package worker_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/internal/fixtures"
	"tandem/router"
	"tandem/worker"
)

// scrape returns the value of the sample of metric name whose labels contain every
// name="value" pair given, or -1 when there is none.
func scrape(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	rx := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range rx.FindAllStringSubmatch(string(body), -1) {
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(m[1], l)
		}
		if ok {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// In process: a router, two prefill and two decode workers. A long prompt is prefilled on a
// prefill worker and decoded on a decode worker, with the tokens of an engine doing both; a
// short one is prefilled where it is decoded; the decisions are in the router's metrics.
func TestDisaggregatedThroughRouter(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	logs := &syncBuffer{}
	pol := router.DefaultConfig()
	dis := router.DefaultDisaggConfig()
	dis.MinRemoteTokens = 32
	srv, err := router.StartServer(router.ServerConfig{
		Host: "127.0.0.1", StateDir: t.TempDir(),
		Live:   router.LiveConfig{Policy: pol, Heartbeat: 50 * time.Millisecond, HeartbeatTimeout: 2 * time.Second, Disagg: dis},
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
	env := newPeerEnv(t)
	nodes := map[string]*peerNode{}
	for _, n := range []struct{ name, role string }{{"p1", cluster.RolePrefill}, {"p2", cluster.RolePrefill}, {"d1", cluster.RoleDecode}, {"d2", cluster.RoleDecode}} {
		nodes[n.name] = env.start(n.name, path, worker.Config{Routers: []string{srv.ORPCAddr}, Token: srv.Token.String(),
			StateDir: t.TempDir(), Card: cluster.ModelCard{Role: n.role}})
	}
	waitFor(t, "workers to register", func() bool { return len(srv.Live.Workers()) == 4 })
	agg := env.start("agg", path, worker.Config{})
	dc := direct(t, &node{eng: agg.eng, m: agg.m})
	rc := client(srv.URL())

	long := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 4)
	want, _ := complete(t, dc, long, 24)
	got, wk := complete(t, rc, long, 24)
	if got.Choices[0].Text != want.Choices[0].Text || got.Usage.CompletionTokens != want.Usage.CompletionTokens ||
		got.Usage.PromptTokens != want.Usage.PromptTokens {
		t.Errorf("disaggregated %q (%+v), aggregated %q (%+v)", got.Choices[0].Text, got.Usage, want.Choices[0].Text, want.Usage)
	}
	if parts := strings.Split(wk, ","); len(parts) != 2 || parts[0][0] != 'p' || parts[1][0] != 'd' {
		t.Errorf("X-Tandem-Worker %q: want a prefill then a decode worker", wk)
	}
	if n := scrape(t, srv.URL(), "tandem_router:prefills_total", `where="remote"`, `reason="uncached_above_threshold"`); n != 1 {
		t.Errorf("remote prefills %v, want 1", n)
	}

	short := "The cat sat"
	want2, _ := complete(t, dc, short, 16)
	got2, wk2 := complete(t, rc, short, 16)
	if got2.Choices[0].Text != want2.Choices[0].Text {
		t.Errorf("short prompt: %q, want %q", got2.Choices[0].Text, want2.Choices[0].Text)
	}
	if wk2 != "d1" && wk2 != "d2" {
		t.Errorf("short prompt served by %q, want a decode worker alone", wk2)
	}
	if n := scrape(t, srv.URL(), "tandem_router:prefills_total", `where="local"`, `reason="uncached_below_threshold"`); n != 1 {
		t.Errorf("local prefills %v, want 1", n)
	}
	if n := scrape(t, srv.URL(), "tandem_router:time_to_first_token_seconds_count", `pool="prefill"`); n != 1 {
		t.Errorf("TTFT samples of the prefill pool: %v", n)
	}
	for _, n := range nodes {
		n.idle(t)
	}
}
