package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// genTestModel writes a random-weight Q8_0 model of some 20 MB with the built binary.
func genTestModel(t *testing.T) string {
	t.Helper()
	return genModel(t, "small.gguf", "--embd", "512", "--layers", "6", "--heads", "8", "--kv-heads", "4", "--ffn", "1536", "--ctx", "1024")
}

// genModel writes a random-weight Q8_0 model of the demo preset, its shape set by
// gen-model flags (--embd, --layers, ...), to a file named name in a temporary
// directory, with the built binary.
func genModel(t *testing.T, name string, shape ...string) string {
	t.Helper()
	bin, err := buildTandem()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	args := append(append([]string{"gen-model", "--preset", "demo"}, shape...), "--type", "q8_0", "--out", out)
	if b, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, b)
	}
	return out
}

// greedy returns a greedy completion's choices with every token's logprob, as JSON.
func greedy(t *testing.T, s *server) string {
	t.Helper()
	code, body := post(t, s.url+"/v1/completions", "application/json",
		`{"prompt":"Once upon a time","max_tokens":16,"temperature":0,"logprobs":2,"ignore_eos":true}`)
	var out struct {
		Choices json.RawMessage `json:"choices"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("completion: %d %s", code, body)
	}
	return string(out.Choices)
}

// scrapeValue is the value of the sample of name whose labels include label, -1 if absent.
func scrapeValue(t *testing.T, s *server, name, label string) float64 {
	t.Helper()
	return scrapeURL(t, s.url, name, label)
}

// scrapeURL is the value of the sample of name on base's /metrics whose labels include
// every label given, -1 if absent.
func scrapeURL(t *testing.T, base, name string, labels ...string) float64 {
	t.Helper()
	_, body := get(t, base+"/metrics")
	rx := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range rx.FindAllStringSubmatch(body, -1) {
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(m[1], l)
		}
		if ok {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// stop ends a server and waits for it (leaving its exit for the cleanup to see).
func (s *server) stop(t *testing.T) {
	t.Helper()
	s.cmd.Process.Kill()
	err := <-s.exited
	s.exited <- err
}

// TestServePackCache: a second start maps the weights from the pack cache and packs
// none, with the bits of the first; a truncated cache, one made under other kernels, and
// one of a model file since changed are each ignored with one line, and rebuilt.
func TestServePackCache(t *testing.T) {
	if testing.Short() {
		t.Skip("starts tandem serve six times")
	}
	model := genTestModel(t)
	dir := t.TempDir()
	args := []string{"--model", model, "--pack-cache", dir, "--threads", "1", "--kv-cache-memory", "64MiB"}
	written := regexp.MustCompile(`pack cache written`)

	first := startServe(t, args...)
	isa := first.logMatch(regexp.MustCompile(`backend cpu \(\d+ threads?, (\w+) kernels\)`))
	if isa == nil || isa[1] == "go" {
		t.Skipf("no packed kernels on this CPU (%v): nothing to cache", isa)
	}
	if first.logMatch(regexp.MustCompile(`weights: file `)) == nil || first.logMatch(written) == nil {
		t.Fatalf("first start: no pack cache written:\n%s", first.log())
	}
	ref := greedy(t, first)
	packed := scrapeValue(t, first, "tandem:weights_prepared", `how="packed"`)
	if packed <= 0 {
		t.Fatalf("first start packed %v weights", packed)
	}
	first.stop(t)
	caches, _ := filepath.Glob(filepath.Join(dir, "*.tpack"))
	if len(caches) != 1 {
		t.Fatalf("pack cache files: %v", caches)
	}

	second := startServe(t, args...)
	if second.logMatch(regexp.MustCompile(`weights: pack-cache `)) == nil {
		t.Fatalf("second start did not use the pack cache:\n%s", second.log())
	}
	if got := greedy(t, second); got != ref {
		t.Errorf("from the pack cache: %s\nwant %s", got, ref)
	}
	if got := scrapeValue(t, second, "tandem:weights_prepared", `how="packed"`); got != 0 {
		t.Errorf("second start packed %v weights, want 0", got)
	}
	if got := scrapeValue(t, second, "tandem:weights_prepared", `how="imported"`); got != packed {
		t.Errorf("second start imported %v weights, want %v", got, packed)
	}
	second.stop(t)

	// Each damage or change: one line saying why, the file's weights, a new cache.
	restart := func(name string, env []string, reason string) *server {
		t.Helper()
		s := startServeEnv(t, env, args...)
		if s.logMatch(regexp.MustCompile(`weights: file .*not used: pack-cache: `+reason)) == nil || s.logMatch(written) == nil {
			t.Fatalf("%s: want the cache given up as %s and written again:\n%s", name, reason, s.log())
		}
		if n := strings.Count(s.log(), "not using pack-cache"); n != 1 {
			t.Errorf("%s: %d lines about the cache given up, want 1", name, n)
		}
		if got := scrapeValue(t, s, "tandem:weights_fallbacks_total", `reason="`+reason+`"`); got != 1 {
			t.Errorf("%s: tandem:weights_fallbacks_total{reason=%q} = %v", name, reason, got)
		}
		return s
	}
	fi, err := os.Stat(caches[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(caches[0], fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	s := restart("truncated", nil, "corrupt")
	if got := greedy(t, s); got != ref {
		t.Errorf("after a truncated cache: %s\nwant %s", got, ref)
	}
	s.stop(t)

	if isa[1] == "avx512vnni" {
		s = restart("other kernels", []string{"TANDEM_CPU_ISA=avx2"}, "stale")
		if s.logMatch(regexp.MustCompile(`made for backend`)) == nil {
			t.Errorf("other kernels: the line does not say what changed:\n%s", s.log())
		}
		s.stop(t)
		restart("kernels back", nil, "stale").stop(t)
	} else {
		t.Logf("kernels %s: no other ISA with packed layouts to switch to", isa[1])
	}

	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-10] ^= 1
	if err := os.WriteFile(model, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s = restart("model changed", nil, "stale")
	if s.logMatch(regexp.MustCompile(`content hash`)) == nil {
		t.Errorf("model changed: the line does not say what changed:\n%s", s.log())
	}
	s.stop(t)
}
