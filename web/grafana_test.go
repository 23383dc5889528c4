package web

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/metrics"
)

// recorder registers collectors on a registry and keeps them, to list what they describe.
type recorder struct {
	*prometheus.Registry
	cs []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exportedNames lists every metric name the two binaries export, as /metrics writes them
// (a histogram's as name_bucket, name_sum and name_count too): what package metrics
// registers for an engine and a router on fresh registries, the router's scrape-time
// gauges, and the Go and process collectors. Vectors with no series yet count: they are
// exported as soon as something happens.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	rec := &recorder{Registry: metrics.NewRegistry()}
	metrics.NewEngine(rec, "m")
	metrics.NewKVTransfer(rec, "m")
	zero := func() float64 { return 0 }
	metrics.RegisterKVState(rec, "m", zero, zero, zero)
	metrics.NewHTTP(rec, "tandem")
	metrics.NewDashboard(rec, "tandem")
	router := metrics.NewRouter(rec)
	metrics.NewDisagg(rec)
	metrics.NewHTTP(rec, "tandem_router")
	metrics.NewDashboard(rec, "tandem_router")
	names := map[string]bool{}
	add := func(d *prometheus.Desc, histogram bool) {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names[m[1]] = true
		if histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = true
			}
		}
	}
	for _, c := range rec.cs {
		_, h1 := c.(prometheus.Histogram)
		_, h2 := c.(*prometheus.HistogramVec)
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			add(d, h1 || h2)
		}
	}
	// The router's gauges collected from its state at scrape time.
	v := reflect.ValueOf(router).Elem()
	for i := range v.NumField() {
		if d, ok := v.Field(i).Interface().(*prometheus.Desc); ok {
			add(d, false)
		}
	}
	// The Go and process collectors (registered by NewRegistry) describe themselves too.
	fams, err := rec.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	for _, n := range []string{"tandem:time_to_first_token_seconds_bucket", "tandem_router:worker_load", "tandem_router:worker_info",
		"tandem_router:remote_prefill_fallbacks_total", "process_resident_memory_bytes", "tandem:sla_target_seconds"} {
		if !names[n] {
			t.Fatalf("exportedNames misses %s", n)
		}
	}
	return names
}

// promqlNames returns the metric names a PromQL expression reads: what is left once
// strings, label matchers, range and offset brackets, label lists of by/without/on/
// ignoring/group_left/group_right, Grafana variables, numbers, function calls and
// keywords are taken out.
func promqlNames(expr string) []string {
	s := regexp.MustCompile(`"(?:[^"\\]|\\.)*"`).ReplaceAllString(expr, `""`)
	s = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\[[^\]]*\]`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`).ReplaceAllString(s, " ")
	keywords := []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}
	var out []string
	for _, m := range regexp.MustCompile(`[0-9.]*[A-Za-z_:][A-Za-z0-9_:]*\s*\(?`).FindAllString(s, -1) {
		if m[0] >= '0' && m[0] <= '9' || m[0] == '.' || strings.HasSuffix(m, "(") {
			continue // a number (1e6) or a function call
		}
		if name := strings.TrimSpace(m); !slices.Contains(keywords, strings.ToLower(name)) {
			out = append(out, name)
		}
	}
	return out
}

func TestPromQLNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`histogram_quantile(0.9, sum by (le, pool) (rate(tandem_router:time_to_first_token_seconds_bucket{instance=~"$router"}[$__rate_interval])))`,
			[]string{"tandem_router:time_to_first_token_seconds_bucket"}},
		{`sum by (role) (a:b{quantity="running"} * on (worker, model) group_left (role) c_info)`, []string{"a:b", "c_info"}},
		{`(x + y) or x or 1e6 * z offset 5m`, []string{"x", "y", "x", "z"}},
		{`label_values(tandem:num_requests_running{model_name=~"$model"}, instance)`, []string{"tandem:num_requests_running", "instance"}},
	} {
		if got := promqlNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// The Grafana dashboards import as they are (a DS_PROMETHEUS input that every panel and
// variable uses), every panel has a query, a unit and (for charts) an axis label, and
// every metric their queries read is one the binaries export.
func TestGrafanaDashboards(t *testing.T) {
	names := exportedNames(t)
	files, _ := filepath.Glob("../deploy/grafana/*.json")
	if len(files) != 2 {
		t.Fatalf("dashboards %v, want tandem-engine.json and tandem-router.json", files)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Inputs []struct {
				Name, Type string
				PluginID   string `json:"pluginId"`
			} `json:"__inputs"`
			UID, Title string
			Panels     []panel
			Templating struct {
				List []struct {
					Name       string
					Datasource map[string]string
					Definition string
				}
			}
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" || d.UID == "" || d.Title == "" {
			t.Errorf("%s: inputs %+v, uid %q, title %q", file, d.Inputs, d.UID, d.Title)
		}
		check := func(where, expr string) {
			got := promqlNames(expr)
			if len(got) == 0 {
				t.Errorf("%s: %s: no metric in %q", file, where, expr)
			}
			for _, n := range got {
				if !names[n] {
					t.Errorf("%s: %s: %q reads %s, which no binary exports", file, where, expr, n)
				}
			}
		}
		for _, v := range d.Templating.List {
			if v.Datasource["uid"] != "${DS_PROMETHEUS}" {
				t.Errorf("%s: variable %s: datasource %v", file, v.Name, v.Datasource)
			}
			m := regexp.MustCompile(`^label_values\((.*),\s*[A-Za-z_]+\)$`).FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("%s: variable %s: %q is not label_values(METRIC, LABEL)", file, v.Name, v.Definition)
				continue
			}
			check("variable "+v.Name, m[1])
		}
		n := 0
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			n++
			where := "panel " + p.Title
			if p.Datasource["uid"] != "${DS_PROMETHEUS}" || len(p.Targets) == 0 || p.FieldConfig.Defaults.Unit == "" {
				t.Errorf("%s: %s: datasource %v, %d queries, unit %q", file, where, p.Datasource, len(p.Targets), p.FieldConfig.Defaults.Unit)
			}
			if p.Type == "timeseries" && p.FieldConfig.Defaults.Custom.AxisLabel == "" {
				t.Errorf("%s: %s: no axis label", file, where)
			}
			if strings.HasPrefix(p.Title, "Time to first token") || strings.HasPrefix(p.Title, "Inter-token latency") {
				if !slices.ContainsFunc(p.Targets, func(t target) bool { return strings.Contains(t.Expr, "sla_target_seconds") }) {
					t.Errorf("%s: %s: no SLA line", file, where)
				}
			}
			for _, tg := range p.Targets {
				if tg.Datasource["uid"] != "${DS_PROMETHEUS}" || tg.RefID == "" {
					t.Errorf("%s: %s: query %s: datasource %v, refId %q", file, where, tg.Expr, tg.Datasource, tg.RefID)
				}
				check(where, tg.Expr)
			}
		}
		if n < 10 {
			t.Errorf("%s: %d panels", file, n)
		}
	}
}

type target struct {
	Expr       string
	RefID      string `json:"refId"`
	Datasource map[string]string
}

type panel struct {
	Type, Title string
	Datasource  map[string]string
	Targets     []target
	FieldConfig struct {
		Defaults struct {
			Unit   string
			Custom struct {
				AxisLabel string `json:"axisLabel"`
			}
		}
	} `json:"fieldConfig"`
}
