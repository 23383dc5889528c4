package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/internal/fixtures"
	"tandem/openai"
)

// buildBins compiles tandem-router and tandem once per test binary run.
var buildBins = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "tandem-e2e-bin")
	if err != nil {
		return "", err
	}
	for _, b := range []struct{ out, pkg string }{{"tandem-router", "."}, {"tandem", "tandem/cmd/tandem"}} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return dir, nil
})

// proc is a real process whose stderr is kept and watched.
type proc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	log    strings.Builder
	lines  chan struct{} // closed and replaced on every line
	exited chan struct{}
	err    error // Wait's result, set before exited is closed
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	dir, err := buildBins()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: exec.Command(filepath.Join(dir, bin), args...), lines: make(chan struct{}), exited: make(chan struct{})}
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			close(p.lines)
			p.lines = make(chan struct{})
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not exit after SIGKILL", name)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.text())
		}
	})
	return p
}

func (p *proc) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// wait waits up to d for re to match the process's log and returns the match.
func (p *proc) wait(t *testing.T, re string, d time.Duration) []string {
	t.Helper()
	m, exited := p.logged(re, d)
	switch {
	case m != nil:
		return m
	case exited:
		t.Fatalf("%s exited (%v) before logging %q:\n%s", p.name, p.err, re, p.text())
	default:
		t.Fatalf("%s did not log %q within %v:\n%s", p.name, re, d, p.text())
	}
	return nil
}

// logged waits up to d for re to match the process's log and returns the match, nil if
// the time ran out or the process exited first (exited says which).
func (p *proc) logged(re string, d time.Duration) (m []string, exited bool) {
	rx := regexp.MustCompile(re)
	deadline := time.After(d)
	for {
		p.mu.Lock()
		m := rx.FindStringSubmatch(p.log.String())
		lines := p.lines
		p.mu.Unlock()
		if m != nil {
			return m, false
		}
		select {
		case <-lines:
		case <-p.exited:
			return rx.FindStringSubmatch(p.text()), true
		case <-deadline:
			return nil, false
		}
	}
}

const e2eToken = "e2e123.0123456789abcdef"

type e2eRouter struct {
	*proc
	url, orpc string
}

func startRouterProc(t *testing.T) *e2eRouter {
	p := startProc(t, "tandem-router", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(),
		"--join-token", e2eToken, "--heartbeat", "100ms", "--heartbeat-timeout", "3s", "--queue-timeout", "2s")
	url := p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1]
	addr := p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]
	return &e2eRouter{proc: p, url: url, orpc: addr}
}

func startEngineProc(t *testing.T, name, join, token string) *proc {
	return startProc(t, name, "tandem", "serve", "--model", fixtures.Model(t, "stories260K-f32.gguf"), "--served-model-name", "stories",
		"--port", "0", "--join", join, "--join-token", token, "--state-dir", t.TempDir(), "--node-name", name)
}

func sdkClient(url string) *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second))
	return &c
}

func completion(ctx context.Context, c *sdk.Client, prompt string, maxTokens int, opts ...option.RequestOption) (*sdk.Completion, string, error) {
	var resp *http.Response
	out, err := c.Completions.New(ctx, sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(int64(maxTokens))}, append(opts, option.WithResponseInto(&resp))...)
	if err != nil {
		return nil, "", err
	}
	return out, resp.Header.Get(openai.WorkerHeader), nil
}

