package web

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"tandem/httpserve"
	"tandem/metrics"
	"tandem/sla"
)

// A snapshot carries the kind's own families as /metrics has them: label names and values,
// counters, gauges, and histograms with their bounds and cumulative bucket counts; other
// namespaces and the Go collector's families stay out.
func TestBuild(t *testing.T) {
	reg := metrics.NewRegistry()
	eng := metrics.NewEngine(reg, "stories")
	rt := metrics.NewRouter(reg)
	eng.Running.Set(3)
	eng.PromptTokens.Add(7)
	eng.TTFT.Observe(0.003) // ≤ 0.005
	eng.TTFT.Observe(0.3)   // ≤ 0.5
	eng.RequestSuccess.WithLabelValues("stop").Inc()
	rt.Decisions.WithLabelValues("kv").Add(2)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_123)
	s := Build(Engine, "stories", sla.Default, 250*time.Millisecond, fams, now)
	if s.Time != now.UnixMilli() || s.Kind != Engine || s.SLA != (SLA{TTFT: 0.5, ITL: 0.05}) || s.Period != 0.25 {
		t.Errorf("header %+v", s)
	}
	for name := range s.Metrics {
		if !strings.HasPrefix(name, "tandem:") && !strings.HasPrefix(name, "process_") {
			t.Errorf("engine snapshot carries %s", name)
		}
	}
	if _, ok := s.Metrics["process_resident_memory_bytes"]; !ok {
		t.Error("no process_resident_memory_bytes")
	}
	run := s.Metrics["tandem:num_requests_running"]
	if run == nil || run.Type != "gauge" || len(run.Labels) != 1 || run.Labels[0] != "model_name" || run.Series[0].Labels[0] != "stories" || run.Series[0].Value != 3 {
		t.Errorf("running: %+v", run)
	}
	if c := s.Metrics["tandem:prompt_tokens_total"]; c == nil || c.Type != "counter" || c.Series[0].Value != 7 {
		t.Errorf("prompt tokens: %+v", c)
	}
	ok := s.Metrics["tandem:request_success_total"]
	if ok == nil || strings.Join(ok.Labels, ",") != "finished_reason,model_name" || strings.Join(ok.Series[0].Labels, ",") != "stop,stories" {
		t.Errorf("request_success_total: %+v", ok)
	}
	h := s.Metrics["tandem:time_to_first_token_seconds"]
	if h == nil || h.Type != "histogram" || len(h.Bounds) != 22 || h.Bounds[1] != 0.005 {
		t.Fatalf("ttft: %+v", h)
	}
	hs := h.Series[0]
	if hs.Value != 2 || math.Abs(float64(hs.Sum)-0.303) > 1e-12 || hs.Buckets[0] != 0 || hs.Buckets[1] != 1 || hs.Buckets[8] != 1 || hs.Buckets[9] != 2 || hs.Buckets[21] != 2 {
		t.Errorf("ttft series: %+v", hs)
	}

	r := Build(Router, "r", sla.Default, time.Second, fams, now)
	for name := range r.Metrics {
		if !strings.HasPrefix(name, "tandem_router:") && !strings.HasPrefix(name, "process_") {
			t.Errorf("router snapshot carries %s", name)
		}
	}
	if d := r.Metrics["tandem_router:routing_decisions_total"]; d == nil || d.Series[0].Value != 2 {
		t.Errorf("decisions: %+v", d)
	}
}

// JSON has no NaN or Inf: such a value is written null, and read back as NaN.
func TestNumberJSON(t *testing.T) {
	for _, tc := range []struct {
		in   Number
		want string
	}{{1.5, "1.5"}, {0, "0"}, {1e21, "1e+21"}, {Number(math.NaN()), "null"}, {Number(math.Inf(1)), "null"}, {Number(math.Inf(-1)), "null"}} {
		b, err := json.Marshal(tc.in)
		if err != nil || string(b) != tc.want {
			t.Errorf("%v: %s, %v; want %s", tc.in, b, err, tc.want)
		}
	}
	var n Number
	if err := json.Unmarshal([]byte("null"), &n); err != nil || !math.IsNaN(float64(n)) {
		t.Errorf("null read as %v, %v", n, err)
	}
}

