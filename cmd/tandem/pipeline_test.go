package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tandem/internal/fixtures"
)

// proc is a process of the test whose stderr is kept.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

// startProc runs bin with args until the test ends.
func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(bin, args...))
}

// startCmd starts cmd, collecting its stderr, and kills it when the test ends.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	return p
}

func (p *proc) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// wait waits up to 60 s for the log to match re and returns the submatches.
func (p *proc) wait(t *testing.T, re string) []string {
	t.Helper()
	return p.waitWithin(t, 60*time.Second, re)
}

// waitWithin waits up to d for the log to match re and returns the submatches.
func (p *proc) waitWithin(t *testing.T, d time.Duration, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(d)
	for {
		if m := rx.FindStringSubmatch(p.text()); m != nil {
			return m
		}
		select {
		case <-p.done:
			t.Fatalf("%v exited before printing %q:\n%s", p.cmd.Args, re, p.text())
		case <-deadline:
			t.Fatalf("%v printed no %q:\n%s", p.cmd.Args, re, p.text())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startStage runs stage index of count of the model as a process, linking to next, and
// returns it and the address it listens on for the stage before.
func startStage(t *testing.T, modelPath string, count, index int, next, ca string, extra ...string) (*proc, string) {
	t.Helper()
	bin, err := buildTandem()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--model", modelPath, "--served-model-name", "m", "--port", "0", "--stages", strconv.Itoa(count),
		"--stage", strconv.Itoa(index), "--stage-listen", "127.0.0.1:0", "--stage-ca", ca}
	if next != "" {
		args = append(args, "--stage-next", next)
	}
	p := startProc(t, bin, append(args, extra...)...)
	return p, p.wait(t, `link: (\S+) \(from stage`)[1]
}

// pipelinePrompts are 8 requests of different lengths.
var pipelinePrompts = []string{
	"Once upon a time", "Lily and Ben went to the park", "The cat sat", "One day, a little boy named Tim found a shiny stone",
	"Sue", "The sun was hot and the birds were singing", "Once upon a time, there was a little girl named Lily.", "Her mom",
}

// completeAll sends every prompt at once to base's completions API (greedy, maxTokens
// each) and returns the texts, or fails the test.
func completeAll(t *testing.T, base string, maxTokens int) []string {
	t.Helper()
	out := make([]string, len(pipelinePrompts))
	errs := make([]error, len(pipelinePrompts))
	var wg sync.WaitGroup
	for i, p := range pipelinePrompts {
		wg.Go(func() { out[i], errs[i] = complete1(base, p, maxTokens) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return out
}

func complete1(base, prompt string, maxTokens int) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true})
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	var r struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
		return "", fmt.Errorf("%v: %s", err, b)
	}
	return r.Choices[0].Text, nil
}

// TestServePipelineEndToEnd runs a 3-stage replica as three `tandem serve` processes
// linked over TLS and checks that 8 concurrent greedy completions are one engine's text,
// that the stages refuse another split with a message naming both, and that a stage's
// death makes the replica unhealthy and fails requests with a 503, not a hang, until the
// stage restarts and the replica serves again.
func TestServePipelineEndToEnd(t *testing.T) {
	modelPath := fixtures.Model(t, "stories260K-f32.gguf")
	one := startServe(t, "--model", modelPath, "--served-model-name", "m")
	want := completeAll(t, one.url, 32)

	ca := filepath.Join(t.TempDir(), "ca")
	s2, addr2 := startStage(t, modelPath, 3, 2, "", ca)
	_, addr1 := startStage(t, modelPath, 3, 1, addr2, ca)
	head := startServe(t, "--model", modelPath, "--served-model-name", "m", "--stages", "3", "--stage-next", addr1, "--stage-ca", ca)
	if head.logMatch(regexp.MustCompile(`pipeline: stage 0 of 3 \(layers 0-1\), split 2,2,1, next stage at \S+, 3 micro-batches`)) == nil {
		t.Errorf("the head's banner:\n%s", head.log())
	}
	got := completeAll(t, head.url, 32)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: the 3-stage replica wrote %q, one engine %q", i, got[i], want[i])
		}
	}
	if _, m := get(t, head.url+"/metrics"); !regexp.MustCompile(`tandem:pipeline_steps_total [1-9]`).MatchString(m) {
		t.Errorf("no pipeline steps counted:\n%s", grepLines(m, "pipeline"))
	}

	// A head of another split is refused by stage 1, naming both.
	bin, _ := buildTandem()
	other := exec.Command(bin, "serve", "--model", modelPath, "--served-model-name", "m", "--port", "0", "--stages", "3",
		"--stage-layers", "1,2,2", "--stage-next", addr1, "--stage-ca", ca)
	out, err := other.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "this process serves stage 1 of 3 of m") || !strings.Contains(string(out), "split 1,2,2") {
		t.Errorf("a head of another split: %v\n%s", err, out)
	}
	// The refusal left the replica's link as it was.
	waitHealth(t, head.url, 200)
	if got, err := complete1(head.url, pipelinePrompts[0], 32); err != nil || got != want[0] {
		t.Errorf("after another head was refused: %q %v, want %q", got, err, want[0])
	}

	// The last stage dies: the head's health goes 503 and a request fails with a 503
	// naming the lost stage.
	s2.cmd.Process.Kill()
	<-s2.done
	waitHealth(t, head.url, 503)
	if _, err := complete1(head.url, "Once upon a time", 8); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "stage") {
		t.Errorf("a request with a stage down: %v", err)
	}
	if _, m := get(t, head.url+"/metrics"); !strings.Contains(m, "tandem:pipeline_link_up 0") {
		t.Errorf("link still up in the metrics:\n%s", grepLines(m, "pipeline"))
	}

	// The stage restarts on its address: the replica links up again (dropping its prefix
	// cache) and serves one engine's text.
	startStageAt(t, modelPath, 3, 2, addr2, ca)
	waitHealth(t, head.url, 200)
	got = completeAll(t, head.url, 32)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("after the restart, request %d: %q, one engine %q", i, got[i], want[i])
		}
	}
	if _, m := get(t, head.url+"/metrics"); !strings.Contains(m, "tandem:pipeline_rejoins_total 1") {
		t.Errorf("no rejoin counted:\n%s", grepLines(m, "pipeline"))
	}
}

