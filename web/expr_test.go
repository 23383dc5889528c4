package web

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/metrics"
)

func TestParseExpr(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // Op, Q, selectors
		err  string
	}{
		{in: "sum:a", want: "sum 0 [{a []}] []"},
		{in: `sum:a:b{x="1",y="2"}+c_count`, want: "sum 0 [{a:b [[x 1] [y 2]]} {c_count []}] []"},
		{in: `quantile:0.9:h{pool="de\"c"}`, want: `quantile 0.9 [{h [[pool de"c]]}] []`},
		{in: `ratio:a+b/c`, want: "ratio 0 [{a []} {b []}] [{c []}]"},
		{in: `rate:a{w="x+y/z"}`, want: "rate 0 [{a [[w x+y/z]]}] []"},
		{in: "median:a", err: "want one of"},
		{in: "sum", err: "want one of"},
		{in: "quantile:2:a", err: "quantile needs"},
		{in: "quantile:0.5:a+b", err: "one selector"},
		{in: "ratio:a", err: "SELS/SELS"},
		{in: "sum:9a", err: "bad metric name"},
		{in: `sum:a{x=1}`, err: "bad matcher"},
		{in: `sum:a{x="1"`, err: "no closing brace"},
	} {
		e, err := ParseExpr(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if got := strings.Join([]string{e.Op, ftoa(e.Q), sels(e.Sels), sels(e.Den)}, " "); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.in, got, tc.want)
		}
	}
}

func ftoa(f float64) string { b, _ := json.Marshal(f); return string(b) }

func sels(ss []Selector) string {
	var b strings.Builder
	b.WriteString("[")
	for i, s := range ss {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString("{" + s.Name + " [")
		for j, m := range s.Matchers {
			if j > 0 {
				b.WriteString(" ")
			}
			b.WriteString("[" + m[0] + " " + m[1] + "]")
		}
		b.WriteString("]}")
	}
	return b.String() + "]"
}

// Quantile is histogram_quantile's interpolation: values worked out by hand.
func TestQuantile(t *testing.T) {
	bounds := []float64{0.1, 0.5, 1}
	for _, tc := range []struct {
		q    float64
		cum  []float64
		want float64
	}{
		{0.5, []float64{10, 20, 20, 20}, 0.1},       // rank 10: the end of the first bucket
		{0.75, []float64{10, 20, 20, 20}, 0.3},      // rank 15: halfway through (0.1, 0.5]
		{0.25, []float64{10, 20, 20, 20}, 0.05},     // rank 5: halfway through (0, 0.1]
		{0.99, []float64{0, 0, 10, 11}, 1},          // in +Inf: the highest finite bound
		{0.5, []float64{0, 0, 0, 0}, math.NaN()},    // no observations
		{0.5, nil, math.NaN()},                      //
		{0.9, []float64{0, 4, 4, 4}, 0.1 + 0.4*0.9}, // rank 3.6 of 4 in (0.1, 0.5]
	} {
		got := Quantile(tc.q, bounds, tc.cum)
		if !(got == tc.want || math.IsNaN(got) && math.IsNaN(tc.want) || math.Abs(got-tc.want) < 1e-12) {
			t.Errorf("q %v of %v: %v, want %v", tc.q, tc.cum, got, tc.want)
		}
	}
	if got := Quantile(0.5, []float64{0, 1, 2}, []float64{7, 8, 9, 9}); got != 0 {
		t.Errorf("a quantile in a bucket bounded by 0: %v", got)
	}
}

