package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tandem/internal/fixtures"
)

// An engine under an ITL target it cannot hold (1 µs: every step with a stream in it is
// predicted past it), real processes on loopback: concurrent requests give the text each
// gives alone (the target cuts prompt chunks, never what they compute), the engine counts
// the steps over the target and corrects its step cost measured at start, and the router's
// load report of the worker carries the count to its /metrics.
func TestEndToEndITLTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two processes")
	}
	r := startRouterProc(t)
	e := startProc(t, "e1", "tandem", "serve", "--model", fixtures.Model(t, "stories260K-f32.gguf"), "--served-model-name", "stories",
		"--port", "0", "--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", "e1",
		"--itl-target", "1us")
	engineURL := e.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
	e.wait(t, `(?m)load time: .*, ITL target 1us$`, 5*time.Second)
	e.wait(t, `measured the step cost for the ITL target`, 5*time.Second)
	e.wait(t, `registered with router`, 30*time.Second)
	r.wait(t, `worker joined.*worker=e1`, 10*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := sdkClient(r.url)
	// Prompts of 40-60 tokens (the fixture's context is 128): long enough for the target
	// to cut their chunks in a step that carries the others' decodes.
	stories := []string{"Lily and Ben played in the park with a big red ball. ", "The cat sat on the mat and looked at the bird. ",
		"Tom had a little boat. He liked to sail it on the pond. ", "One day a girl found a shiny stone under a tree. "}
	prompts := make([]string, len(stories))
	for i, s := range stories {
		prompts[i] = strings.Repeat(s, 3)
	}
	const maxTokens = 24
	alone := make([]string, len(prompts))
	for i, p := range prompts {
		out, _, err := completion(ctx, c, p, maxTokens)
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = out.Choices[0].Text
	}
	for round := range 2 {
		got := make([]string, len(prompts))
		var wg sync.WaitGroup
		errs := make(chan error, len(prompts))
		for i, p := range prompts {
			wg.Go(func() {
				out, _, err := completion(ctx, c, p, maxTokens)
				if err != nil {
					errs <- fmt.Errorf("prompt %d: %w", i, err)
					return
				}
				got[i] = out.Choices[0].Text
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for i := range prompts {
			if got[i] != alone[i] {
				t.Errorf("round %d, prompt %d: %q together, %q alone", round, i, got[i], alone[i])
			}
		}
	}

	over := scrapeValue(t, engineURL+"/metrics", `(?m)^tandem:steps_over_itl_target_total\{[^}]*\} (\S+)$`)
	if over < 1 {
		t.Fatalf("the engine counts %v steps over a 1 µs target after %d requests", over, 3*len(prompts))
	}
	if v := scrapeValue(t, engineURL+"/metrics", `(?m)^tandem:step_cost_profile\{[^}]*source="measured"[^}]*\} (\S+)$`); v != 1 {
		t.Errorf("the engine's step cost profile is not the one it measured at start (%v)", v)
	}
	if f := scrapeValue(t, engineURL+"/metrics", `(?m)^tandem:step_cost_correction\{[^}]*steps="decode"[^}]*\} (\S+)$`); f == 1 {
		t.Errorf("the decode step cost was not corrected by the steps the engine measured (factor %v)", f)
	}
	// The engine is idle now: the router's view reaches the engine's count with the next
	// heartbeat (100 ms).
	re := `(?m)^tandem_router:worker_load\{model="stories",quantity="steps_over_itl_target",worker="e1"\} (\S+)$`
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := scrapeValue(t, r.url+"/metrics", re)
		if v == over {
			break
		}
		if v > over || time.Now().After(deadline) {
			t.Fatalf("the router reports %v steps of e1 over its ITL target, the engine %v", v, over)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrapeValue reads a Prometheus text page and returns the value re's first group
// matches; -1 when no line matches.
func scrapeValue(t *testing.T, url, re string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(re).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return v
}
