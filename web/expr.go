package web

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Expr is one figure of the dashboard, in the small language its panels (assets/panels.json)
// are written in and its page evaluates (assets/app.js):
//
//	sum:SEL+SEL…      the sum of the matching series' values
//	max:SEL, avg:SEL  the largest, and the mean, of the matching series' values
//	count:SEL         how many series match
//	rate:SEL+SEL…     the increase of their sum per second over the window
//	ratio:SELS/SELS   the increase of the first sum over the increase of the second
//	quantile:Q:SEL    the Q-quantile of the matching histograms' buckets added, over the
//	                  window, interpolated as Prometheus's histogram_quantile does
//
// SEL is a metric name, optionally with label matchers, name{label="value",…}; name_count
// and name_sum are a histogram's count and sum. A role="…" matcher on a family without a
// role label joins tandem_router:worker_info on the worker label. A figure with no matching
// series, or with nothing in its window, is empty (NaN).
//
// Eval is the page's semantics in Go: the browser test holds the page to it over /metrics.
type Expr struct {
	Op    string
	Q     float64    // quantile's
	Sels  []Selector // the terms added (the numerator, for ratio)
	Den   []Selector // ratio's denominator
	Text  string
	instn bool
}

// Selector picks series: a family's name (or a histogram's name_count, name_sum) and exact
// label matchers.
type Selector struct {
	Name     string
	Matchers [][2]string
}

// Families are gathered metric families by name.
type Families map[string]*dto.MetricFamily

var (
	ops       = []string{"sum", "max", "avg", "count", "rate", "ratio", "quantile"}
	nameRE    = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	matcherRE = regexp.MustCompile(`^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)`)
)

// ParseExpr parses a dashboard expression.
func ParseExpr(text string) (*Expr, error) {
	op, rest, ok := strings.Cut(text, ":")
	if !ok || !slices.Contains(ops, op) {
		return nil, fmt.Errorf("web: expression %q: want one of %v, a colon and selectors", text, ops)
	}
	e := &Expr{Op: op, Text: text, instn: op == "sum" || op == "max" || op == "avg" || op == "count"}
	if op == "quantile" {
		qs, r, ok := strings.Cut(rest, ":")
		q, err := strconv.ParseFloat(qs, 64)
		if !ok || err != nil || q < 0 || q > 1 {
			return nil, fmt.Errorf("web: expression %q: quantile needs a number in [0, 1] and a colon", text)
		}
		e.Q, rest = q, r
	}
	num, den := rest, ""
	if op == "ratio" {
		parts := splitOutside(rest, '/')
		if len(parts) != 2 {
			return nil, fmt.Errorf("web: expression %q: ratio needs SELS/SELS", text)
		}
		num, den = parts[0], parts[1]
	}
	var err error
	if e.Sels, err = parseSels(num); err != nil {
		return nil, fmt.Errorf("web: expression %q: %w", text, err)
	}
	if op == "ratio" {
		if e.Den, err = parseSels(den); err != nil {
			return nil, fmt.Errorf("web: expression %q: %w", text, err)
		}
	}
	if op == "quantile" && len(e.Sels) != 1 {
		return nil, fmt.Errorf("web: expression %q: quantile takes one selector", text)
	}
	return e, nil
}

// Instant reports whether e reads only the latest values (no window).
func (e *Expr) Instant() bool { return e.instn }

