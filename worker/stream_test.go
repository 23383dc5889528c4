package worker_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"

	"tandem/router"
	"tandem/router/live"
	"tandem/sim"
)

// volatileSSE matches what differs between two answers of the same request: ids and
// creation times.
var volatileSSE = regexp.MustCompile(`"(id|created)":("[^"]*"|[0-9]+)`)

// streamBody streams a completion request through base and returns its events, ids and
// times blanked.
func streamBody(t *testing.T, base, body string) string {
	t.Helper()
	resp, b, _ := post(t, base, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return volatileSSE.ReplaceAllString(b, "X")
}

// streamRouter starts a router with cfg's stream settings (default policy, 50 ms
// heartbeats) and one worker, w1, joined to it.
func streamRouter(t *testing.T, cfg live.Config) *testCluster {
	t.Helper()
	cfg.Policy, cfg.Heartbeat, cfg.HeartbeatTimeout = router.DefaultConfig(), 50*time.Millisecond, 2*time.Second
	c := startRouterLive(t, cfg)
	c.addWorker("w1", c.router.Token.String(), 0)
	c.waitWorkers(1)
	return c
}

// A router that streams tokens several to a message and several to a write
// (--stream-interval) sends the client the very events of one that streams them one at a
// time: every token, in order, with its logprobs, the finish and the usage.
func TestStreamIntervalSameEvents(t *testing.T) {
	bodies := []string{
		`{"model":"stories","prompt":"Once upon a time","max_tokens":40,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"stories","prompt":"The dog","max_tokens":23,"temperature":0,"stream":true,"logprobs":3}`,
		`{"model":"stories","prompt":"Lily","max_tokens":31,"temperature":0.9,"seed":5,"stream":true,"return_token_ids":true}`,
		`{"model":"stories","prompt":"Tom","max_tokens":30,"temperature":0,"stream":true,"stop":[" the"]}`,
	}
	var answers [2][]string
	for k, interval := range []int{1, 4} {
		c := streamRouter(t, live.Config{StreamInterval: interval})
		for _, body := range bodies {
			answers[k] = append(answers[k], streamBody(t, c.router.URL(), body))
		}
	}
	for i, body := range bodies {
		if answers[1][i] != answers[0][i] {
			t.Errorf("%s\nwith --stream-interval 4:\n%s\none token at a time:\n%s", body, answers[1][i], answers[0][i])
		}
		if !strings.Contains(answers[0][i], "data: [DONE]") {
			t.Errorf("%s: no end: %s", body, answers[0][i])
		}
	}
}

// An answer that is not streamed has its tokens sent many to a message (the router's
// CollectedInterval, 64 by default) and is the very answer of one sent a token to a
// message: text, token ids, logprobs, finish and usage, with n > 1 and seeded sampling
// too; a request with stop strings keeps a token to a message (its stop is matched on
// the router's side) and answers the same either way.
func TestCollectedAnswersSame(t *testing.T) {
	bodies := []string{
		`{"model":"stories","prompt":"Once upon a time","max_tokens":120,"temperature":0,"logprobs":2,"ignore_eos":true}`,
		`{"model":"stories","prompt":"Lily","max_tokens":90,"temperature":0.9,"seed":5,"return_token_ids":true}`,
		`{"model":"stories","prompt":"The dog","max_tokens":70,"temperature":0.8,"seed":3,"n":2}`,
		`{"model":"stories","prompt":"Tom","max_tokens":60,"temperature":0,"stop":[" the"]}`,
	}
	var answers [2][]string
	for k, interval := range []int{1, 0} {
		c := streamRouter(t, live.Config{CollectedInterval: interval})
		for _, body := range bodies {
			resp, b, _ := post(t, c.router.URL(), body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			answers[k] = append(answers[k], volatileSSE.ReplaceAllString(b, "X"))
		}
	}
	for i, body := range bodies {
		if answers[1][i] != answers[0][i] {
			t.Errorf("%s\n%d tokens to a message:\n%s\none token to a message:\n%s", body, live.DefaultCollectedInterval, answers[1][i], answers[0][i])
		}
		if !strings.Contains(answers[0][i], `"completion_tokens"`) {
			t.Errorf("%s: no usage: %s", body, answers[0][i])
		}
	}
}

// A client that goes away in the middle of a stream sent several tokens to a message
// frees its sequence on the worker at once.
func TestStreamIntervalCancel(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond,
		HeartbeatTimeout: 2 * time.Second, StreamInterval: 3})
	// Modelled decode steps of 10 ms: the sequence runs for more than a second.
	n := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{timing: &sim.Timing{DecodeBase: 10}})
	c.waitWorkers(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.router.URL()+"/v1/completions", strings.NewReader(
		`{"model":"stories","prompt":"Once upon a time","max_tokens":120,"ignore_eos":true,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for events := 0; events < 8 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if st := n.eng.Stats(); st.Running != 1 {
		t.Fatalf("running sequences mid-stream: %d, want 1", st.Running)
	}
	cancel()
	waitFor(t, "the engine to free the sequence", func() bool {
		st := n.eng.Stats()
		return st.Running+st.Waiting == 0
	})
}

// A worker that dies in the middle of a stream sent several tokens to a message: the
// request moves to the other worker with the tokens received so far, and the client gets
// exactly the uninterrupted greedy text and usage.
func TestStreamIntervalMigration(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond,
		HeartbeatTimeout: 2 * time.Second, StreamInterval: 4})
	c.slow = 5 * time.Millisecond
	nodes := c.addWorkers("w1", "w2")
	params := sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(96),
	}
	want, _ := complete(t, direct(t, nodes["w1"]), "Once upon a time", 96)
	got, err := killMidStream(t, c, nodes, params)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if got != want.Choices[0].Text {
		t.Errorf("after a migration got %q, want %q", got, want.Choices[0].Text)
	}
	if !strings.Contains(c.logs.String(), "migrating the request") {
		t.Error("the router did not log a migration")
	}
}
