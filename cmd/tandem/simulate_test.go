package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimulateCmd(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	rows := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 10, "input_length": 1000, "output_length": 5, "hash_ids": [0, 2]}
{"timestamp": 2000, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}
`
	if err := os.WriteFile(trace, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	var stdout, stderr bytes.Buffer
	err := simulateCmd([]string{"--trace", trace, "--workers", "2", "--routing", "kv", "--json-out", out, "--trace-block-size", "64"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"Serving Benchmark Result", "Prefix cache hit rate:", "Routing mode:", "kv"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["completed"] != 3.0 || m["routing"] != "kv" || m["num_workers"] != 2.0 {
		t.Errorf("completed %v routing %v workers %v", m["completed"], m["routing"], m["num_workers"])
	}
	// The third request repeats the first one's two blocks (64 tokens each
	// when scaled); kv routing sends it to the same worker, which holds the
	// first 64 (keeping the last token to compute, the second block ends at
	// the prompt's end and is not reused).
	if hr, _ := m["prefix_cache_hit_rate"].(float64); hr <= 0 {
		t.Errorf("hit rate %v, want > 0", m["prefix_cache_hit_rate"])
	}
	// Synthetic workloads at a request rate: multi-turn conversations' later turns included.
	stdout.Reset()
	if err := simulateCmd([]string{"--workload", "multi-turn", "--multi-turn-conversations", "4", "--multi-turn-turns", "3",
		"--multi-turn-input-len", "100", "--multi-turn-output-len", "10", "--request-rate", "5", "--workers", "2"}, &stdout, &stderr); err != nil {
		t.Fatalf("multi-turn: %v", err)
	}
	if !strings.Contains(stdout.String(), "Successful requests:                     12") {
		t.Errorf("multi-turn: want 12 requests:\n%s", stdout.String())
	}
	// Tiers: a multi-turn workload on one worker whose KV holds one conversation's turn at a
	// time loads the evicted turns back from host memory.
	stdout.Reset()
	tiered := []string{"--workload", "multi-turn", "--multi-turn-conversations", "4", "--multi-turn-turns", "3",
		"--multi-turn-input-len", "200", "--multi-turn-output-len", "10", "--request-rate", "50", "--workers", "1",
		"--kv-blocks", "48", "--kv-host-memory", "64MiB", "--kv-disk-size", "1GiB", "--peer-pulls"}
	if err := simulateCmd(tiered, &stdout, &stderr); err != nil {
		t.Fatalf("tiers: %v", err)
	}
	if !strings.Contains(stdout.String(), "Tokens loaded from host memory:") || strings.Contains(stdout.String(), "Tokens loaded from host memory:          0\n") {
		t.Errorf("tiers: want tokens loaded from host memory:\n%s", stdout.String())
	}
	for _, bad := range [][]string{{"--kv-host-memory", "12XB"}, {"--kv-offload", "sometimes"}, {"--kv-disk-min-uses", "0"},
		{"--tier-load-ms-per-mib", "1,2"}, {"--tier-load-ms-per-mib", "1,-2,3"}, {"--kv-block-bytes", "0"}} {
		if err := simulateCmd(append([]string{"--trace", trace}, bad...), &stdout, &stderr); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	for _, bad := range [][]string{{}, {"--trace", trace, "--routing", "nope"}, {"--workload", "nope"}, {"--trace", trace, "--event-delay", "-1s"}, {"--trace", trace, "--workers", "0"}, {"--trace", trace, "extra"}} {
		if err := simulateCmd(bad, &stdout, &stderr); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