// Metrics returns the metric names e reads, as /metrics names them (a histogram's
// quantile reads name_bucket), plus tandem_router:worker_info for a role join.
func (e *Expr) Metrics() []string {
	var out []string
	for _, s := range append(slices.Clone(e.Sels), e.Den...) {
		n := s.Name
		if e.Op == "quantile" {
			n += "_bucket"
		}
		out = append(out, n)
		for _, m := range s.Matchers {
			if m[0] == "role" {
				out = append(out, "tandem_router:worker_info")
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// splitOutside cuts s at sep outside double-quoted strings.
func splitOutside(s string, sep byte) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case quoted && s[i] == '\\':
			i++
		case s[i] == '"':
			quoted = !quoted
		case !quoted && s[i] == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func parseSels(s string) ([]Selector, error) {
	var out []Selector
	for _, t := range splitOutside(s, '+') {
		sel, err := parseSelector(t)
		if err != nil {
			return nil, err
		}
		out = append(out, sel)
	}
	return out, nil
}

func parseSelector(s string) (Selector, error) {
	name, body, braces := strings.Cut(s, "{")
	sel := Selector{Name: name}
	if !nameRE.MatchString(name) {
		return sel, fmt.Errorf("bad metric name %q", name)
	}
	if !braces {
		return sel, nil
	}
	body, ok := strings.CutSuffix(body, "}")
	if !ok {
		return sel, fmt.Errorf("selector %q: no closing brace", s)
	}
	for body != "" {
		m := matcherRE.FindStringSubmatchIndex(body)
		if m == nil {
			return sel, fmt.Errorf("selector %q: bad matcher at %q", s, body)
		}
		val := body[m[4]:m[5]]
		var b strings.Builder
		for i := 0; i < len(val); i++ {
			if val[i] == '\\' && i+1 < len(val) {
				i++
			}
			b.WriteByte(val[i])
		}
		sel.Matchers = append(sel.Matchers, [2]string{body[m[2]:m[3]], b.String()})
		body = body[m[1]:]
	}
	return sel, nil
}

// Eval evaluates e on now, with base the window's first families (for rate, ratio and
// quantile) and seconds the time between them (for rate). Empty is NaN.
func (e *Expr) Eval(now, base Families, seconds float64) float64 {
	switch e.Op {
	case "sum":
		return sumOf(now, e.Sels)
	case "max", "avg", "count":
		var vals []float64
		for _, s := range e.Sels {
			for _, m := range now.match(s) {
				vals = append(vals, m.value)
			}
		}
		switch {
		case len(vals) == 0:
			return math.NaN()
		case e.Op == "count":
			return float64(len(vals))
		case e.Op == "max":
			return slices.Max(vals)
		}
		t := 0.0
		for _, v := range vals {
			t += v
		}
		return t / float64(len(vals))
	case "rate":
		return delta(now, base, e.Sels) / seconds
	case "ratio":
		d := delta(now, base, e.Den)
		if !(d > 0) {
			return math.NaN()
		}
		return delta(now, base, e.Sels) / d
	}
	bounds, cum := now.buckets(e.Sels[0])
	if cum == nil {
		return math.NaN()
	}
	if _, was := base.buckets(e.Sels[0]); was != nil {
		for i := range cum {
			cum[i] -= was[i]
		}
	}
	return Quantile(e.Q, bounds, cum)
}

func sumOf(f Families, sels []Selector) float64 {
	any, t := false, 0.0
	for _, s := range sels {
		for _, m := range f.match(s) {
			any = true
			t += m.value
		}
	}
	if !any {
		return math.NaN()
	}
	return t
}

// delta is the increase of the sum of sels from base to now: NaN when nothing matches
// now; a series missing from base had not started.
func delta(now, base Families, sels []Selector) float64 {
	n := sumOf(now, sels)
	if b := sumOf(base, sels); !math.IsNaN(b) {
		n -= b
	}
	return n
}

type matched struct {
	value float64
	m     *dto.Metric
}

// match returns the series s selects, with the value it reads (a counter's or gauge's
// value, a histogram's count or sum).
func (f Families) match(s Selector) []matched {
	part := ""
	mf := f[s.Name]
	if mf == nil {
		for _, suffix := range []string{"_count", "_sum"} {
			if b, ok := strings.CutSuffix(s.Name, suffix); ok && f[b] != nil && f[b].GetType() == dto.MetricType_HISTOGRAM {
				mf, part = f[b], suffix
			}
		}
	}
	if mf == nil {
		return nil
	}
	var roles map[string]string
	var out []matched
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for _, mt := range s.Matchers {
			got, has := labels[mt[0]]
			if !has && mt[0] == "role" {
				if roles == nil {
					roles = f.roles()
				}
				got = roles[labels["worker"]]
			}
			ok = ok && got == mt[1]
		}
		if !ok {
			continue
		}
		var v float64
		switch {
		case part == "_count":
			v = float64(m.GetHistogram().GetSampleCount())
		case part == "_sum":
			v = m.GetHistogram().GetSampleSum()
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		case m.Histogram != nil:
			v = float64(m.GetHistogram().GetSampleCount())
		}
		out = append(out, matched{v, m})
	}
	return out
}

func (f Families) roles() map[string]string {
	out := map[string]string{}
	if mf := f["tandem_router:worker_info"]; mf != nil {
		for _, m := range mf.GetMetric() {
			var w, r string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "worker":
					w = lp.GetValue()
				case "role":
					r = lp.GetValue()
				}
			}
			out[w] = r
		}
	}
	return out
}

// buckets adds the cumulative buckets of the histograms s matches (finite bounds, then
// the count); nil if none.
func (f Families) buckets(s Selector) (bounds, cum []float64) {
	for _, m := range f.match(s) {
		h := m.m.GetHistogram()
		if h == nil {
			continue
		}
		if cum == nil {
			for _, b := range h.GetBucket() {
				if !math.IsInf(b.GetUpperBound(), +1) {
					bounds = append(bounds, b.GetUpperBound())
				}
			}
			cum = make([]float64, len(bounds)+1)
		}
		for i, b := range h.GetBucket() {
			if i < len(bounds) {
				cum[i] += float64(b.GetCumulativeCount())
			}
		}
		cum[len(bounds)] += float64(h.GetSampleCount())
	}
	return bounds, cum
}

// Quantile is Prometheus's histogram_quantile over cumulative counts cum at bounds (cum
// has one more, the +Inf bucket: the count). NaN when there are no observations.
func Quantile(q float64, bounds, cum []float64) float64 {
	if len(cum) == 0 || !(cum[len(cum)-1] > 0) {
		return math.NaN()
	}
	rank := q * cum[len(cum)-1]
	b := 0
	for b < len(cum)-1 && cum[b] < rank {
		b++
	}
	if b == len(cum)-1 {
		if len(bounds) == 0 {
			return math.NaN()
		}
		return bounds[len(bounds)-1]
	}
	if b == 0 && bounds[0] <= 0 {
		return bounds[0]
	}
	start, end, count := 0.0, bounds[b], cum[b]
	if b > 0 {
		start = bounds[b-1]
		count -= cum[b-1]
		rank -= cum[b-1]
	}
	return start + (end-start)*(rank/count)
}
