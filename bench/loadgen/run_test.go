package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tandem/bench/benchtest"

	"tandem/bench"
)

func mustRandom(t *testing.T, n, in, out int) bench.Workload {
	t.Helper()
	w, err := bench.Random(bench.RandomOptions{N: n, InputLen: in, OutputLen: out, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func run(t *testing.T, cfg Config) *bench.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// within reports whether got is in [want, want+slack].
func within(got, want, slack time.Duration) bool { return got >= want && got <= want+slack }

// The fake server's delays are lower bounds of what the client measures; how much later a
// loaded machine delivers is not asserted (timed upper bounds flake on shared machines), but
// the metrics must agree with one another exactly as their definitions say.
func TestRunTimings(t *testing.T) {
	const first, gap = 60 * time.Millisecond, 25 * time.Millisecond
	srv := (&benchtest.Server{First: first, Gap: gap}).Start()
	defer srv.Close()
	res := run(t, Config{BaseURL: srv.URL + "/v1/", Workload: mustRandom(t, 6, 20, 5), IgnoreEOS: true, Warmups: 1})
	if res.Model != "fake" || res.PromptFormat != bench.IDs || res.NumPrompts != 6 {
		t.Errorf("model %q format %q prompts %d", res.Model, res.PromptFormat, res.NumPrompts)
	}
	s := res.Summary
	if s.Completed != 6 || s.Failed != 0 {
		t.Fatalf("completed %d failed %d: %+v", s.Completed, s.Failed, res.Requests)
	}
	for _, r := range res.Requests {
		if r.TTFT < first {
			t.Errorf("TTFT %v, server waits %v", r.TTFT, first)
		}
		if len(r.ITL) != 4 {
			t.Fatalf("%d ITLs, want 4", len(r.ITL))
		}
		var sum time.Duration
		for _, d := range r.ITL {
			sum += d
		}
		if sum/4 < gap-5*time.Millisecond {
			t.Errorf("mean ITL %v, server gap %v", sum/4, gap)
		}
		// vLLM's definitions: TPOT = (E2E − TTFT) / (output tokens − 1); the ITLs are the
		// gaps between tokens, so TTFT + ΣITL is the last token's time, at most E2E.
		if want := (r.E2E - r.TTFT) / 4; r.TPOT() != want {
			t.Errorf("TPOT %v, (E2E − TTFT)/4 = %v", r.TPOT(), want)
		}
		if r.E2E < first+4*gap || r.TTFT+sum > r.E2E {
			t.Errorf("E2E %v, TTFT %v + ΣITL %v; the server takes at least %v", r.E2E, r.TTFT, sum, first+4*gap)
		}
		if r.InputLen != 20 || r.OutputLen != 5 {
			t.Errorf("lens %d/%d, want 20/5", r.InputLen, r.OutputLen)
		}
	}
	if time.Duration(s.TTFT.Median*float64(time.Millisecond)) < first {
		t.Errorf("median TTFT %v ms", s.TTFT.Median)
	}
	if s.TotalInput != 120 || s.TotalOutput != 30 || s.PeakConcurrency != 6 {
		t.Errorf("totals %d/%d peak %d", s.TotalInput, s.TotalOutput, s.PeakConcurrency)
	}
	bodies := srv.Bodies()
	if len(bodies) != 7 { // a warm-up, then six
		t.Fatalf("%d requests reached the server, want 7", len(bodies))
	}
	b := bodies[1]
	ids, _ := b["prompt"].([]any)
	opts, _ := b["stream_options"].(map[string]any)
	if len(ids) != 20 || b["max_tokens"] != 5.0 || b["stream"] != true || opts["include_usage"] != true || b["ignore_eos"] != true || b["model"] != "fake" {
		t.Errorf("request body %v", b)
	}
	for _, id := range ids {
		if v := id.(float64); v < 100 || v >= 150 {
			t.Errorf("prompt id %v is not one of /tokenize's", v)
		}
	}
}

func TestRunCountsErrorsAndWritesJSON(t *testing.T) {
	srv := (&benchtest.Server{First: time.Millisecond, Gap: time.Millisecond, Status: func(n int64) int {
		return [...]int{500, 429, 0}[n%3]
	}}).Start()
	defer srv.Close()
	res := run(t, Config{BaseURL: srv.URL, Model: "m", Workload: mustRandom(t, 9, 8, 3), Warmups: 0,
		SLO: bench.SLO{TTFT: time.Second}, Percentiles: []float64{99, 50, 90}})
	if res.Summary.Completed != 3 || res.Summary.Failed != 6 {
		t.Fatalf("completed %d failed %d, want 3 and 6", res.Summary.Completed, res.Summary.Failed)
	}
	count := map[string]int{}
	for _, r := range res.Requests {
		if !r.OK() {
			count[r.Err[:8]]++
		}
	}
	if count["HTTP 500"] != 3 || count["HTTP 429"] != 3 {
		t.Errorf("errors %v, want three each of 500 and 429", count)
	}

	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Serving Benchmark Result", "Successful requests:                     3\n",
		"Failed requests:                         6\n", "Request goodput (req/s):", "P90 TTFT (ms):", "P99 ITL (ms):", "Median TPOT (ms):", "3× HTTP 500"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ttfts", "itls", "e2els", "tpots", "input_lens", "output_lens", "errors", "start_times"} {
		a, ok := m[k].([]any)
		if !ok || len(a) != 9 {
			t.Errorf("%s: %T of length %d, want 9 values", k, m[k], len(a))
		}
	}
	itls, errs := m["itls"].([]any), m["errors"].([]any)
	for i := range 9 {
		e, _ := errs[i].(string)
		gaps := itls[i].([]any)
		if (e == "") != (len(gaps) == 2) || (e != "" && len(gaps) != 0) || (e != "" && !strings.HasPrefix(e, "HTTP 4") && !strings.HasPrefix(e, "HTTP 5")) {
			t.Errorf("request %d: error %q, itls %v; want 2 gaps for 3 tokens, none for failures", i, e, gaps)
		}
	}
	for k, want := range map[string]any{"completed": 3.0, "failed": 6.0, "request_rate": "inf", "model_id": "m", "num_prompts": 9.0,
		"total_output_tokens": 9.0, "max_concurrency": nil} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	for _, k := range []string{"mean_ttft_ms", "median_tpot_ms", "p50_itl_ms", "p90_e2el_ms", "p99_ttft_ms", "std_itl_ms", "request_goodput", "request_throughput", "output_throughput", "duration"} {
		if _, ok := m[k].(float64); !ok {
			t.Errorf("%s = %v, want a number", k, m[k])
		}
	}
	if slo := m["goodput"].(map[string]any); slo["ttft"] != 1000.0 {
		t.Errorf("goodput %v", slo)
	}

	dir := t.TempDir()
	paths, err := bench.WritePlots(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 5 {
		t.Errorf("plots %v", paths)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.HasPrefix(b, []byte("<svg")) || !bytes.HasSuffix(b, []byte("</svg>\n")) {
			t.Errorf("%s: not an SVG (%v)", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "throughput.svg")); err != nil {
		t.Error(err)
	}
}

func TestRunChatMultiTurn(t *testing.T) {
	const first = 40 * time.Millisecond
	srv := (&benchtest.Server{First: first, Gap: 5 * time.Millisecond}).Start()
	defer srv.Close()
	w, err := bench.MultiTurn(bench.MultiTurnOptions{Conversations: 2, Turns: 3, InputLen: 6, OutputLen: 2, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, Config{BaseURL: srv.URL, Endpoint: bench.Chat, Workload: w})
	if res.Summary.Completed != 6 || res.PromptFormat != bench.Text {
		t.Fatalf("completed %d, format %s", res.Summary.Completed, res.PromptFormat)
	}
	for _, r := range res.Requests {
		if r.TTFT < first { // the role-only chunk is no token
			t.Errorf("TTFT %v, before the first content at %v", r.TTFT, first)
		}
		if r.OutputLen != 2 || len(r.ITL) != 1 {
			t.Errorf("output %d ITLs %v", r.OutputLen, r.ITL)
		}
	}
	// Third turns carry the conversation: u, a, u, a, u with the server's answers.
	var third int
	for _, b := range srv.Bodies()[1:] {
		msgs := b["messages"].([]any)
		if len(msgs) != 5 {
			continue
		}
		third++
		for i, m := range msgs {
			mm := m.(map[string]any)
			role := map[bool]string{true: "user", false: "assistant"}[i%2 == 0]
			if mm["role"] != role || (role == "assistant" && mm["content"] != "tok0 tok1 ") {
				t.Errorf("message %d: %v", i, mm)
			}
			if role == "user" && len(strings.Fields(mm["content"].(string))) != 6 {
				t.Errorf("user message %q: want 6 words", mm["content"])
			}
		}
	}
	if third != 2 {
		t.Errorf("%d third turns with five messages, want 2", third)
	}
	// Completions: the transcript grows as text.
	res = run(t, Config{BaseURL: srv.URL, Workload: w, Warmups: 0})
	if res.Summary.Completed != 6 || res.PromptFormat != bench.Text {
		t.Fatalf("completions multi-turn: completed %d, format %s", res.Summary.Completed, res.PromptFormat)
	}
	last := srv.Bodies()[len(srv.Bodies())-1]["prompt"].(string)
	if strings.Count(last, "tok0 tok1 ") != 2 {
		t.Errorf("a third-turn prompt %q should hold both earlier answers", last)
	}
}

func TestRunFailuresMidStreamAndWithoutUsage(t *testing.T) {
	srv := (&benchtest.Server{First: time.Millisecond, Gap: time.Millisecond, NoUsage: true, NoTokenize: true,
		StreamError: func(n int64) bool { return n == 3 }}).Start()
	defer srv.Close()
	res := run(t, Config{BaseURL: srv.URL, Workload: mustRandom(t, 4, 10, 7), Warmups: 0, TokenIDRange: [2]int32{7, 9}})
	if res.Summary.Completed != 3 || res.Summary.Failed != 1 {
		t.Fatalf("completed %d failed %d", res.Summary.Completed, res.Summary.Failed)
	}
	for _, r := range res.Requests {
		if r.OK() && (r.OutputLen != 7 || r.InputLen != 10) {
			t.Errorf("without usage: lens %d/%d, want chunks 7 and intended 10", r.InputLen, r.OutputLen)
		}
		if !r.OK() && !strings.Contains(r.Err, "mid-stream") {
			t.Errorf("error %q", r.Err)
		}
	}
	for _, b := range srv.Bodies() {
		for _, id := range b["prompt"].([]any) {
			if v := id.(float64); v != 7 && v != 8 {
				t.Errorf("fallback token id %v outside [7, 9)", v)
			}
		}
	}
}

func TestRunConcurrencyRateAndCancel(t *testing.T) {
	srv := (&benchtest.Server{First: 20 * time.Millisecond, Gap: 5 * time.Millisecond}).Start()
	defer srv.Close()
	res := run(t, Config{BaseURL: srv.URL, Workload: mustRandom(t, 8, 4, 4), MaxConcurrency: 2})
	if p := srv.PeakInFlight(); p > 2 || res.Summary.PeakConcurrency > 2 || res.Summary.Completed != 8 {
		t.Errorf("server saw %d at once, bench %d; completed %d", p, res.Summary.PeakConcurrency, res.Summary.Completed)
	}
	res = run(t, Config{BaseURL: srv.URL, Workload: mustRandom(t, 4, 4, 2), Arrival: bench.Constant, RequestRate: 10})
	for i, r := range res.Requests {
		// Never early; late only by scheduling delays (very generous for loaded machines).
		if want := time.Duration(i) * 100 * time.Millisecond; !within(r.Start, want, time.Second) {
			t.Errorf("request %d sent at %v, want %v", i, r.Start, want)
		}
	}
	if d := res.Summary.Duration; d < 300*time.Millisecond || math.IsNaN(res.Summary.RequestThroughput) {
		t.Errorf("duration %v", d)
	}

	// Cancelled halfway through the arrivals (40 at 20/s, 150 ms each): some are done,
	// the rest interrupted, none failed. (A second of slack for a loaded machine.)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	slow := (&benchtest.Server{First: 50 * time.Millisecond, Gap: 50 * time.Millisecond}).Start()
	defer slow.Close()
	got, err := Run(ctx, Config{BaseURL: slow.URL, Workload: mustRandom(t, 40, 4, 3), Arrival: bench.Constant, RequestRate: 20, Warmups: 0})
	if err != nil {
		t.Fatal(err)
	}
	if got.Interrupted == 0 || got.Summary.Failed != 0 || got.Summary.Completed == 0 || got.Summary.Completed+got.Interrupted != 40 {
		t.Errorf("cancelled run: completed %d failed %d interrupted %d", got.Summary.Completed, got.Summary.Failed, got.Interrupted)
	}
}

func TestRunRefusals(t *testing.T) {
	srv := (&benchtest.Server{Status: func(int64) int { return http.StatusServiceUnavailable }}).Start()
	defer srv.Close()
	w := mustRandom(t, 1, 4, 4)
	mt, _ := bench.MultiTurn(bench.MultiTurnOptions{Conversations: 1, Turns: 2, InputLen: 3, OutputLen: 3})
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"warm-up", Config{BaseURL: srv.URL, Workload: w, Warmups: 1}, "warm-up request failed"},
		{"no workload", Config{BaseURL: srv.URL}, "no workload"},
		{"ids over chat", Config{BaseURL: srv.URL, Workload: w, Endpoint: bench.Chat, PromptFormat: bench.IDs}, "completions"},
		{"ids multi-turn", Config{BaseURL: srv.URL, Workload: mt, PromptFormat: bench.IDs}, "multi-turn"},
		{"endpoint", Config{BaseURL: srv.URL, Workload: w, Endpoint: "embeddings"}, "endpoint"},
		{"percentile", Config{BaseURL: srv.URL, Workload: w, Percentiles: []float64{100}}, "percentile"},
	} {
		_, err := Run(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one about %q", tc.name, err, tc.want)
		}
	}
}
