package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"

	"tandem/sim"
)

// TestProfileAndServeSim profiles the sim backend (its steps sleep modelled time, so this
// is quick), checks that the written file is a timing model that tandem serve --backend sim
// loads, and serves a request on it through the real scheduler: ignore_eos or not, the
// deterministic tokens run to max_tokens, and a second identical request reads its prompt
// from the prefix cache.
func TestProfileAndServeSim(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "profile.json")
	var stdout, stderr bytes.Buffer
	if err := profileCmd([]string{"--backend", "sim", "-r", "1", "--max-batch-tokens", "64", "--max-seqs", "4", "--out", out}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "largest error") {
		t.Errorf("no fit table:\n%s", stderr.String())
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := sim.ReadTiming(f)
	f.Close()
	// Its values depend on the machine's load (the steps sleep in real time), so only
	// its form is checked here; engine/simstep checks the fit itself on a virtual clock.
	if err != nil || tm == (sim.Timing{}) {
		t.Fatalf("profile %+v, %v", tm, err)
	}
	for _, bad := range [][]string{{"--backend", "gpu"}, {"--sim-profile", out}, {"-r", "0"}, {"extra"}} {
		if err := profileCmd(bad, &stdout, &stderr); err == nil {
			t.Errorf("profile %q: no error", bad)
		}
	}

	s := startServe(t, "--backend", "sim", "--sim-profile", out, "--kv-cache-memory", "4MiB")
	c := s.client()
	var texts []string
	for i := range 2 {
		r, err := c.Completions.New(t.Context(), sdk.CompletionNewParams{
			Model:     "tandem-demo",
			Prompt:    sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(strings.Repeat("the same long prompt ", 8))},
			MaxTokens: sdk.Int(24),
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, s.log())
		}
		if r.Usage.CompletionTokens != 24 || r.Choices[0].FinishReason != "length" {
			t.Fatalf("request %d: %d tokens, finish %q; want 24, length", i, r.Usage.CompletionTokens, r.Choices[0].FinishReason)
		}
		if i == 1 && r.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Errorf("the repeated prompt found nothing in the prefix cache")
		}
		texts = append(texts, r.Choices[0].Text)
	}
	if texts[0] != texts[1] {
		t.Errorf("outputs differ: %q, %q", texts[0], texts[1])
	}
	if !strings.Contains(s.log(), "sim backend: 1 replica,") {
		t.Errorf("serve did not say it runs the sim backend:\n%s", s.log())
	}
}

func TestServeBackendFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--backend", "tpu"},
		{"--sim-profile", "cpu"},
		{"--backend", "sim", "--replicas", "3"},
		{"--backend", "sim", "--replicas", "0"},
		{"--backend", "sim", "--sim-profile", "/nonexistent.json"},
	} {
		var stdout, stderr bytes.Buffer
		if err := serveCmd(append(args, "--port", "0"), &stdout, &stderr); err == nil {
			t.Errorf("serve %q: no error", args)
		}
	}
}

func TestProfileTransfers(t *testing.T) {
	sizes := []int64{64 << 10, 3<<20 + 5}
	got, err := profileTransfers(t.Context(), sizes, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(sizes) {
		t.Fatalf("%d samples for %d sizes", len(got), len(sizes))
	}
	for i, s := range got {
		if s.Bytes != sizes[i] || s.Time <= 0 {
			t.Errorf("sample %d: %+v", i, s)
		}
	}
}