func newDashboard(t *testing.T, cfg Config) (*Dashboard, *prometheus.Registry) {
	t.Helper()
	reg := metrics.NewRegistry()
	metrics.NewEngine(reg, "stories")
	cfg.Source, cfg.Registerer = reg, reg
	if cfg.Kind == "" {
		cfg.Kind = Engine
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, reg
}

// The dashboard answers its own paths (GET only), hands the rest to the API, and keeps its
// data behind the API key while its page and scripts, which hold none, need no key.
func TestHandler(t *testing.T) {
	d, reg := newDashboard(t, Config{APIKey: "sekret"})
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "api") })
	srv := httptest.NewServer(d.Wrap(api))
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		method, path, key string
		status            int
		ctype, body       string
	}{
		{"GET", "/dashboard", "", http.StatusMovedPermanently, "", ""},
		{"GET", "/dashboard/", "", http.StatusOK, "text/html", "<script src=\"app.js\""},
		{"GET", "/dashboard/app.js", "", http.StatusOK, "text/javascript", "histogram_quantile"},
		{"GET", "/dashboard/style.css", "", http.StatusOK, "text/css", "section.panel"},
		{"GET", "/dashboard/config.json", "", http.StatusOK, "application/json", `{"key_required":true,"kind":"engine"}`},
		{"GET", "/dashboard/nothing", "", http.StatusNotFound, "", ""},
		{"POST", "/dashboard/events", "sekret", http.StatusMethodNotAllowed, "application/json", `"code":"method_not_allowed"`},
		{"GET", "/dashboard/events", "", http.StatusUnauthorized, "application/json", `"code":"invalid_api_key"`},
		{"GET", "/dashboard/events", "wrong", http.StatusUnauthorized, "application/json", `"code":"invalid_api_key"`},
		{"HEAD", "/dashboard/events", "sekret", http.StatusOK, "text/event-stream", ""},
		{"GET", "/dashboardish", "", http.StatusOK, "", "api"},
		{"GET", "/v1/models", "", http.StatusOK, "", "api"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		res, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status || !strings.HasPrefix(res.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(body), tc.body) {
			t.Errorf("%s %s: %d %q %.200q; want %d %q containing %q", tc.method, tc.path, res.StatusCode, res.Header.Get("Content-Type"), body, tc.status, tc.ctype, tc.body)
		}
		if tc.path == "/dashboard" && res.Header.Get("Location") != "/dashboard/" {
			t.Errorf("redirect to %q", res.Header.Get("Location"))
		}
		if tc.path == "/dashboard/" && !strings.Contains(res.Header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("page CSP %q", res.Header.Get("Content-Security-Policy"))
		}
	}
	fam := mustFamily(t, reg, "tandem:dashboard_streams_refused_total")
	if got := fam.GetMetric()[0].GetCounter().GetValue(); got != 2 {
		t.Errorf("%v unauthorized refusals counted, want 2", got)
	}
	for target, want := range map[string]float64{"ttft": 0.5, "itl": 0.05} {
		if got := testutil.ToFloat64(d.met.SLATarget.WithLabelValues(target)); got != want {
			t.Errorf("SLA target %s = %v, want %v", target, got, want)
		}
	}

	// With the key, snapshots follow one another.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events := openStream(t, ctx, srv.URL, "sekret")
	var last int64
	for range 3 {
		ev, data := events.next(t)
		if ev != "snapshot" {
			t.Fatalf("event %q %s", ev, data)
		}
		var s Snapshot
		if err := json.Unmarshal([]byte(data), &s); err != nil {
			t.Fatal(err)
		}
		if s.Kind != Engine || s.Metrics["tandem:num_requests_running"] == nil || s.Metrics["tandem:dashboard_streams"].Series[0].Value != 1 || s.Time < last {
			t.Errorf("snapshot: kind %q, time %d after %d, %d families", s.Kind, s.Time, last, len(s.Metrics))
		}
		last = s.Time
	}
}

func mustFamily(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	t.Fatalf("no family %s", name)
	return nil
}

type sseReader struct {
	res *http.Response
	sc  *bufio.Scanner
}

func openStream(t *testing.T, ctx context.Context, url, key string) *sseReader {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+EventsPath, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %s %q", res.Status, res.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 16<<20)
	return &sseReader{res: res, sc: sc}
}

// next returns the next event's type and data, or "" at the end of the stream.
func (r *sseReader) next(t *testing.T) (event, data string) {
	t.Helper()
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "" && event != "":
			return event, data
		case strings.HasPrefix(line, "event: "):
			event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data += line[6:]
		}
	}
	return "", ""
}

// Streams past MaxStreams are refused (503, counted) until one closes.
func TestTooManyStreams(t *testing.T) {
	d, reg := newDashboard(t, Config{MaxStreams: 1})
	srv := httptest.NewServer(d.Wrap(http.NotFoundHandler()))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, stop := context.WithCancel(ctx)
	s := openStream(t, first, srv.URL, "")
	if ev, _ := s.next(t); ev != "snapshot" {
		t.Fatalf("first stream: %q", ev)
	}
	res, err := http.Get(srv.URL + EventsPath)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "too_many_streams") || res.Header.Get("Retry-After") == "" {
		t.Errorf("second stream: %s %s", res.Status, body)
	}
	if got := testutil.ToFloat64(d.met.Refused.WithLabelValues("too_many")); got != 1 {
		t.Errorf("%v too_many refusals counted", got)
	}
	stop()
	s.res.Body.Close()
	for i := 0; ; i++ { // the first stream's handler notices its client left within a period
		res, err := http.Get(srv.URL + EventsPath)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			break
		}
		if i == 200 {
			t.Fatalf("no stream accepted after the first closed: %s", res.Status)
		}
		time.Sleep(25 * time.Millisecond)
	}
	if got := mustFamily(t, reg, "tandem:dashboard_streams").GetMetric()[0].GetGauge().GetValue(); got > 1 {
		t.Errorf("%v streams open", got)
	}
}

// An open dashboard does not hold the server's drain: its stream ends with an "end" event
// once the server drains, and Shutdown returns well before its deadline.
func TestDrainEndsStreams(t *testing.T) {
	d, _ := newDashboard(t, Config{})
	hs, err := httpserve.New(httpserve.Config{Addr: "127.0.0.1:0", Handler: d.Wrap(http.NotFoundHandler()),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	d.StopWhen(hs.Draining)
	if err := hs.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := openStream(t, ctx, hs.URL(), "")
	if ev, _ := s.next(t); ev != "snapshot" {
		t.Fatalf("first event %q", ev)
	}
	done := make(chan error, 1)
	go func() { done <- hs.Shutdown(ctx) }()
	for {
		ev, data := s.next(t)
		if ev == "end" {
			if !strings.Contains(data, "shutting down") {
				t.Errorf("end event %s", data)
			}
			break
		}
		if ev == "" {
			t.Fatal("the stream ended without an end event")
		}
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v (the open dashboard held the drain)", err)
	}
}

func TestNewRefuses(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Kind: "planner", Source: reg}, `kind "planner"`},
		{Config{Kind: Engine}, "metrics source"},
		{Config{Kind: Router, Source: reg, SLA: sla.Targets{TTFT: -time.Second}}, "--sla-ttft"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
