package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// tieredCompletion is a greedy completion of prompt with its tokens' logprobs (as JSON)
// and how many of its prompt tokens the engine found cached (device or lower tiers).
func tieredCompletion(t *testing.T, s *server, prompt string) (choices string, promptTokens, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 2, "ignore_eos": true})
	code, resp := post(t, s.url+"/v1/completions", "application/json", string(body))
	var out struct {
		Choices json.RawMessage `json:"choices"`
		Usage   struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if code != 200 || json.Unmarshal([]byte(resp), &out) != nil {
		t.Fatalf("completion: %d %s", code, resp)
	}
	return string(out.Choices), out.Usage.PromptTokens, out.Usage.Details.Cached
}

// wordsPrompt is a prompt of n distinct words starting at seed.
func wordsPrompt(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d ", seed*1000+i)
	}
	return b.String()
}

// TestServeKVDiskTier: real engines with a KV cache of a few blocks and a disk tier. A
// prompt whose blocks other prompts evicted is served from the lower tiers with the
// output of its first computation, bit for bit (tokens and logprobs); after a restart the
// disk's block files are re-indexed and serve it again; after they are corrupted, or
// truncated, the engine counts the failures and recomputes, with the same output.
func TestServeKVDiskTier(t *testing.T) {
	if testing.Short() {
		t.Skip("starts tandem serve four times")
	}
	model := genTestModel(t)
	dir := t.TempDir()
	args := []string{"--model", model, "--threads", "1", "--kv-cache-memory", "6MiB", "--max-seqs", "2",
		"--kv-disk-dir", dir, "--kv-disk-size", "64MiB", "--kv-disk-min-uses", "1"}
	a := wordsPrompt(1, 60)
	onboarded := func(s *server, tier string) float64 {
		return scrapeValue(t, s, "tandem:kv_tier_onboarded_blocks_total", `tier="`+tier+`"`)
	}

	first := startServe(t, args...)
	ref, n, cached := tieredCompletion(t, first, a)
	if cached != 0 || n < 64 {
		t.Fatalf("first: %d prompt tokens, %d cached; want at least 64, none cached", n, cached)
	}
	for i := 2; i <= 5; i++ { // other prompts push a's blocks out of the device
		tieredCompletion(t, first, wordsPrompt(i, 60))
	}
	got, _, cached := tieredCompletion(t, first, a)
	if got != ref {
		t.Errorf("after eviction: %s\nwant %s", got, ref)
	}
	lower := onboarded(first, "host") + onboarded(first, "disk")
	if cached == 0 || lower <= 0 {
		t.Errorf("after eviction: %d tokens cached, %v blocks onboarded from host and disk; want both above 0\n%s", cached, lower, first.log())
	}
	first.stop(t)
	files, _ := filepath.Glob(filepath.Join(dir, "*.kvb"))
	if len(files) == 0 {
		t.Fatalf("no block files in %s", dir)
	}

	second := startServe(t, args...)
	if m := second.logMatch(regexp.MustCompile(`KV disk tier re-indexed.* blocks=(\d+)`)); m == nil || m[1] == "0" {
		t.Errorf("second start re-indexed no block files (%d on disk):\n%s", len(files), second.log())
	}
	got, _, cached = tieredCompletion(t, second, a)
	if got != ref {
		t.Errorf("from disk after a restart: %s\nwant %s", got, ref)
	}
	if cached == 0 || onboarded(second, "disk") <= 0 {
		t.Errorf("after a restart: %d tokens cached, %v blocks onboarded from disk; want both above 0\n%s", cached, onboarded(second, "disk"), second.log())
	}
	second.stop(t)

	// Damage every block file: flip a byte of its payload (the CRC catches it), or cut it
	// short (the header or size catches it).
	for _, damage := range []string{"corrupt", "truncate"} {
		files, _ = filepath.Glob(filepath.Join(dir, "*.kvb"))
		for _, f := range files {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if damage == "truncate" {
				err = os.Truncate(f, fi.Size()/2)
			} else {
				b, rerr := os.ReadFile(f)
				if rerr != nil {
					t.Fatal(rerr)
				}
				b[len(b)-100] ^= 0x5a
				err = os.WriteFile(f, b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		s := startServe(t, args...)
		got, _, _ = tieredCompletion(t, s, a)
		if got != ref {
			t.Errorf("%s block files: %s\nwant %s", damage, got, ref)
		}
		_, body := get(t, s.url+"/metrics")
		errs := regexp.MustCompile(`(?m)^tandem:kv_tier_errors_total\{[^}]*tier="disk"[^}]*\} ([1-9]\d*)`).FindString(body)
		if errs == "" {
			t.Errorf("%s block files: no disk error counted and no file refused:\n%s\n%s", damage, grepLines(body, "kv_tier"), s.log())
		}
		if n := strings.Count(s.log(), "KV tier error"); n > 1 {
			t.Errorf("%s block files: %d log lines about tier errors, want at most 1", damage, n)
		}
		s.stop(t)
	}
}
