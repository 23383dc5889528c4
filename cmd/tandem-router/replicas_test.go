package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// One real tandem-router and one `tandem serve --backend sim --replicas 8` process: eight
// simulated workers, each its own engine and ORPC endpoint, join the router, and requests
// are routed across all of them (round-robin reaches each). With kv routing, a repeated long
// prompt stays with the replica whose prefix cache holds it.
func TestSimReplicasBehindRouter(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two processes")
	}
	const n = 8
	for _, mode := range []string{"round-robin", "kv"} {
		t.Run(mode, func(t *testing.T) {
			p := startProc(t, "tandem-router", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(),
				"--join-token", e2eToken, "--heartbeat", "100ms", "--heartbeat-timeout", "3s", "--queue-timeout", "5s", "--routing", mode)
			r := &e2eRouter{proc: p, url: p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1], orpc: p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]}
			sims := startProc(t, "sims", "tandem", "serve", "--backend", "sim", "--replicas", fmt.Sprint(n), "--sim-profile", "gpu",
				"--served-model-name", "stories", "--node-name", "sim", "--kv-cache-memory", "64MiB",
				"--port", "0", "--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir())
			sims.wait(t, `sim backend: 8 replicas`, 60*time.Second)
			for i := range n {
				r.wait(t, fmt.Sprintf(`worker joined.*worker=sim-%d `, i), 30*time.Second)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := sdkClient(r.url)

			// 4n different prompts at once: every replica serves some.
			var mu sync.Mutex
			served := map[string]int{}
			var wg sync.WaitGroup
			errs := make(chan error, 4*n)
			for i := range 4 * n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, wk, err := completion(ctx, c, fmt.Sprintf("request %d asks something of its own, at some length", i), 16)
					if err != nil {
						errs <- err
						return
					}
					if out.Usage.CompletionTokens != 16 {
						errs <- fmt.Errorf("request %d: %d tokens, want 16", i, out.Usage.CompletionTokens)
					}
					mu.Lock()
					served[wk]++
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			t.Logf("requests per replica: %v", served)
			// Round-robin reaches every replica whatever the timing; kv spreads distinct
			// prompts only as far as they overlap in time, so it is not held to it.
			for i := range n {
				if name := fmt.Sprintf("sim-%d", i); mode == "round-robin" && served[name] == 0 {
					t.Errorf("replica %s served nothing: %v", name, served)
				}
			}
			if len(served) == 0 {
				t.Fatal("no request named its worker")
			}
			if mode != "kv" {
				return
			}
			long := strings.Repeat("a long shared system prompt that fills several KV blocks. ", 6)
			first, holder, err := completion(ctx, c, long, 4)
			if err != nil {
				t.Fatal(err)
			}
			waitRouterSees(t, r.url, holder, int(first.Usage.PromptTokens)/16)
			for range 3 {
				out, wk, err := completion(ctx, c, long, 4)
				if err != nil {
					t.Fatal(err)
				}
				if wk != holder || out.Choices[0].Text != first.Choices[0].Text || out.Usage.PromptTokensDetails.CachedTokens == 0 {
					t.Errorf("repeat went to %s (holder %s), text %q (first %q), %d cached tokens",
						wk, holder, out.Choices[0].Text, first.Choices[0].Text, out.Usage.PromptTokensDetails.CachedTokens)
				}
			}
		})
	}
}

// Sim replicas as disaggregated pools: two prefill and two decode replicas (two processes)
// behind a router that must prefill remotely. Sim engines hold no KV memory, yet every
// request goes through a remote prefill and a KV pull of payload-free blocks and completes;
// the transfer metrics count the bytes the blocks stand for.
func TestSimReplicasDisaggregated(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	p := startProc(t, "tandem-router", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(),
		"--join-token", e2eToken, "--heartbeat", "100ms", "--queue-timeout", "5s", "--disagg-strict", "--disagg-min-tokens", "32")
	r := &e2eRouter{proc: p, url: p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1], orpc: p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]}
	urls := map[string]string{}
	for _, role := range []string{"prefill", "decode"} {
		e := startProc(t, role, "tandem", "serve", "--backend", "sim", "--replicas", "2", "--role", role, "--served-model-name", "stories",
			"--node-name", role, "--port", "0", "--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir())
		urls[role] = e.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
		for i := range 2 {
			r.wait(t, fmt.Sprintf(`worker joined.*worker=%s-%d `, role, i), 60*time.Second)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := sdkClient(r.url)
	const n = 8
	for i := range n {
		out, _, err := completion(ctx, c, fmt.Sprintf("request %d: %s", i, strings.Repeat("a prompt long enough for a remote prefill. ", 4)), 8)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if out.Usage.CompletionTokens != 8 {
			t.Errorf("request %d: %d tokens, want 8", i, out.Usage.CompletionTokens)
		}
	}
	if got := counter(t, r.url, "tandem_router:prefills_total", `where="remote"`); got < n {
		t.Errorf("%v remote prefills, want %d", got, n)
	}
	// The KV transfer metrics are per process (both replicas'), on replica 0's /metrics.
	sent := counter(t, urls["prefill"], "tandem:kv_transfer_blocks_total", `direction="sent"`)
	got := counter(t, urls["decode"], "tandem:kv_transfer_blocks_total", `direction="received"`)
	if got < n || sent != got {
		t.Errorf("KV blocks sent %v, received %v; want equal and ≥ %d", sent, got, n)
	}
	sentB := counter(t, urls["prefill"], "tandem:kv_transfer_bytes_total", `direction="sent"`)
	gotB := counter(t, urls["decode"], "tandem:kv_transfer_bytes_total", `direction="received"`)
	if gotB <= 0 || sentB != gotB {
		t.Errorf("KV bytes sent %v, received %v; want equal and the modelled size of %v blocks", sentB, gotB, got)
	}
}
