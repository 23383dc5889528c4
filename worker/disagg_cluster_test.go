package worker_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"

	"tandem/cluster"
	"tandem/internal/fixtures"
	"tandem/router"
	"tandem/router/live"
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

// startDisaggRouter starts a router with dis and one worker per role given (p* prefill,
// d* decode), and waits for them to register.
func startDisaggRouter(t *testing.T, dis router.DisaggConfig, names ...string) (*live.Server, map[string]*peerNode) {
	t.Helper()
	path := fixtures.Model(t, "stories260K-f32.gguf")
	srv := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond,
		HeartbeatTimeout: 2 * time.Second, Disagg: dis}).router
	env := newPeerEnv(t)
	nodes := map[string]*peerNode{}
	for _, name := range names {
		role := map[byte]string{'p': cluster.RolePrefill, 'd': cluster.RoleDecode}[name[0]]
		nodes[name] = env.start(name, path, worker.Config{Routers: []string{srv.ORPCAddr}, Token: srv.Token.String(),
			StateDir: t.TempDir(), Card: cluster.ModelCard{Role: role}})
	}
	waitFor(t, "workers to register", func() bool { return len(srv.Router.Workers()) == len(names) })
	return srv, nodes
}

// A prefill worker that fails its prefills: by default the decode worker prefills and the
// request succeeds; with Strict the request fails with 503.
func TestDisaggregatedPrefillFailure(t *testing.T) {
	long := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3)
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			dis := router.DefaultDisaggConfig()
			dis.MinRemoteTokens, dis.Strict = 32, strict
			srv, nodes := startDisaggRouter(t, dis, "p1", "d1")
			nodes["p1"].stopEngine()
			out, err := client(srv.URL()).Completions.New(testCtx(t), sdk.CompletionNewParams{
				Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(long)},
				Temperature: sdk.Float(0), MaxTokens: sdk.Int(8)})
			var apiErr *sdk.Error
			switch {
			case strict && (!errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable):
				t.Errorf("strict: %v, want 503", err)
			case !strict && (err != nil || out.Usage.CompletionTokens != 8):
				t.Errorf("fallback: %+v, %v", out, err)
			}
			// A fallback is counted only where one happened (scrape gives -1 for no sample).
			want := 1.0
			if strict {
				want = -1
			}
			if n := scrape(t, srv.URL(), "tandem_router:remote_prefill_fallbacks_total", `stage="prefill"`); n != want {
				t.Errorf("prefill fallbacks %v, want %v", n, want)
			}
			nodes["d1"].idle(t)
		})
	}
}

// In process: a router, two prefill and two decode workers. A long prompt is prefilled on a
// prefill worker and decoded on a decode worker, with the tokens of an engine doing both; a
// short one is prefilled where it is decoded; the decisions are in the router's metrics.
func TestDisaggregatedThroughRouter(t *testing.T) {
	dis := router.DefaultDisaggConfig()
	dis.MinRemoteTokens = 32
	srv, nodes := startDisaggRouter(t, dis, "p1", "p2", "d1", "d2")
	agg := newPeerEnv(t).start("agg", fixtures.Model(t, "stories260K-f32.gguf"), worker.Config{})
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
	// Eight long prompts at once, all prefilled remotely: every one equals the engine's own
	// answer.
	remote := scrape(t, srv.URL(), "tandem_router:prefills_total", `where="remote"`)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := fmt.Sprintf("Story %d. %s", i, long)
			want, _ := complete(t, dc, p, 12)
			got, wk := complete(t, rc, p, 12)
			if got.Choices[0].Text != want.Choices[0].Text || got.Usage.CompletionTokens != 12 {
				t.Errorf("concurrent %d via %q: %q (%+v), want %q", i, wk, got.Choices[0].Text, got.Usage, want.Choices[0].Text)
			}
		}()
	}
	wg.Wait()
	if n := scrape(t, srv.URL(), "tandem_router:prefills_total", `where="remote"`); n != remote+8 {
		t.Errorf("remote prefills %v after 8 more long prompts, was %v", n, remote)
	}
	for _, n := range nodes {
		n.idle(t)
	}
}
