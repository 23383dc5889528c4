package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tandem/internal/fixtures"
	"tandem/openai"
)

// freePorts returns a free TCP port and a free UDP port on loopback, for a router that must
// come back on the same addresses after a restart.
func freePorts(t *testing.T) (tcp, udp int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return l.Addr().(*net.TCPAddr).Port, pc.LocalAddr().(*net.UDPAddr).Port
}

// postCompletion sends a non-streaming completion and returns the status, the serving
// worker, the Retry-After header and the decoded body.
func postCompletion(ctx context.Context, base, body string, header ...string) (code int, worker, retryAfter string, out completionBody, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", "", out, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", out, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", "", out, err
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &out); err != nil {
			return 0, "", "", out, fmt.Errorf("%w: %s", err, b)
		}
	} else {
		out.Error = string(b)
	}
	return resp.StatusCode, resp.Header.Get(openai.WorkerHeader), resp.Header.Get("Retry-After"), out, nil
}

type completionBody struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error string `json:"-"`
}

// One router and three engines as real processes: session affinity, a worker with the
// wrong block size refused, overload answered 429 while every accepted request completes,
// and a router restart that the engines survive, after which KV-aware routing works again.
func TestEndToEndRouterFeatures(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs six processes")
	}
	httpPort, orpcPort := freePorts(t)
	state := t.TempDir()
	routerArgs := func(extra ...string) []string {
		return append([]string{"--port", strconv.Itoa(httpPort), "--orpc-port", strconv.Itoa(orpcPort), "--state-dir", state,
			"--join-token", e2eToken, "--heartbeat", "100ms", "--heartbeat-timeout", "3s"}, extra...)
	}
	// First run: round-robin, so that only session affinity keeps a conversation in place,
	// and a worker counts as busy with one request before its first token.
	r1 := startProc(t, "tandem-router#1", "tandem-router", routerArgs("--routing", "round-robin", "--busy-waiting", "1", "--queue-timeout", "1ms")...)
	base := r1.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1]
	join := "127.0.0.1:" + strconv.Itoa(orpcPort)
	engines := map[string]*proc{}
	for _, name := range []string{"e1", "e2", "e3"} {
		engines[name] = startEngineProc(t, name, join, e2eToken)
	}
	for name, e := range engines {
		e.wait(t, `registered with router`, 60*time.Second)
		r1.wait(t, `worker joined.*worker=`+name, 10*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	complete := func(t *testing.T, body string, header ...string) (string, completionBody) {
		t.Helper()
		code, wk, _, out, err := postCompletion(ctx, base, body, header...)
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %v %s", body, code, err, out.Error)
		}
		return wk, out
	}

	t.Run("session affinity", func(t *testing.T) {
		conversation := "Once upon a time"
		turn := func(i int) string {
			conversation += fmt.Sprintf(" cat %d", i)
			return fmt.Sprintf(`{"model":"stories","prompt":%q,"max_tokens":4,"temperature":0}`, conversation)
		}
		bound, _ := complete(t, turn(0), "X-Session-Id", "conv-1")
		for i := 1; i < 6; i++ {
			if wk, _ := complete(t, turn(i), "X-Session-Id", "conv-1"); wk != bound {
				t.Fatalf("turn %d of conv-1 went to %q, the conversation is on %q", i, wk, bound)
			}
		}
		// The same conversation without a session id spreads (the test can fail).
		seen := map[string]bool{}
		for i := 6; i < 12; i++ {
			wk, _ := complete(t, turn(i))
			seen[wk] = true
		}
		if len(seen) < 2 {
			t.Fatalf("without a session the turns all went to %v; round-robin should spread them", seen)
		}
	})

	// Started now, it stays up through the router restart below and is refused by both runs.
	odd := startProc(t, "e4-block32", "tandem", "serve", "--model", fixtures.Model(t, "stories260K-f32.gguf"),
		"--served-model-name", "stories", "--port", "0", "--join", join, "--join-token", e2eToken,
		"--state-dir", t.TempDir(), "--node-name", "e4", "--block-size", "32")
	t.Run("mismatched block size refused", func(t *testing.T) {
		r1.wait(t, `refusing worker: model card mismatch.*block size 32, the other workers use 16`, 60*time.Second)
		odd.wait(t, `router refused this worker`, 10*time.Second)
		if regexp.MustCompile(`worker joined.*worker=e4\b`).MatchString(r1.text()) {
			t.Fatal("the router let e4 join")
		}
	})

	t.Run("overload: 429, and every accepted request completes", func(t *testing.T) {
		const maxTokens = 24
		body := fmt.Sprintf(`{"model":"stories","prompt":"The little dog ran","max_tokens":%d,"temperature":0,"ignore_eos":true}`, maxTokens)
		var ok, rejected int
		for wave := 0; wave < 5 && (ok == 0 || rejected == 0); wave++ {
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					code, wk, retry, out, err := postCompletion(ctx, base, body)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						t.Errorf("request failed: %v", err)
					case code == http.StatusOK:
						ok++
						if len(out.Choices) != 1 || out.Choices[0].FinishReason != "length" || out.Usage.CompletionTokens != maxTokens || engines[wk] == nil {
							t.Errorf("an accepted request did not complete: worker %q, %+v", wk, out)
						}
					case code == http.StatusTooManyRequests:
						rejected++
						if retry == "" || !strings.Contains(out.Error, `"error"`) {
							t.Errorf("429 without Retry-After or error body: %q %s", retry, out.Error)
						}
					default:
						t.Errorf("status %d: %s", code, out.Error)
					}
				}()
			}
			wg.Wait()
		}
		if ok == 0 || rejected == 0 {
			t.Fatalf("%d accepted, %d rejected: want both under overload", ok, rejected)
		}
		t.Logf("%d accepted (all complete), %d answered 429", ok, rejected)
	})

	// A long prompt lands somewhere before the restart; KV-aware routing must find it after.
	long := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 5)
	longBody := fmt.Sprintf(`{"model":"stories","prompt":%q,"max_tokens":4,"temperature":0}`, long)
	holder, before := complete(t, longBody)

	t.Run("router restart", func(t *testing.T) {
		// The three engines are held (SIGSTOP) across the restart, so that e4, which retries
		// every 5 s, registers first with the new router: only the card the router remembers
		// (models.json) can refuse it then. (Left to race, the engines, which notice the
		// router's loss after its heartbeat timeout, would often come back first.)
		for _, e := range engines {
			if err := e.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		if err := r1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-r1.exited
		r2 := startProc(t, "tandem-router#2", "tandem-router", routerArgs("--routing", "kv")...)
		base = r2.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1]
		r2.wait(t, `refusing worker: model card mismatch.*block size 32, the other workers use 16.*remembers`, 30*time.Second)
		for _, e := range engines {
			if err := e.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		for name := range engines {
			r2.wait(t, `worker joined.*worker=`+name, 30*time.Second)
		}
		for name, e := range engines {
			select {
			case <-e.exited:
				t.Fatalf("engine %s exited: %v", name, e.err)
			default:
			}
			e.wait(t, `(?s)registered with router.*registered with router`, 10*time.Second) // again, same process
		}
		waitRouterSees(t, base, holder, before.Usage.PromptTokens/16) // snapshots reached the new router
		wk, out := complete(t, longBody)
		if wk != holder {
			t.Errorf("after the restart the long prompt went to %q, its prefix is on %q", wk, holder)
		}
		if out.Usage.PromptTokensDetails.CachedTokens < out.Usage.PromptTokens/2 || out.Choices[0].Text != before.Choices[0].Text {
			t.Errorf("after the restart: %d of %d prompt tokens cached, text %q (before %q)", out.Usage.PromptTokensDetails.CachedTokens,
				out.Usage.PromptTokens, out.Choices[0].Text, before.Choices[0].Text)
		}
	})
}
