package main

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// bench-engine -d runs every test after that much context: the tests are named as
// llama-bench names them, carry n_depth, and the KV store holds the depth too.
func TestBenchEngineDepth(t *testing.T) {
	kv := map[int]int64{}
	for _, depth := range []int{0, 64} {
		out, errOut, code := runMain(t, "bench-engine", "-p", "16", "-n", "4", "--batch", "2", "-r", "1", "--json", "-d", strconv.Itoa(depth))
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var results []struct {
			Test    string  `json:"test"`
			TPS     float64 `json:"tokens_per_second"`
			NDepth  int     `json:"n_depth"`
			KVType  string  `json:"type_kv"`
			KVBytes int64   `json:"kv_bytes"`
		}
		if err := json.Unmarshal([]byte(out), &results); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var tests []string
		for _, r := range results {
			tests = append(tests, r.Test)
			if r.TPS <= 0 || r.NDepth != depth || r.KVType != "F32" {
				t.Errorf("-d %d: %+v", depth, r)
			}
			kv[depth] = r.KVBytes
		}
		want := []string{"pp16", "tg4", "batch2"}
		if depth > 0 {
			want = []string{"pp16 @ d64", "tg4 @ d64", "batch2 @ d64"}
		}
		if !slices.Equal(tests, want) {
			t.Errorf("-d %d: tests %v", depth, tests)
		}
	}
	// Two sequences of 64+16 positions against two of 16, in blocks of 16.
	if kv[0] <= 0 || kv[64] != kv[0]*5 {
		t.Errorf("KV bytes by depth: %v", kv)
	}
	if _, errOut, code := runMain(t, "bench-engine", "-d", "-1"); code != 1 || !strings.Contains(errOut, "-d") {
		t.Errorf("-d -1: exit %d, %s", code, errOut)
	}
}