// Eval on gathered families: sums with label matchers and histogram parts, the instant
// aggregations, the role join through worker_info, and windowed rate, ratio and quantile
// against a base.
func TestEval(t *testing.T) {
	gather := func(f func(r *metrics.Router, d *metrics.Disagg, reg *prometheus.Registry)) Families {
		reg := prometheus.NewRegistry()
		r, d := metrics.NewRouter(reg), metrics.NewDisagg(reg)
		f(r, d, reg)
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := Families{}
		for _, mf := range fams {
			out[mf.GetName()] = mf
		}
		return out
	}
	load := func(reg *prometheus.Registry, vals map[[2]string]float64, roles map[string]string) {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tandem_router:worker_load"}, []string{"worker", "model", "quantity"})
		info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tandem_router:worker_info"}, []string{"worker", "model", "role"})
		reg.MustRegister(g, info)
		for k, v := range vals {
			g.WithLabelValues(k[0], "m", k[1]).Set(v)
		}
		for w, r := range roles {
			info.WithLabelValues(w, "m", r).Set(1)
		}
	}
	base := gather(func(r *metrics.Router, d *metrics.Disagg, reg *prometheus.Registry) {
		r.PromptBlocks.Add(10)
		r.PredictedHitBlocks.Add(5)
		d.TTFT.WithLabelValues("decode").Observe(0.003)
	})
	now := gather(func(r *metrics.Router, d *metrics.Disagg, reg *prometheus.Registry) {
		r.PromptBlocks.Add(30)
		r.PredictedHitBlocks.Add(5 + 15)
		r.Decisions.WithLabelValues("kv").Add(4)
		r.Decisions.WithLabelValues("affinity").Add(2)
		d.TTFT.WithLabelValues("decode").Observe(0.003)
		for range 3 {
			d.TTFT.WithLabelValues("decode").Observe(0.3)
		}
		d.TTFT.WithLabelValues("both").Observe(0.05)
		load(reg, map[[2]string]float64{{"a", "running"}: 2, {"b", "running"}: 3, {"c", "running"}: 5, {"a", "kv_usage"}: 0.25, {"b", "kv_usage"}: 0.75},
			map[string]string{"a": "decode", "b": "decode", "c": "prefill"})
	})
	for _, tc := range []struct {
		expr string
		want float64
	}{
		{"sum:tandem_router:prompt_blocks_total", 30},
		{"sum:tandem_router:routing_decisions_total", 6},
		{`sum:tandem_router:routing_decisions_total{reason="kv"}+tandem_router:prompt_blocks_total`, 34},
		{`sum:tandem_router:routing_decisions_total{reason="none"}`, math.NaN()},
		{`sum:tandem_router:remote_prefill_fallbacks_total`, math.NaN()},
		{`sum:tandem_router:time_to_first_token_seconds_count{pool="decode"}`, 4},
		{`sum:tandem_router:time_to_first_token_seconds_sum{pool="both"}`, 0.05},
		{`count:tandem_router:worker_info`, 3},
		{`max:tandem_router:worker_load{quantity="kv_usage"}`, 0.75},
		{`avg:tandem_router:worker_load{quantity="kv_usage"}`, 0.5},
		{`sum:tandem_router:worker_load{quantity="running",role="decode"}`, 5},
		{`sum:tandem_router:worker_load{quantity="running",role="prefill"}`, 5},
		{`sum:tandem_router:worker_load{quantity="running",role="both"}`, math.NaN()},
		{`rate:tandem_router:prompt_blocks_total`, 20.0 / 4},
		{`rate:tandem_router:routing_decisions_total{reason="kv"}`, 1}, // not in base: started since
		{`ratio:tandem_router:predicted_hit_blocks_total/tandem_router:prompt_blocks_total`, 15.0 / 20},
		{`ratio:tandem_router:prompt_blocks_total/tandem_router:remote_prefill_fallbacks_total`, math.NaN()},
		// In the window: three observations in (0.25, 0.5]; the median is halfway, rank 1.5.
		{`quantile:0.5:tandem_router:time_to_first_token_seconds{pool="decode"}`, 0.25 + 0.25*0.5},
		{`quantile:0.5:tandem_router:time_to_first_token_seconds{pool="prefill"}`, math.NaN()},
	} {
		e, err := ParseExpr(tc.expr)
		if err != nil {
			t.Fatal(err)
		}
		got := e.Eval(now, base, 4)
		if !(got == tc.want || math.IsNaN(got) && math.IsNaN(tc.want) || math.Abs(got-tc.want) < 1e-12) {
			t.Errorf("%s: %v, want %v", tc.expr, got, tc.want)
		}
	}
}

// Every figure of panels.json parses, and reads only metrics the binaries export.
func TestPanels(t *testing.T) {
	names := exportedNames(t)
	data, err := os.ReadFile("assets/panels.json")
	if err != nil {
		t.Fatal(err)
	}
	var all map[string][]struct {
		ID, Title string
		Chart     *struct {
			Unit    string
			Series  []struct{ Label, Expr string }
			Dynamic *struct {
				Family, Label string
				Series        struct{ Label, Expr string }
			}
		}
		Readings, Extra *struct {
			Rows    []struct{ Cells []struct{ Expr string } }
			Dynamic *struct {
				Family, Label string
				Row           struct{ Cells []struct{ Expr string } }
			}
		}
	}
	if err := json.Unmarshal(data, &all); err != nil {
		t.Fatal(err)
	}
	if len(all[string(Engine)]) < 8 || len(all[string(Router)]) < 8 {
		t.Fatalf("panels: %d engine, %d router", len(all[string(Engine)]), len(all[string(Router)]))
	}
	for kind, panels := range all {
		check := func(where, expr string) {
			expr = strings.ReplaceAll(expr, "{value}", `a \"value\"`)
			e, err := ParseExpr(expr)
			if err != nil {
				t.Errorf("%s %s: %v", kind, where, err)
				return
			}
			for _, n := range e.Metrics() {
				if !names[n] {
					t.Errorf("%s %s: %s reads %s, which no binary exports", kind, where, expr, n)
				}
			}
		}
		for _, p := range panels {
			if p.Chart == nil || p.Chart.Unit == "" || p.Readings == nil {
				t.Errorf("%s %s: a panel needs a chart with a unit and readings", kind, p.ID)
				continue
			}
			for _, s := range p.Chart.Series {
				check(p.ID+" chart", s.Expr)
			}
			if d := p.Chart.Dynamic; d != nil {
				check(p.ID+" chart", "sum:"+d.Family)
				check(p.ID+" chart", d.Series.Expr)
			}
			for _, r := range []*struct {
				Rows    []struct{ Cells []struct{ Expr string } }
				Dynamic *struct {
					Family, Label string
					Row           struct{ Cells []struct{ Expr string } }
				}
			}{p.Readings, p.Extra} {
				if r == nil {
					continue
				}
				for _, row := range r.Rows {
					for _, c := range row.Cells {
						check(p.ID+" readings", c.Expr)
					}
				}
				if d := r.Dynamic; d != nil {
					check(p.ID+" readings", "sum:"+d.Family)
					for _, c := range d.Row.Cells {
						check(p.ID+" readings", c.Expr)
					}
				}
			}
		}
	}
}

func FuzzParseExpr(f *testing.F) {
	for _, s := range []string{"sum:a", `quantile:0.9:h{pool="x"}`, `ratio:a+b{c="d\"e"}/f`, "rate:", "sum:a{", `sum:a{b="\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseExpr(s)
		if err != nil {
			return
		}
		for _, n := range e.Metrics() {
			if n == "" {
				t.Errorf("%q: an empty metric name", s)
			}
		}
		e.Eval(Families{}, nil, 1) // must not panic on empty families
	})
}