// startStageAt is startStage on a given address (a restarted stage), retried while the
// port is still held by the process before.
func startStageAt(t *testing.T, modelPath string, count, index int, addr, ca string) {
	t.Helper()
	bin, _ := buildTandem()
	for try := 0; ; try++ {
		p := startProc(t, bin, "serve", "--model", modelPath, "--served-model-name", "m", "--port", "0", "--stages", strconv.Itoa(count),
			"--stage", strconv.Itoa(index), "--stage-listen", addr, "--stage-ca", ca)
		deadline := time.After(60 * time.Second)
		for {
			if strings.Contains(p.text(), "link: "+addr) {
				return
			}
			select {
			case <-p.done:
				if try < 20 && strings.Contains(p.text(), "address already in use") {
					time.Sleep(100 * time.Millisecond)
				} else {
					t.Fatalf("the restarted stage exited:\n%s", p.text())
				}
			case <-deadline:
				t.Fatalf("the restarted stage did not listen:\n%s", p.text())
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
	}
}

// waitHealth waits up to 30 s for base's /health to answer code.
func waitHealth(t *testing.T, base string, code int) {
	t.Helper()
	var last int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if last = resp.StatusCode; last == code {
				return
			}
		}
	}
	t.Fatalf("%s/health answers %d, want %d", base, last, code)
}

// buildRouter compiles the tandem-router binary once per test binary run.
var buildRouter = sync.OnceValues(func() (string, error) { return goBuild("tandem-router", "../tandem-router") })

// streamed is one streaming completion as it arrives.
type streamed struct {
	mu     sync.Mutex
	worker string
	text   strings.Builder
	chunks int
	err    error
	done   chan struct{}
}

func (s *streamed) progress() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.worker, s.chunks
}

// streamCompletion starts a streaming greedy completion on base and reads it in the
// background.
func streamCompletion(base, prompt string, maxTokens int) *streamed {
	s := &streamed{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		fail := func(err error) { s.mu.Lock(); s.err = err; s.mu.Unlock() }
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": maxTokens, "temperature": 0,
			"ignore_eos": true, "stream": true})
		c := http.Client{Timeout: 120 * time.Second}
		resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			fail(err)
			return
		}
		defer resp.Body.Close()
		s.mu.Lock()
		s.worker = resp.Header.Get("X-Tandem-Worker")
		s.mu.Unlock()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			fail(fmt.Errorf("%d %s", resp.StatusCode, b))
			return
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				fail(fmt.Errorf("%v: %s", err, line))
				return
			}
			if ev.Error != nil {
				fail(fmt.Errorf("error event: %s", ev.Error.Message))
				return
			}
			s.mu.Lock()
			for _, ch := range ev.Choices {
				s.text.WriteString(ch.Text)
			}
			s.chunks++
			s.mu.Unlock()
		}
		if err := sc.Err(); err != nil {
			fail(err)
		}
	}()
	return s
}

