package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tandem/openai"
)

// streamed is what a streamed completion delivered.
type streamed struct {
	worker, text, finish string
	tokens               int
	err                  error
}

// streamCompletion streams a completion through base and collects it; started is
// signalled once its first event arrived.
func streamCompletion(ctx context.Context, base, body string, started chan<- string, header ...string) streamed {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return streamed{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamed{err: err}
	}
	defer resp.Body.Close()
	out := streamed{worker: resp.Header.Get(openai.WorkerHeader)}
	if resp.StatusCode != 200 {
		out.err = fmt.Errorf("status %d", resp.StatusCode)
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	first := true
	var text strings.Builder
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			out.err = err
			return out
		}
		if ev.Error != nil {
			out.err = fmt.Errorf("error event: %s", ev.Error.Message)
			return out
		}
		if first && started != nil {
			started <- out.worker
			first = false
		}
		for _, c := range ev.Choices {
			text.WriteString(c.Text)
			if c.FinishReason != nil {
				out.finish = *c.FinishReason
			}
		}
		if ev.Usage != nil {
			out.tokens = ev.Usage.CompletionTokens
		}
	}
	out.text, out.err = text.String(), sc.Err()
	return out
}

// drainCluster is a router and two sim engines (40 ms per decode step) as real processes.
type drainCluster struct {
	router  *e2eRouter
	engines map[string]*proc
}

func startDrainCluster(t *testing.T, engineArgs ...string) *drainCluster {
	r := startHardenedRouter(t, "--session-ttl", "1m")
	c := &drainCluster{router: r, engines: map[string]*proc{}}
	for _, name := range []string{"drain-a", "drain-b"} {
		args := append([]string{"serve", "--backend", "sim", "--sim-profile", "cpu", "--port", "0", "--join", r.orpc,
			"--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", name}, engineArgs...)
		p := startProc(t, name, "tandem", args...)
		p.wait(t, `tandem serve: http://`, 60*time.Second)
		c.engines[name] = p
	}
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(r.text(), "worker joined") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the engines did not join:\n%s", r.text())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// sendEight opens 8 streams of one session (so one engine takes them all) and returns
// their results' channel and the engine serving them, once every stream has begun.
func (c *drainCluster) sendEight(t *testing.T, ctx context.Context, maxTokens int) (<-chan streamed, string) {
	t.Helper()
	started := make(chan string, 8)
	results := make(chan streamed, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"tandem-demo","prompt":"Stream number %d","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},"temperature":0}`, i, maxTokens)
			results <- streamCompletion(ctx, c.router.url, body, started, "X-Session-Id", "drain-test")
		})
	}
	go func() { wg.Wait(); close(results) }()
	var worker string
	for range 8 {
		select {
		case w := <-started:
			if worker != "" && w != worker {
				t.Fatalf("the session's streams went to %s and %s", worker, w)
			}
			worker = w
		case <-time.After(30 * time.Second):
			t.Fatal("the streams did not begin")
		}
	}
	return results, worker
}

func exitsZero(t *testing.T, p *proc, within time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, p.err)
		}
	case <-time.After(within):
		t.Errorf("%s still running %v after SIGTERM", p.name, within)
	}
}

// TestEngineDrainsRouterStreams: SIGTERM to an engine serving 8 streams that came
// through a router: all 8 finish with their full text and none migrates, a request sent
// after the SIGTERM goes to the other engine, and the engine exits 0. (Its worker
// context used to end at once and cut them.)
func TestEngineDrainsRouterStreams(t *testing.T) {
	c := startDrainCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	results, serving := c.sendEight(t, ctx, 60)
	victim := c.engines[serving]
	victim.cmd.Process.Signal(syscall.SIGTERM)
	victim.wait(t, `draining`, 10*time.Second)
	code, other, _, out, err := postCompletion(ctx, c.router.url, `{"model":"tandem-demo","prompt":"After the SIGTERM","max_tokens":4}`)
	if err != nil || code != 200 || other == serving || other == "" {
		t.Errorf("a request after the SIGTERM: %d on %q (draining: %s), %v %s", code, other, serving, err, out.Error)
	}
	n := 0
	for r := range results {
		n++
		if r.err != nil || r.finish != "length" || r.tokens != 60 {
			t.Errorf("stream on %s: %d tokens, finish %q, err %v", r.worker, r.tokens, r.finish, r.err)
		}
	}
	if n != 8 {
		t.Errorf("%d streams, want 8", n)
	}
	if m := counter(t, c.router.url, "tandem_router:migrations_total"); m != 0 {
		t.Errorf("%v migrations; a graceful drain migrates none", m)
	}
	exitsZero(t, victim, 30*time.Second)
}

// TestEngineDrainDeadlineMigrates: with --drain-timeout 1s and long streams, the streams
// still running at the deadline are cut with an error their router migrates on: they
// finish on the other engine with the text they would have had, and the engine exits 0.
func TestEngineDrainDeadlineMigrates(t *testing.T) {
	c := startDrainCluster(t, "--drain-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const tokens = 200
	results, serving := c.sendEight(t, ctx, tokens)
	victim := c.engines[serving]
	victim.cmd.Process.Signal(syscall.SIGTERM)
	var got []streamed
	for r := range results {
		got = append(got, r)
	}
	exitsZero(t, victim, 30*time.Second)
	if m := counter(t, c.router.url, "tandem_router:migrations_total"); m < 8 {
		t.Errorf("%v migrations, want the 8 cut streams moved", m)
	}
	for _, r := range got {
		if r.err != nil || r.finish != "length" || r.tokens != tokens {
			t.Errorf("cut stream: %d tokens, finish %q, err %v", r.tokens, r.finish, r.err)
		}
	}
	// The same prompt again, uninterrupted, on the engine left: the same text.
	ref := streamCompletion(ctx, c.router.url, fmt.Sprintf(`{"model":"tandem-demo","prompt":"Stream number 0","max_tokens":%d,"stream":true,"temperature":0}`, tokens), nil)
	found := false
	for _, r := range got {
		found = found || r.text == ref.text
	}
	if ref.err != nil || !found {
		t.Errorf("no migrated stream has the uninterrupted text (%v)", ref.err)
	}
}
