package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tandem/bench/benchtest"
)

func benchRun(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb strings.Builder
	err = benchCmd(args, &out, &errb)
	return out.String(), errb.String(), err
}

func TestBenchCmd(t *testing.T) {
	srv := (&benchtest.Server{First: 5 * time.Millisecond, Gap: time.Millisecond}).Start()
	defer srv.Close()
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "out.json")
	// vLLM spreads goodput targets over arguments; flags may follow them.
	out, errOut, err := benchRun(t, "--base-url", srv.URL, "--num-prompts", "5", "--random-input-len", "12", "--random-output-len", "4",
		"--goodput", "ttft:500", "tpot:50", "--json-out", jsonPath, "--plot-dir", filepath.Join(dir, "plots"), "--ignore-eos")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	for _, want := range []string{"Serving Benchmark Result", "Successful requests:                     5", "Request goodput (req/s):", "Mean TTFT (ms):", "P99 E2EL (ms):"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if m["completed"] != 5.0 || m["workload"] != "random" || len(m["ttfts"].([]any)) != 5 {
		t.Errorf("JSON %v", m)
	}
	if slo := m["goodput"].(map[string]any); slo["ttft"] != 500.0 || slo["tpot"] != 50.0 {
		t.Errorf("goodput %v", slo)
	}
	for _, f := range []string{"ttft.svg", "tpot.svg", "itl.svg", "e2el.svg", "throughput.svg"} {
		if _, err := os.Stat(filepath.Join(dir, "plots", f)); err != nil {
			t.Error(err)
		}
	}
	if strings.Contains(errOut, "\r[") {
		t.Errorf("progress bar drawn on a non-terminal: %q", errOut)
	}

	for _, args := range [][]string{
		{"--workload", "shared-prefix", "--shared-prefix-groups", "2", "--shared-prefix-prompts-per-group", "2", "--shared-prefix-system-len", "8", "--shared-prefix-question-len", "4", "--shared-prefix-output-len", "2"},
		{"--workload", "multi-turn", "--endpoint", "chat", "--num-prompts", "4", "--multi-turn-turns", "2", "--multi-turn-input-len", "5", "--multi-turn-output-len", "2", "--request-rate", "50", "--arrival", "constant"},
		{"--workload", "random", "--num-prompts", "3", "--random-input-len", "5", "--random-output-len", "2", "--max-concurrency", "1", "--token-ids", "10:20", "--extra-body", `{"top_k": 1}`},
	} {
		out, errOut, err := benchRun(t, append([]string{"--base-url", srv.URL}, args...)...)
		if err != nil || !strings.Contains(out, "Failed requests:                         0") {
			t.Errorf("%v: %v\n%s\n%s", args, err, out, errOut)
		}
	}
	last := srv.Bodies()[len(srv.Bodies())-1]
	if last["top_k"] != 1.0 {
		t.Errorf("--extra-body not merged: %v", last)
	}
	for _, id := range last["prompt"].([]any) {
		if v := id.(float64); v < 10 || v >= 20 {
			t.Errorf("--token-ids 10:20 sent id %v", v)
		}
	}
}

func TestBenchCmdDatasets(t *testing.T) {
	dir := os.Getenv("TANDEM_WORKLOADS")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "workloads")
	}
	share := filepath.Join(dir, "sharegpt", "ShareGPT_V3_filtered_500.json")
	trace := filepath.Join(dir, "mooncake", "arxiv_mooncake_trace_first20.jsonl")
	if _, err := os.Stat(trace); err != nil {
		t.Skipf("workload fixtures absent (set TANDEM_WORKLOADS): %v", err)
	}
	srv := (&benchtest.Server{First: time.Millisecond, Gap: time.Millisecond}).Start()
	defer srv.Close()
	for _, args := range [][]string{
		{"--workload", "sharegpt", "--dataset-path", share, "--num-prompts", "6", "--sharegpt-output-len", "3"},
		{"--workload", "mooncake", "--dataset-path", trace, "--trace-speedup", "100", "--mooncake-block-size", "8", "--mooncake-max-output-len", "2"},
	} {
		out, errOut, err := benchRun(t, append([]string{"--base-url", srv.URL}, args...)...)
		if err != nil || !strings.Contains(out, "Failed requests:                         0") {
			t.Errorf("%v: %v\n%s\n%s", args, err, out, errOut)
		}
	}
}

func TestBenchCmdErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "nope"}, "unknown --workload"},
		{[]string{"--workload", "sharegpt"}, "--dataset-path"},
		{[]string{"--request-rate", "0"}, "--request-rate"},
		{[]string{"--goodput", "ttft"}, "name:milliseconds"}, // flag errors go to stderr
		{[]string{"ttft:x"}, "unexpected argument"},
		{[]string{"stray"}, "unexpected argument"},
		{[]string{"--token-ids", "5:5"}, "--token-ids"},
		{[]string{"--extra-body", "[1]"}, "--extra-body"},
		{[]string{"--metric-percentiles", "x"}, "--metric-percentiles"},
		{[]string{"--base-url", "http://127.0.0.1:1", "--num-prompts", "1", "--token-ids", "1:2", "--model", "m"}, "warm-up request failed"},
		{[]string{"--base-url", "http://127.0.0.1:1", "--num-prompts", "1"}, "asking the server"},
	} {
		_, errOut, err := benchRun(t, tc.args...)
		if err == nil || !strings.Contains(err.Error()+errOut, tc.want) {
			t.Errorf("%v: error %v, want one about %q", tc.args, err, tc.want)
		}
	}
}
