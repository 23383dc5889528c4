package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// plannerTiming is the engines' modelled speed and the planner's model of it: 256-token
// prompts take 276 ms to prefill, a decode step 20 ms + 1 ms a sequence, so that one
// engine meets a 1 s TTFT and 50 ms ITL up to about 1.5 requests per second.
const plannerTiming = `{"prefill_base_ms": 20, "prefill_per_token_ms": 1, "prefill_per_token2_ms": 0, "decode_base_ms": 20, "decode_per_seq_ms": 1, "decode_per_kv_token_ms": 0}`

// TestEndToEndPlannerLocal runs the router with the SLA planner and its local connector:
// real engine processes (the sim backend, whose steps take the modelled time) started and
// drained by the planner as the load rises to 5 requests per second and falls back to
// 0.5. The pool grows from 1 to its maximum of 4 and shrinks back to 1; no request fails,
// and every removed engine drained before it went.
func TestEndToEndPlannerLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a router and up to 4 engine processes for about a minute")
	}
	bins, err := buildBins()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	timing := filepath.Join(dir, "timing.json")
	if err := os.WriteFile(timing, []byte(plannerTiming), 0o600); err != nil {
		t.Fatal(err)
	}
	engine := fmt.Sprintf("%s serve --backend sim --sim-profile %s --served-model-name demo", filepath.Join(bins, "tandem"), timing)
	rp := startProc(t, "tandem-router", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", filepath.Join(dir, "router"),
		"--join-token", e2eToken, "--heartbeat", "100ms", "--queue-timeout", "10s", "--sla-ttft", "1s", "--sla-itl", "50ms",
		"--planner", "--planner-engine", engine, "--planner-timing", timing, "--planner-interval", "4s", "--planner-load-interval", "1s",
		"--planner-startup", "1s", "--planner-down-cooldown", "4s", "--planner-max", "4", "--planner-engine-drain-timeout", "20s")
	url := rp.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1]
	rp.wait(t, `worker joined.*worker=planner-both-1 `, 60*time.Second)

	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var firstErr atomic.Value
	// load sends requests at rate per second until until() says so or the time runs out.
	load := func(rate float64, limit time.Duration, until func() bool) bool {
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		deadline := time.After(limit)
		for n := 0; ; n++ {
			if f := failed.Load(); f > 0 {
				t.Fatalf("%d requests failed; the first: %v", f, firstErr.Load())
			}
			if n%int(max(1, rate)) == 0 && until() {
				return true
			}
			select {
			case <-deadline:
				return false
			case <-tick.C:
			}
			// A prompt of its own: the planner sizes for 256 uncached tokens a request.
			seq := sent.Add(1)
			prompt := make([]int, 256)
			for i := range prompt {
				prompt[i] = 1 + int((seq*7919+int64(i)*104729)%259)
			}
			wg.Go(func() {
				if err := plannerRequest(ctx, url, prompt); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			})
		}
	}
	// gauge reads tandem_router:planner_NAME, the sample with the labels given (0: none).
	gauge := func(name string, labels ...string) float64 {
		return counter(t, url, "tandem_router:planner_"+name, labels...)
	}
	if !load(5, 90*time.Second, func() bool { return gauge("replicas", `pool="both"`, `state="ready"`) >= 4 }) {
		t.Fatalf("the pool did not reach 4 ready engines under 5 requests/s: metrics\n%s", plannerMetrics(url))
	}
	load(5, 3*time.Second, func() bool { return false }) // a little while at 4
	removed := func() float64 {
		return gauge("scale_downs_total", `pool="both"`, `result="drained"`) + gauge("scale_downs_total", `pool="both"`, `result="migrated"`)
	}
	if !load(0.5, 120*time.Second, func() bool {
		return gauge("replicas", `pool="both"`, `state="running"`) == 1 && gauge("replicas", `pool="both"`, `state="draining"`) == 0 && removed() >= 3
	}) {
		t.Fatalf("the pool did not shrink back to 1 under 0.5 requests/s: metrics\n%s", plannerMetrics(url))
	}
	wg.Wait()

	if f := failed.Load(); f != 0 {
		t.Errorf("%d of %d requests failed; the first: %v", f, sent.Load(), firstErr.Load())
	}
	started := len(regexp.MustCompile(`local: starting engine`).FindAllString(rp.text(), -1))
	drained := gauge("scale_downs_total", `pool="both"`, `result="drained"`)
	migrated := gauge("scale_downs_total", `pool="both"`, `result="migrated"`)
	if int(drained+migrated) != started-1 || started < 4 {
		t.Errorf("%d engines started, %v removed drained and %v migrated: want every one but the last removed", started, drained, migrated)
	}
	if n := len(regexp.MustCompile(`planner: retired worker left" .*result=(drained|migrated)`).FindAllString(rp.text(), -1)); n != started-1 {
		t.Errorf("the log names %d retired workers leaving, want %d", n, started-1)
	}
	if e := gauge("connector_errors_total", `pool="both"`); e != 0 {
		t.Errorf("%v connector errors", e)
	}
	t.Logf("%d requests, %d failed; %d engines started, %v drained, %v migrated", sent.Load(), failed.Load(), started, drained, migrated)
}

// plannerRequest sends one completion and checks it generated every token asked for.
func plannerRequest(ctx context.Context, url string, prompt []int) error {
	body, _ := json.Marshal(map[string]any{"model": "demo", "prompt": prompt, "max_tokens": 32, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return err
	}
	if out.Usage.CompletionTokens != 32 {
		return fmt.Errorf("%d completion tokens, want 32", out.Usage.CompletionTokens)
	}
	return nil
}

// plannerMetrics is the planner's part of url's /metrics, for a failure's message.
func plannerMetrics(url string) string {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "tandem_router:planner_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
