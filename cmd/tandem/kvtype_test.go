package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"tandem/internal/fixtures"
)

// --kv-type: a bad value is a CLI error naming the flag and its values, on every command
// that builds a KV store, before any model is loaded.
func TestKVTypeFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--kv-type", "bf16", "hi"},
		{"serve", "--kv-type", "F16x", "--port", "0"},
		{"bench-engine", "--kv-type", "q8_0"},
		{"profile", "--kv-type", "", "--model", "/nonexistent.gguf"},
	} {
		_, errOut, code := runMain(t, args...)
		if code != 1 || !strings.Contains(errOut, "--kv-type") || !strings.Contains(errOut, "want f16 or f32") || strings.Contains(errOut, "nonexistent") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// tandem run with an F16 KV cache writes stories260K's greedy text as with F32; bench-engine's
// KV store takes half the bytes.
func TestKVTypeF16(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	out32, errOut, code := runMain(t, "run", "--model", path, "Once upon a time", "--temperature", "0", "--max-tokens", "32")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	out16, errOut, code := runMain(t, "run", "--model", path, "--kv-type", "f16", "Once upon a time", "--temperature", "0", "--max-tokens", "32")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if out16 != out32 {
		t.Errorf("greedy text with F16 KV %q, with F32 %q", out16, out32)
	}

	kvBytes := map[string]int64{}
	for _, kvType := range []string{"f32", "f16"} {
		out, errOut, code := runMain(t, "bench-engine", "--model", path, "-p", "32", "-n", "4", "--batch", "2", "-r", "1", "--json", "--kv-type", kvType)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var results []struct {
			Test    string `json:"test"`
			KVBytes int64  `json:"kv_bytes"`
		}
		if err := json.Unmarshal([]byte(out), &results); err != nil || len(results) == 0 {
			t.Fatalf("%v: %s", err, out)
		}
		kvBytes[kvType] = results[0].KVBytes
	}
	if kvBytes["f32"] <= 0 || kvBytes["f16"]*2 != kvBytes["f32"] {
		t.Errorf("KV bytes: %v", kvBytes)
	}
}

// The same --kv-cache-memory holds twice the tokens with --kv-type f16.
func TestServeKVTypeBudget(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	re := regexp.MustCompile(`KV cache: (\d+) tokens \((\d+) blocks of 16, ([^)]*)\)`)
	tokens := map[string]int{}
	for _, kvType := range []string{"f32", "f16"} {
		s := startServe(t, "--model", path, "--kv-cache-memory", "1MiB", "--kv-type", kvType)
		m := s.logMatch(re)
		if m == nil {
			t.Fatalf("--kv-type %s: no KV cache line in\n%s", kvType, s.log())
		}
		if !strings.HasSuffix(m[3], strings.ToUpper(kvType)) {
			t.Errorf("--kv-type %s: KV cache line says %q", kvType, m[0])
		}
		tokens[kvType], _ = strconv.Atoi(m[1])
		if code, _ := get(t, s.url+"/health"); code != 200 {
			t.Errorf("--kv-type %s: /health %d", kvType, code)
		}
	}
	// stories260K: 5 layers × 2 × 4 KV heads × head dim 8 × 4 bytes = 1280 bytes a token in F32.
	if tokens["f32"] != 1<<20/1280/16*16 || tokens["f16"] != 1<<20/640/16*16 {
		t.Errorf("1 MiB of KV holds %v tokens", tokens)
	}
}
