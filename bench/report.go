package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteTable writes the human summary, laid out like vLLM's "Serving
// Benchmark Result" block, then the most common errors.
func (r *Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	s := &r.Summary
	row := func(label string, v any) {
		var val string
		switch v := v.(type) {
		case float64:
			val = strconv.FormatFloat(v, 'f', 2, 64)
		default:
			val = fmt.Sprint(v)
		}
		fmt.Fprintf(&b, "%-40s %s\n", label, val)
	}
	head := func(title string, fill byte) {
		t := " " + title + " "
		if title == "" {
			t = ""
		}
		left := (50 - len(t)) / 2
		b.WriteString(strings.Repeat(string(fill), left) + t + strings.Repeat(string(fill), 50-len(t)-left) + "\n")
	}
	head("Serving Benchmark Result", '=')
	row("Successful requests:", s.Completed)
	row("Failed requests:", s.Failed)
	if r.Interrupted > 0 {
		row("Not sent (interrupted):", r.Interrupted)
	}
	if r.MaxConcurrency > 0 {
		row("Maximum request concurrency:", r.MaxConcurrency)
	}
	switch {
	case r.Arrival == Trace:
		row("Trace speed-up:", r.TraceSpeedup)
	case math.IsInf(r.RequestRate, 1):
		row("Request rate configured (RPS):", "inf")
	default:
		row("Request rate configured (RPS):", r.RequestRate)
	}
	row("Benchmark duration (s):", s.Duration.Seconds())
	row("Total input tokens:", s.TotalInput)
	if s.TotalCached > 0 {
		row("Total cached input tokens:", s.TotalCached)
	}
	row("Total generated tokens:", s.TotalOutput)
	row("Request throughput (req/s):", s.RequestThroughput)
	if !r.SLO.IsZero() {
		row("Request goodput (req/s):", s.RequestGoodput)
	}
	row("Output token throughput (tok/s):", s.OutputThroughput)
	row("Peak output token throughput (tok/s):", s.PeakOutputThroughput)
	row("Peak concurrent requests:", s.PeakConcurrency)
	row("Total Token throughput (tok/s):", s.TotalTokenThroughput)
	for _, m := range []struct {
		title, name string
		st          *Stats
	}{
		{"Time to First Token", "TTFT", &s.TTFT},
		{"Time per Output Token (excl. 1st token)", "TPOT", &s.TPOT},
		{"Inter-token Latency", "ITL", &s.ITL},
		{"End-to-end Latency", "E2EL", &s.E2EL},
	} {
		head(m.title, '-')
		row("Mean "+m.name+" (ms):", m.st.Mean)
		row("Median "+m.name+" (ms):", m.st.Median)
		for _, p := range r.Percentiles {
			row("P"+pctName(p)+" "+m.name+" (ms):", m.st.Percentiles[p])
		}
	}
	head("", '=')
	if s.Failed > 0 {
		counts := map[string]int{}
		for i := range r.Requests {
			if e := r.Requests[i].Err; e != "" {
				counts[e]++
			}
		}
		errs := slices.SortedFunc(maps.Keys(counts), func(a, b string) int { return counts[b] - counts[a] })
		b.WriteString("Errors:\n")
		for i, e := range errs {
			if i == 5 {
				fmt.Fprintf(&b, "  … and %d more kinds\n", len(errs)-5)
				break
			}
			fmt.Fprintf(&b, "  %6d× %.300s\n", counts[e], e)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func pctName(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) }

// JSON returns the report as vLLM's benchmark_serving result file has it:
// the summary (latencies in ms, throughputs per second) and per-request
// arrays in request order (times in seconds), plus Tandem's extras.
func (r *Result) JSON() map[string]any {
	s := &r.Summary
	m := map[string]any{
		"date":                    r.Date.Format("20060102-150405"),
		"backend":                 "openai-" + string(r.Endpoint),
		"base_url":                r.BaseURL,
		"endpoint":                string(r.Endpoint),
		"model_id":                r.Model,
		"workload":                r.Workload,
		"prompt_format":           string(r.PromptFormat),
		"arrival":                 string(r.Arrival),
		"num_prompts":             r.NumPrompts,
		"burstiness":              r.Burstiness,
		"trace_speedup":           r.TraceSpeedup,
		"max_concurrency":         nil,
		"duration":                s.Duration.Seconds(),
		"completed":               s.Completed,
		"failed":                  s.Failed,
		"interrupted":             r.Interrupted,
		"total_input_tokens":      s.TotalInput,
		"total_output_tokens":     s.TotalOutput,
		"total_cached_tokens":     s.TotalCached,
		"request_throughput":      s.RequestThroughput,
		"request_goodput":         nil,
		"output_throughput":       s.OutputThroughput,
		"total_token_throughput":  s.TotalTokenThroughput,
		"max_output_tokens_per_s": s.PeakOutputThroughput,
		"max_concurrent_requests": s.PeakConcurrency,
		"percentiles":             r.Percentiles,
	}
	if math.IsInf(r.RequestRate, 1) {
		m["request_rate"] = "inf"
	} else {
		m["request_rate"] = r.RequestRate
	}
	if r.MaxConcurrency > 0 {
		m["max_concurrency"] = r.MaxConcurrency
	}
	if !r.SLO.IsZero() {
		m["request_goodput"] = s.RequestGoodput
		slo := map[string]float64{}
		for k, d := range map[string]time.Duration{"ttft": r.SLO.TTFT, "tpot": r.SLO.TPOT, "e2el": r.SLO.E2EL} {
			if d > 0 {
				slo[k] = ms(d)
			}
		}
		m["goodput"] = slo
	}
	for name, st := range map[string]*Stats{"ttft": &s.TTFT, "tpot": &s.TPOT, "itl": &s.ITL, "e2el": &s.E2EL} {
		m["mean_"+name+"_ms"] = st.Mean
		m["median_"+name+"_ms"] = st.Median
		m["std_"+name+"_ms"] = st.Std
		for _, p := range r.Percentiles {
			m["p"+pctName(p)+"_"+name+"_ms"] = st.Percentiles[p]
		}
	}
	n := len(r.Requests)
	inputs, outputs, cached := make([]int, n), make([]int, n), make([]int, n)
	sessions, turns := make([]int, n), make([]int, n)
	ttfts, tpots, e2els, starts := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	itls := make([][]float64, n)
	errs := make([]string, n)
	for i := range r.Requests {
		q := &r.Requests[i]
		inputs[i], outputs[i], cached[i] = q.InputLen, q.OutputLen, q.CachedTokens
		sessions[i], turns[i] = q.Session, q.Turn
		ttfts[i], tpots[i], e2els[i], starts[i] = q.TTFT.Seconds(), q.TPOT().Seconds(), q.E2E.Seconds(), q.Start.Seconds()
		itls[i] = make([]float64, len(q.ITL))
		for j, d := range q.ITL {
			itls[i][j] = d.Seconds()
		}
		errs[i] = q.Err
	}
	m["input_lens"], m["output_lens"], m["cached_tokens"] = inputs, outputs, cached
	m["sessions"], m["turns"] = sessions, turns
	m["ttfts"], m["tpots"], m["e2els"], m["start_times"] = ttfts, tpots, e2els, starts
	m["itls"], m["errors"] = itls, errs
	return m
}

// WriteJSON writes JSON() on one line, keys sorted.
func (r *Result) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r.JSON())
}