// One router and three engines, real processes on loopback, driven with the OpenAI SDK.
func TestEndToEndCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four processes")
	}
	r := startRouterProc(t)
	engines := map[string]*proc{}
	for _, name := range []string{"e1", "e2", "e3"} {
		engines[name] = startEngineProc(t, name, r.orpc, e2eToken)
	}
	for name, e := range engines {
		e.wait(t, `tandem serve: http://`, 60*time.Second)
		e.wait(t, `registered with router`, 30*time.Second)
		r.wait(t, `worker joined.*worker=`+name, 10*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := sdkClient(r.url)

	// Greedy text through the router equals a single engine's (llama.cpp's continuation,
	// as cmd/tandem's serve test has it).
	const want = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
	out, wk, err := completion(ctx, c, "Once upon a time", 32)
	if err != nil {
		t.Fatal(err)
	}
	if out.Choices[0].Text != want || engines[wk] == nil {
		t.Errorf("router: %q from worker %q, want %q from e1..e3", out.Choices[0].Text, wk, want)
	}

	// A repeated long prompt stays on the worker that holds it and reports cached tokens.
	long := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 5)
	first, holder, err := completion(ctx, c, long, 4)
	if err != nil {
		t.Fatal(err)
	}
	waitRouterSees(t, r.url, holder, int(first.Usage.PromptTokens)/16)
	for i := range 3 {
		out, wk, err := completion(ctx, c, long, 4)
		if err != nil {
			t.Fatal(err)
		}
		if wk != holder {
			t.Errorf("repeat %d went to %q, the prefix is on %q", i, wk, holder)
		}
		if cached := out.Usage.PromptTokensDetails.CachedTokens; cached < out.Usage.PromptTokens/2 {
			t.Errorf("repeat %d: %d of %d prompt tokens cached", i, cached, out.Usage.PromptTokens)
		}
		if out.Choices[0].Text != first.Choices[0].Text {
			t.Errorf("repeat %d: %q, first %q", i, out.Choices[0].Text, first.Choices[0].Text)
		}
	}

	// SIGKILL the worker of a stream in the middle: the stream completes with the tokens of
	// an uninterrupted run, and later requests succeed on the others. The fixture model is
	// tiny: on a loaded machine its worker can send all its tokens before the kill lands, and
	// then nothing is left to migrate; the test then kills the next stream's worker (one
	// more try, as two of the three engines may go).
	const prompt, maxTokens = "Once upon a time", 120 // the fixture's context is 128
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	ref, _, err := completion(ctx, c, prompt, maxTokens, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	var killed []string
	for try := 1; ; try++ {
		victim := killMidStream(t, ctx, c, engines, prompt, maxTokens, ignoreEOS, ref.Choices[0].Text)
		killed = append(killed, victim)
		r.wait(t, `worker left.*worker=`+victim, 15*time.Second)
		if m, _ := r.logged("migrating the request", 5*time.Second); m != nil {
			break
		}
		if try == 2 {
			t.Fatalf("the router logged no migration after %v died mid-stream", killed)
		}
		t.Logf("%s finished its stream before the kill landed; killing the next stream's worker", victim)
	}
	// The router's /metrics account for it.
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scrape, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"tandem_router:migrations_total 1", "tandem_router:worker_joins_total 3", fmt.Sprintf("tandem_router:worker_losses_total %d", len(killed)),
		"tandem_router:routing_decision_seconds_count", "tandem_router:predicted_hit_blocks_total", "tandem_router:queue_depth 0",
		`tandem_router:worker_load{model="stories",quantity="kv_usage",worker="`,
	} {
		if !strings.Contains(string(scrape), want) {
			t.Errorf("router /metrics lacks %q", want)
		}
	}
	for i := range 4 {
		out, wk, err := completion(ctx, c, fmt.Sprintf("The little dog number %d", i), 8)
		if err != nil {
			t.Fatalf("request %d after losing %v: %v", i, killed, err)
		}
		if slices.Contains(killed, wk) || engines[wk] == nil || len(out.Choices) != 1 {
			t.Errorf("request %d after losing %v served by %q", i, killed, wk)
		}
	}
}

// killMidStream streams prompt, SIGKILLs the worker that serves it as the first chunk
// arrives, checks that the stream still completes with want, waits for the worker to exit
// and returns its name.
func killMidStream(t *testing.T, ctx context.Context, c *sdk.Client, engines map[string]*proc, prompt string, maxTokens int, opt option.RequestOption, want string) string {
	t.Helper()
	var resp *http.Response
	stream := c.Completions.NewStreaming(ctx, sdk.CompletionNewParams{Model: "stories",
		Prompt:      sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(int64(maxTokens))}, opt, option.WithResponseInto(&resp))
	var text strings.Builder
	killed := ""
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Text)
		}
		if killed == "" {
			killed = resp.Header.Get(openai.WorkerHeader)
			victim := engines[killed]
			if victim == nil {
				t.Fatalf("X-Tandem-Worker %q", killed)
			}
			if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream after killing %s: %v", killed, err)
	}
	if text.String() != want {
		t.Errorf("after killing %s mid-stream got %d bytes %q…, want %d bytes %q…", killed, text.Len(), head(text.String()),
			len(want), head(want))
	}
	select {
	case <-engines[killed].exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s survived SIGKILL", killed)
	}
	return killed
}

// waitRouterSees polls the router's /metrics until it indexes at least blocks KV blocks of
// worker and predicts no load there (its KV events and a load report after the last request
// have arrived), for up to 20 s.
func waitRouterSees(t *testing.T, routerURL, worker string, blocks int) {
	t.Helper()
	line := regexp.MustCompile(`(?m)^tandem_router:worker_load\{model="[^"]*",quantity="([a-z_]+)",worker="` + regexp.QuoteMeta(worker) + `"\} (\S+)$`)
	deadline := time.Now().Add(20 * time.Second)
	var last map[string]float64
	for {
		if resp, err := http.Get(routerURL + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = map[string]float64{}
			for _, m := range line.FindAllStringSubmatch(string(b), -1) {
				last[m[1]], _ = strconv.ParseFloat(m[2], 64)
			}
			if last["index_blocks"] >= float64(blocks) && last["prefill_blocks"] == 0 && last["decode_blocks"] == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's view of %s after 20 s: %v; want ≥ %d indexed blocks and no load", worker, last, blocks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func head(s string) string {
	if len(s) > 60 {
		return s[:60]
	}
	return s
}

// An engine with the wrong join token is refused with a clear message on both sides.
// (tandem serve logs "cluster membership failed" and keeps serving its own HTTP API; it
// does not exit, so the exit status is not checked here.)
func TestEndToEndWrongJoinToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two processes")
	}
	r := startRouterProc(t)
	e := startEngineProc(t, "intruder", r.orpc, "wrong1.0123456789abcdef")
	e.wait(t, `join token rejected`, 60*time.Second)
	r.wait(t, `join token rejected`, 10*time.Second)
	if strings.Contains(e.text(), "registered with router") {
		t.Error("an engine with a wrong token registered")
	}
	// The engine does not linger outside its cluster: it exits non-zero.
	select {
	case <-e.exited:
		if e.err == nil {
			t.Errorf("engine exited 0 after its join token was rejected:\n%s", e.text())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("engine still running 30s after its join token was rejected")
	}
}