// TestPipelineReplicaInCluster registers a 2-stage replica (three processes: the head
// joins, its stage does not) with a router beside one whole engine: the router sees one
// worker of 2 stages, and when the replica's stage is SIGKILLed mid-stream its streams
// finish on the other worker with the text one engine writes.
func TestPipelineReplicaInCluster(t *testing.T) {
	modelPath := fixtures.Model(t, "rand-llama-llama3vocab-f32.gguf") // 128256 logits a token: steps take a while
	const maxTokens = 300
	one := startServe(t, "--model", modelPath, "--served-model-name", "m")
	want := make([]string, len(pipelinePrompts))
	for i, p := range pipelinePrompts {
		var err error
		if want[i], err = complete1(one.url, p, maxTokens); err != nil {
			t.Fatal(err)
		}
	}
	one.cmd.Process.Kill()

	router, base, join := startTestRouter(t, "--routing", "round-robin")

	ca := filepath.Join(t.TempDir(), "ca")
	stage, addr := startStage(t, modelPath, 2, 1, "", ca)
	startServe(t, append([]string{"--model", modelPath, "--served-model-name", "m", "--stages", "2", "--stage-next", addr,
		"--stage-ca", ca, "--node-name", "pipe", "--state-dir", t.TempDir()}, join...)...)
	startServe(t, append([]string{"--model", modelPath, "--served-model-name", "m", "--node-name", "whole", "--state-dir", t.TempDir()}, join...)...)
	router.wait(t, `(?s)worker joined[^\n]*stages=2.*worker joined|worker joined(?s:.*)worker joined[^\n]*stages=2`)
	if n := strings.Count(router.text(), "stages=2"); n != 1 {
		t.Errorf("the router saw %d workers of 2 stages, want 1 (the replica is one worker):\n%s", n, router.text())
	}

	var streams []*streamed
	for _, p := range pipelinePrompts {
		streams = append(streams, streamCompletion(base, p, maxTokens))
	}
	// Every stream on the replica is mid-stream (some tokens out), then its stage dies.
	onPipe := 0
	deadline := time.Now().Add(60 * time.Second)
	for _, s := range streams {
		for {
			wk, n := s.progress()
			if wk != "" && (wk != "pipe" || n >= 3) {
				if wk == "pipe" {
					onPipe++
				}
				break
			}
			select {
			case <-s.done:
			case <-time.After(5 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
			}
			break
		}
	}
	if onPipe == 0 {
		t.Fatalf("no stream went to the replica:\n%s", router.text())
	}
	stage.cmd.Process.Kill() // SIGKILL
	for i, s := range streams {
		<-s.done
		if s.err != nil {
			t.Errorf("stream %d (on %s): %v", i, s.worker, s.err)
			continue
		}
		if got := s.text.String(); got != want[i] {
			t.Errorf("stream %d (on %s): %q, one engine wrote %q", i, s.worker, got, want[i])
		}
	}
	if !regexp.MustCompile(`migrating the request" from=pipe generated=[1-9]`).MatchString(router.text()) {
		t.Errorf("no stream migrated from the replica mid-stream:\n%s", router.text())
	}
}

// TestStageFlags: serve's pipeline flags are checked with messages naming the flag.
func TestStageFlags(t *testing.T) {
	for _, tc := range []struct {
		f    stageFlags
		want string // "" for a spec
	}{
		{stageFlags{count: 1}, ""},
		{stageFlags{count: 0}, "--stages 0: want 1 or more"},
		{stageFlags{count: 1, next: "a:1"}, "need --stages 2 or more"},
		{stageFlags{count: 2, index: 2, ca: "d"}, "the stages are numbered 0 to 1"},
		{stageFlags{count: 2, next: "a:1"}, "--stages needs --stage-ca"},
		{stageFlags{count: 2, ca: "d"}, "stage 0 of 2 needs --stage-next"},
		{stageFlags{count: 2, index: 1, ca: "d", next: "a:1", listen: "b:1"}, "it has no --stage-next"},
		{stageFlags{count: 2, index: 1, ca: "d"}, "stage 1 needs --stage-listen"},
		{stageFlags{count: 2, ca: "d", next: "a:1", listen: "b:1"}, "drop --stage-listen"},
		{stageFlags{count: 2, ca: "d", next: "a:1", layers: "3,x"}, "--stage-layers"},
		{stageFlags{count: 2, ca: "d", next: "a:1", micro: -1}, "--micro-batches -1"},
		{stageFlags{count: 2, index: 1, ca: "d", listen: "b:1", layers: "3,2"}, ""},
	} {
		sp, err := tc.f.spec()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.f, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		case tc.want == "" && (sp.Count > 1) != (tc.f.count > 1):
			t.Errorf("%+v: spec %+v", tc.f, sp)
		}
	}
}

// TestServeStagesRefusals: serve refuses what a pipeline replica cannot do yet, saying so,
// before it loads anything.
func TestServeStagesRefusals(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	base := []string{"serve", "--port", "0", "--stages", "2", "--stage-next", "127.0.0.1:1", "--stage-ca", ca}
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--itl-target", "2x"}, "--itl-target with --stages"},
		{[]string{"--kv-host-memory", "1GiB"}, "the KV tiers (--kv-host-memory, --kv-disk-dir, --kv-shared-dir) of a pipeline replica"},
		{[]string{"--backend", "sim"}, "--backend sim models a forward pass"},
		{[]string{"--pack-cache", t.TempDir()}, "--pack-cache and --weights-from"},
		{[]string{"--lora", "a=/x"}, "LoRA adapters on a pipeline replica"},
		{[]string{"--speculative", "ngram"}, "speculative decoding on a pipeline replica"},
	} {
		_, stderr, code := runMain(t, append(slices.Clone(base), tc.extra...)...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q, want %q", tc.extra, code, stderr, tc.want)
		}
	}
}
