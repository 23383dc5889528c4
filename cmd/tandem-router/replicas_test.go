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
			sims.wait(t, `sim backend: 8 replica\(s\)`, 60*time.Second)
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
			time.Sleep(300 * time.Millisecond) // the holder's KV events reach the router
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
