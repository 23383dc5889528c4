package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// greedyChoices returns the choices of a greedy completion of prompt on url, with every
// token's logprob: two engines computing the same bits give the same JSON.
func greedyChoices(t *testing.T, url, prompt string, maxTokens int) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "stories", "prompt": prompt, "max_tokens": maxTokens,
		"temperature": 0, "logprobs": 2, "ignore_eos": true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Choices json.RawMessage `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || len(out.Choices) < 10 {
		t.Fatalf("completion on %s: %d %s", url, resp.StatusCode, b)
	}
	return string(out.Choices)
}

// startWeightsEngine runs tandem serve on model as a member of r's cluster, named name,
// and returns it with its HTTP URL once it serves.
func startWeightsEngine(t *testing.T, r *e2eRouter, name, model string, args ...string) (*proc, string) {
	t.Helper()
	e := startProc(t, name, "tandem", append([]string{"serve", "--model", model, "--served-model-name", "stories", "--port", "0",
		"--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", name, "--threads", "1"}, args...)...)
	url := e.wait(t, `tandem serve: (http://\S+)`, 90*time.Second)[1]
	e.wait(t, `registered with router`, 30*time.Second)
	return e, url
}

// A new engine takes its prepared weights from a running one, named by --weights-from or
// found through the router by the model's content hash, and computes the same bits; one
// whose model file differs (one byte) is refused by the peer and loads its own file.
func TestWeightsFromPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs five processes")
	}
	model := genModel(t)
	r := startRouterProc(t)
	a, aURL := startWeightsEngine(t, r, "a", model)
	a.wait(t, `weights: file `, 5*time.Second)
	aORPC := a.wait(t, `worker serving ORPC.* addr=(\S+)`, 5*time.Second)[1]
	const prompt = "Once upon a time"
	ref := greedyChoices(t, aURL, prompt, 24)

	b, bURL := startWeightsEngine(t, r, "b", model, "--weights-from", aORPC, "--no-weight-peers")
	b.wait(t, `weights: peer `+regexp.QuoteMeta(aORPC)+` \(a\) \(0 packed, \d+ imported\)`, 5*time.Second)
	if got := greedyChoices(t, bURL, prompt, 24); got != ref {
		t.Errorf("b (weights from a): %s\nwant a's: %s", got, ref)
	}
	for _, m := range []struct {
		name, label string
		want        float64
	}{
		{"tandem:weights_prepared", `how="packed"`, 0},
		{"tandem:startup_weights_source", `source="peer"`, 1},
	} {
		if got := metricValue(t, bURL, m.name, m.label); got != m.want {
			t.Errorf("b: %s{%s} = %v, want %v", m.name, m.label, got, m.want)
		}
	}
	if got := metricValue(t, bURL, "tandem:weights_prepared", `how="imported"`); got <= 0 {
		t.Errorf("b imported %v weights", got)
	}
	if got := counter(t, aURL, "tandem:weights_transfer_bytes_total", `direction="sent"`); got <= 0 {
		t.Errorf("a sent %v bytes", got)
	}

	// Found through the router: the engines of the same content hash.
	c, cURL := startWeightsEngine(t, r, "c", model)
	c.wait(t, `weights: peer \S+ \((a|b)\) \(0 packed`, 5*time.Second)
	if got := greedyChoices(t, cURL, prompt, 24); got != ref {
		t.Errorf("c (weights from a peer the router named): %s\nwant a's: %s", got, ref)
	}
	if got := metricValue(t, r.url, "tandem_router:worker_startup_seconds", `worker="c"`, `weights="peer"`, `phase="weights"`); got <= 0 {
		t.Errorf("the router reports c's weights phase as %v", got)
	}

	// Another model file (one byte of the last tensor changed): a refuses it, d loads its
	// own file and says so once.
	other := filepath.Join(t.TempDir(), "other.gguf")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-10] ^= 1
	if err := os.WriteFile(other, data, 0o644); err != nil {
		t.Fatal(err)
	}
	d, dURL := startWeightsEngine(t, r, "d", other, "--weights-from", aORPC)
	d.wait(t, `weights: file `, 5*time.Second)
	if n := strings.Count(d.text(), "not using peer"); n != 1 {
		t.Errorf("d logged %d fallbacks from the peer, want 1:\n%s", n, d.text())
	}
	if got := counter(t, dURL, "tandem:weights_fallbacks_total", `source="peer"`, `reason="other_model"`); got != 1 {
		t.Errorf("d: fallbacks for another model = %v, want 1", got)
	}
}

// SIGKILL of the peer in the middle of a pull: the new engine falls back to its own file,
// counts it, and serves the same bits; nothing of the partial pull is used.
func TestWeightsPeerDiesMidPull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	model := genModel(t)
	r := startRouterProc(t)
	// About 70 MB at 4 MB/s: a pull takes some 17 s, and is cut in its first seconds.
	a, aURL := startWeightsEngine(t, r, "a", model, "--weights-send-rate", "4MB")
	aORPC := a.wait(t, `worker serving ORPC.* addr=(\S+)`, 5*time.Second)[1]
	const prompt = "Once upon a time"
	ref := greedyChoices(t, aURL, prompt, 24)

	b := startProc(t, "b", "tandem", "serve", "--model", model, "--served-model-name", "stories", "--port", "0",
		"--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", "b", "--threads", "1",
		"--weights-from", aORPC, "--no-weight-peers")
	b.wait(t, `weights: pulling from a peer`, 60*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for counter(t, aURL, "tandem:weights_transfer_bytes_total", `direction="sent"`) < 1<<20 {
		if time.Now().After(deadline) {
			t.Fatal("a sent nothing")
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.cmd.Process.Kill()
	<-a.exited
	b.wait(t, `not using peer.*reason=died`, 30*time.Second)
	bURL := b.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
	b.wait(t, `weights: file \S+ \(\d+ packed, 0 imported\); not used: peer: died`, 5*time.Second)
	if got := greedyChoices(t, bURL, prompt, 24); got != ref {
		t.Errorf("b after its peer died: %s\nwant a's: %s", got, ref)
	}
	if got := counter(t, bURL, "tandem:weights_fallbacks_total", `source="peer"`, `reason="died"`); got != 1 {
		t.Errorf("b: fallbacks = %v, want 1", got)
	}
	if got := metricValue(t, bURL, "tandem:weights_prepared", `how="imported"`); got != 0 {
		t.Errorf("b imported %v weights from a cut pull", got)
	}
}
