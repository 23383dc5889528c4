package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"tandem/web"
)

// chromium finds a Chromium (or Chrome) binary, or returns "".
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// The live dashboards in real headless Chromium, against a real router and three sim
// engines (a prefill, a decode and a both worker) under `tandem bench` load, all behind
// --api-key: the pages ask for the key once and show every panel with data; each figure
// they show agrees with what /metrics serves within a refresh (while the load runs, the
// counters' figures lie between two scrapes around a snapshot; once it is over, every
// figure equals the same expression evaluated on /metrics, windowed ones from a scrape
// taken when the page opened); a worker killed mid-test turns unhealthy, then gone, on
// the router's page; and nothing is written to the browser's console. Screenshots go to
// the test's temporary directory (and to $TANDEM_DASHBOARD_SCREENSHOTS if set).
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs five processes and a browser")
	}
	chrome := chromium()
	if chrome == "" {
		t.Skip("no Chromium on PATH (chromium, chromium-browser or google-chrome): the dashboard's browser test needs it; .ci/run installs Debian's chromium")
	}
	const key = "dashboard-key"
	rp := startProc(t, "tandem-router", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(),
		"--join-token", e2eToken, "--api-key", key, "--heartbeat", "100ms", "--heartbeat-timeout", "6s", "--queue-timeout", "5s",
		"--disagg-min-tokens", "48", "--sla-ttft", "300ms", "--sla-itl", "40ms")
	r := &e2eRouter{proc: rp, url: rp.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1], orpc: rp.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]}
	engines, urls := map[string]*proc{}, map[string]string{}
	for _, role := range []string{"prefill", "decode", "both"} {
		e := startProc(t, role, "tandem", "serve", "--backend", "sim", "--role", role, "--served-model-name", "stories", "--node-name", role,
			"--port", "0", "--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--api-key", key, "--sla-ttft", "300ms", "--sla-itl", "40ms")
		urls[role] = e.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
		engines[role] = e
		r.wait(t, fmt.Sprintf(`worker joined.*worker=%s `, role), 60*time.Second)
	}

	// The browser, one window per page.
	shots := t.TempDir()
	alloc, stopAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true))...)
	defer stopAlloc()
	browser, stopBrowser := chromedp.NewContext(alloc)
	defer stopBrowser()
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("starting %s: %v", chrome, err)
	}
	var consoleMu sync.Mutex
	var console []string
	open := func(name, url, metricsURL string) *dashPage {
		tab, _ := chromedp.NewContext(browser)
		if err := chromedp.Listen(tab, func(ev any) {
			var msg string
			switch ev := ev.(type) {
			case *runtime.EventConsoleAPICalled:
				if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert || ev.Type == runtime.ConsoleAPICalledTypeWarning {
					msg = fmt.Sprintf("console.%s %v", ev.Type, ev.Args)
				}
			case *runtime.EventExceptionThrown:
				msg = fmt.Sprintf("exception: %s %v", ev.ExceptionDetails.Text, ev.ExceptionDetails.Exception)
			case *log.EventEntryAdded:
				if ev.Entry.Level == log.EntryLevelError || ev.Entry.Level == log.EntryLevelWarning {
					msg = fmt.Sprintf("%s %s: %s %s", ev.Entry.Source, ev.Entry.Level, ev.Entry.Text, ev.Entry.URL)
				}
			}
			if msg != "" {
				consoleMu.Lock()
				console = append(console, name+": "+msg)
				consoleMu.Unlock()
			}
		}); err != nil {
			t.Fatal(err)
		}
		p := &dashPage{t: t, name: name, tab: tab, metricsURL: metricsURL, shots: shots}
		p.do(chromedp.Navigate(url+"/dashboard/?window=all"), chromedp.WaitVisible(chromedp.ID("key")),
			chromedp.SendKeys(chromedp.ID("key"), key), chromedp.Click(chromedp.CSS("#keyform button")))
		p.waitSnapshots(3)
		return p
	}
	rpage := open("router", r.url, r.url)
	epage := open("decode engine", urls["decode"], urls["decode"])
	// The windowed figures start from the page's first snapshot; nothing has run since.
	rpage.base, _ = scrape(t, r.url, key)
	epage.base, _ = scrape(t, urls["decode"], key)

	bench := startProc(t, "bench", "tandem", "bench", "--base-url", r.url, "--api-key", key, "--model", "stories", "--workload", "random",
		"--num-prompts", "150", "--random-prefix-len", "32", "--random-input-len", "48", "--random-range-ratio", "0.7", "--random-output-len", "24", "--request-rate", "12",
		"--seed", "7", "--warmups", "0")

	// While the load runs, the counters' figures lie between two scrapes around a snapshot.
	deadline := time.Now().Add(90 * time.Second)
	firstTokens, _ := web.ParseExpr("sum:tandem_router:time_to_first_token_seconds_count")
	for {
		if fams, _ := scrape(t, r.url, key); firstTokens.Eval(fams, nil, 0) >= 30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bench made no progress:\n%s", bench.text())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range []*dashPage{rpage, epage} {
		p.checkDuringLoad(key)
	}

	// Kill the both worker mid-load: its row turns unhealthy, then gone.
	if err := engines["both"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	rpage.waitHealth("both", "unhealthy", 10*time.Second)
	rpage.screenshot("dashboard-router-unhealthy.png")
	rpage.waitHealth("both", "gone", 20*time.Second)

	select {
	case <-bench.exited:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the bench did not finish:\n%s", bench.text())
	}

	for _, p := range []*dashPage{rpage, epage} {
		p.checkQuiet(key)
	}
	for _, p := range []*dashPage{rpage, epage} {
		cost, _ := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.body.dataset.handleMs + ' ms per snapshot, ' + document.body.dataset.drawMs + ' ms per drawing'`))
		t.Logf("%s page: %s", p.name, cost)
	}
	rpage.screenshot("dashboard-router.png")
	epage.screenshot("dashboard-engine.png")
	consoleMu.Lock()
	defer consoleMu.Unlock()
	for _, m := range console {
		t.Errorf("browser console: %s", m)
	}
}

// scrape reads url's /metrics with the API key, and the time it was read by.
func scrape(t *testing.T, url, key string) (web.Families, time.Time) {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s/metrics: %s", url, res.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return web.Families(fams), time.Now()
}

// dashPage is one dashboard open in a tab.
type dashPage struct {
	t          *testing.T
	name       string
	tab        context.Context
	metricsURL string
	base       web.Families // /metrics when the page opened
	shots      string
}

func (p *dashPage) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.t.Fatalf("%s page: %v", p.name, err)
	}
}

// pageState is what the page shows: its snapshots, and per panel its charts' drawn
// points and its figures (data-expr, data-value, and the worker row a figure is in).
type pageState struct {
	Snapshots int
	Last      int64
	Status    string
	Panels    []struct {
		ID     string
		Points []int
		Max    []string
		Cells  []struct{ Expr, Value, Worker, Health string }
	}
	Workers map[string]string // worker → health
}

const readPage = `(() => ({
  snapshots: Number(document.body.dataset.snapshots || 0),
  last: Number(document.body.dataset.last || 0),
  status: (document.body.dataset.status || '') + ': ' + document.getElementById('status').textContent,
  panels: [...document.querySelectorAll('[data-panel]')].map((p) => ({
    id: p.dataset.panel,
    points: [...p.querySelectorAll('canvas')].map((c) => Number(c.dataset.points || 0)),
    max: [...p.querySelectorAll('canvas')].map((c) => c.dataset.max || ''),
    cells: [...p.querySelectorAll('td[data-expr]')].map((td) => {
      const tr = td.closest('tr');
      return { expr: td.dataset.expr, value: td.dataset.value || '', worker: tr.dataset.worker || '', health: tr.dataset.health || '' };
    }),
  })),
  workers: Object.fromEntries([...document.querySelectorAll('tr[data-worker]')].map((tr) => [tr.dataset.worker, tr.dataset.health || ''])),
}))()`

func (p *dashPage) read() pageState {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 30*time.Second)
	defer cancel()
	st, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage))
	if err != nil {
		p.t.Fatalf("%s page: %v", p.name, err)
	}
	return st
}

// waitSnapshots waits for n snapshots more than the page has now.
func (p *dashPage) waitSnapshots(n int) pageState {
	p.t.Helper()
	start := p.read().Snapshots
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := p.read()
		if st.Snapshots >= start+n {
			return st
		}
		if time.Now().After(deadline) {
			p.screenshot("stuck-" + strings.ReplaceAll(p.name, " ", "-") + ".png")
			p.t.Fatalf("%s page: %d snapshots in 30 s (status %q)", p.name, st.Snapshots-start, st.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// after waits for a snapshot the page received after at (its time is the server's
// clock, the machine's).
func (p *dashPage) after(at time.Time) pageState {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := p.read()
		if st.Last > at.UnixMilli() {
			return st
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s page: no snapshot after %v (last %v)", p.name, at, time.UnixMilli(st.Last))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *dashPage) waitHealth(worker, health string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := p.read()
		if st.Workers[worker] == health {
			return
		}
		if time.Now().After(deadline) {
			p.screenshot("health-" + worker + ".png")
			p.t.Fatalf("%s page: worker %s is %q after %v, want %q (rows %v)", p.name, worker, st.Workers[worker], d, health, st.Workers)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *dashPage) screenshot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Errorf("%s page: screenshot: %v", p.name, err)
		return
	}
	for _, dir := range []string{p.shots, os.Getenv("TANDEM_DASHBOARD_SCREENSHOTS")} {
		if dir == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			p.t.Errorf("screenshot: %v", err)
		}
	}
	p.t.Logf("%s page: screenshot %s", p.name, filepath.Join(p.shots, name))
}

// monotonic reports whether every series e reads only grows: counters, histograms'
// counts and sums (of non-negative observations).
func monotonic(e *web.Expr, fams web.Families) bool {
	for _, s := range append(slices.Clone(e.Sels), e.Den...) {
		mf := fams[s.Name]
		if mf == nil {
			for _, suffix := range []string{"_count", "_sum"} {
				if b, ok := strings.CutSuffix(s.Name, suffix); ok {
					mf = fams[b]
				}
			}
		}
		if mf == nil || (mf.GetType() != dto.MetricType_COUNTER && mf.GetType() != dto.MetricType_HISTOGRAM) {
			return false
		}
	}
	return true
}

func parseValue(s string) float64 {
	if s == "" {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// checkDuringLoad holds the page's counter figures between two scrapes around one of its
// snapshots.
func (p *dashPage) checkDuringLoad(key string) {
	p.t.Helper()
	before, at := scrape(p.t, p.metricsURL, key)
	st := p.after(at)
	after, _ := scrape(p.t, p.metricsURL, key)
	n := 0
	for _, panel := range st.Panels {
		for _, c := range panel.Cells {
			e, err := web.ParseExpr(c.Expr)
			if err != nil {
				p.t.Errorf("%s page: %s: %v", p.name, panel.ID, err)
				continue
			}
			if e.Op != "sum" || !monotonic(e, after) || c.Worker != "" && c.Health == "gone" {
				continue
			}
			lo, hi, got := e.Eval(before, nil, 0), e.Eval(after, nil, 0), parseValue(c.Value)
			if math.IsNaN(lo) {
				lo = 0
			}
			n++
			if !(got >= lo-1e-9 && got <= hi+1e-9) && !(math.IsNaN(got) && math.IsNaN(hi)) {
				p.t.Errorf("%s page: %s %s = %v, not between the scrapes around its snapshot: %v and %v", p.name, panel.ID, c.Expr, got, lo, hi)
			}
		}
	}
	if n < 5 {
		p.t.Errorf("%s page: %d counter figures checked during the load", p.name, n)
	}
}

// checkQuiet, once the load is over and /metrics holds still, wants every figure to be
// the expression evaluated on /metrics (windowed ones since the page opened), every panel
// to show some, and every chart to have drawn a rise.
func (p *dashPage) checkQuiet(key string) {
	p.t.Helper()
	var now web.Families
	var st pageState
	for try := 0; ; try++ {
		a, _ := scrape(p.t, p.metricsURL, key)
		time.Sleep(time.Second)
		b, at := scrape(p.t, p.metricsURL, key)
		st = p.after(at)
		c, _ := scrape(p.t, p.metricsURL, key)
		if p.same(st, a, b) && p.same(st, b, c) {
			now = b
			break
		}
		if try == 30 {
			p.t.Fatalf("%s: /metrics did not hold still for a second in 30 tries", p.name)
		}
	}
	workers := map[string]bool{}
	for _, panel := range st.Panels {
		shown := 0
		for _, c := range panel.Cells {
			if c.Health == "gone" && !strings.Contains(c.Expr, "worker_migrations_total") {
				continue // the page remembers a worker the router forgot: /metrics has no figure for it
			}
			if c.Worker != "" && c.Health != "gone" {
				workers[c.Worker] = true
			}
			e, err := web.ParseExpr(c.Expr)
			if err != nil {
				p.t.Errorf("%s page: %s: %v", p.name, panel.ID, err)
				continue
			}
			got := parseValue(c.Value)
			if !math.IsNaN(got) {
				shown++
			}
			if e.Op == "rate" || slices.ContainsFunc(e.Metrics(), func(n string) bool { return strings.HasPrefix(n, "process_") }) {
				continue // rates depend on when the page's window began; the process's figures move on their own
			}
			want := e.Eval(now, p.base, 0)
			if !(math.IsNaN(got) && math.IsNaN(want) || math.Abs(got-want) <= 1e-9*max(1, math.Abs(want))) {
				p.t.Errorf("%s page: %s %s = %v, /metrics gives %v", p.name, panel.ID, c.Expr, got, want)
			}
		}
		if shown == 0 {
			p.t.Errorf("%s page: panel %s shows no figure", p.name, panel.ID)
		}
		for i, pts := range panel.Points {
			if pts == 0 || !(parseValue(panel.Max[i]) > 0) {
				p.t.Errorf("%s page: panel %s: chart %d drew %d points, highest %q", p.name, panel.ID, i, pts, panel.Max[i])
			}
		}
	}
	if mf := now["tandem_router:worker_info"]; mf != nil {
		var names []string
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "worker" {
					names = append(names, lp.GetValue())
				}
			}
		}
		for _, n := range names {
			if !workers[n] {
				p.t.Errorf("%s page: worker %s of /metrics has no row (rows %v)", p.name, n, st.Workers)
			}
		}
		if len(workers) != len(names) {
			p.t.Errorf("%s page: rows for %v, /metrics has %v", p.name, st.Workers, names)
		}
	}
}

// same reports whether every figure of the page evaluates alike on a and b.
func (p *dashPage) same(st pageState, a, b web.Families) bool {
	for _, panel := range st.Panels {
		for _, c := range panel.Cells {
			e, err := web.ParseExpr(c.Expr)
			if err != nil || e.Op == "rate" || slices.ContainsFunc(e.Metrics(), func(n string) bool { return strings.HasPrefix(n, "process_") }) {
				continue
			}
			x, y := e.Eval(a, p.base, 0), e.Eval(b, p.base, 0)
			if x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
				return false
			}
		}
	}
	return true
}
