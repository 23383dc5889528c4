package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/internal/fixtures"
)

// buildTandem compiles the tandem binary once per test binary run.
var buildTandem = sync.OnceValues(func() (string, error) { return goBuild("tandem", ".") })

// goBuild compiles the package pkg into a temporary directory as name.
func goBuild(name, pkg string) (string, error) {
	dir, err := os.MkdirTemp("", name+"-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

type server struct {
	cmd    *exec.Cmd
	url    string
	stderr *strings.Builder
	mu     *sync.Mutex
	exited chan error
}

// startServe runs `tandem serve --port 0 args...` as a real process and
// waits for the URL it prints.
func startServe(t *testing.T, args ...string) *server {
	t.Helper()
	return startServeEnv(t, nil, args...)
}

// startServeEnv is startServe with env added to the process's environment.
func startServeEnv(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	bin, err := buildTandem()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"serve", "--port", "0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, stderr: &strings.Builder{}, mu: &sync.Mutex{}, exited: make(chan error, 1)}
	urls := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`^tandem serve: (http://\S+)`)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			s.mu.Lock()
			s.stderr.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
		}
	})
	select {
	case s.url = <-urls:
	case err := <-s.exited:
		t.Fatalf("tandem serve exited: %v\n%s", err, s.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("tandem serve printed no URL:\n%s", s.log())
	}
	return s
}

func (s *server) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// logMatch waits up to 10 s for the log to match re (the lines after the
// URL's are read in the background) and returns the submatches, nil if
// they never came.
func (s *server) logMatch(re *regexp.Regexp) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindStringSubmatch(s.log()); m != nil || time.Now().After(deadline) {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *server) client() *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(s.url+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second))
	return &c
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServeEndToEnd(t *testing.T) {
	s := startServe(t, "--model", fixtures.Model(t, "stories260K-f32.gguf"), "--served-model-name", "stories")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := s.client()

	if code, body := get(t, s.url+"/health"); code != 200 {
		t.Errorf("/health: %d %s", code, body)
	}
	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "stories" {
		t.Fatalf("models: %+v %v", models, err)
	}

	// Greedy output through the API equals llama.cpp's continuation, for
	// several clients at once, streaming and not.
	want := ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
	params := sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(32)}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				resp, err := c.Completions.New(ctx, params)
				if err != nil {
					errs <- err
					return
				}
				if resp.Choices[0].Text != want || resp.Usage.PromptTokens != 5 || resp.Usage.CompletionTokens != 32 {
					errs <- fmt.Errorf("completion %q usage %+v", resp.Choices[0].Text, resp.Usage)
				}
				return
			}
			st := c.Completions.NewStreaming(ctx, params)
			var text strings.Builder
			for st.Next() {
				for _, ch := range st.Current().Choices {
					text.WriteString(ch.Text)
				}
			}
			if st.Err() != nil || text.String() != want {
				errs <- fmt.Errorf("stream %q: %v", text.String(), st.Err())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// The second identical prompt reuses cached blocks.
	long := strings.Repeat("Lily and Ben played in the park with a ball. ", 3)
	for range 2 {
		resp, err := c.Completions.New(ctx, sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(long)},
			Temperature: sdk.Float(0), MaxTokens: sdk.Int(4)})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("usage %+v", resp.Usage)
	}
	code, metrics := get(t, s.url+"/metrics")
	for _, name := range []string{"tandem:prompt_tokens_total", "tandem:generation_tokens_total", "tandem:time_to_first_token_seconds_bucket",
		"tandem:prefix_cache_hits_total", "tandem:num_requests_running", "tandem:kv_cache_usage_perc"} {
		if code != 200 || !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !regexp.MustCompile(`tandem:prefix_cache_hits_total\{model_name="stories"\} [1-9]`).MatchString(metrics) {
		t.Errorf("no prefix cache hits after a repeated prompt:\n%s", grepLines(metrics, "prefix_cache"))
	}

	// Bad requests get OpenAI-style errors and the server keeps serving.
	if _, err := c.Completions.New(ctx, sdk.CompletionNewParams{Model: "nope", Prompt: params.Prompt}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := c.Completions.New(ctx, params); err != nil {
		t.Errorf("after a bad request: %v", err)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeDrainsOnSIGTERM sends SIGTERM during a streaming request: the
// stream finishes, then the process exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	s := startServe(t) // the built-in demo model
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := s.client()
	st := c.Chat.Completions.NewStreaming(ctx, sdk.ChatCompletionNewParams{Model: "tandem-demo",
		Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hello")}, MaxTokens: sdk.Int(200),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)}})
	chunks, signalled := 0, false
	var finish string
	var completion int64
	for st.Next() {
		chunks++
		completion += st.Current().Usage.CompletionTokens
		if chunks == 3 && !signalled {
			s.cmd.Process.Signal(syscall.SIGTERM)
			signalled = true
		}
		for _, ch := range st.Current().Choices {
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if st.Err() != nil || finish != "length" || completion != 200 {
		t.Errorf("stream across SIGTERM: %d chunks, %d tokens, finish %q, err %v", chunks, completion, finish, st.Err())
	}
	select {
	case err := <-s.exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, s.log())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("still running 30s after SIGTERM")
	}
}

// TestServeStreamInvariants checks a streamed chat completion from the real
// server: the first chunk carries the role, one id throughout, exactly one
// finish_reason and it is last among choice chunks, the usage chunk has no
// choices and adds up, and the logprob tokens concatenate to the text.
func TestServeStreamInvariants(t *testing.T) {
	// A model with a real vocabulary and chat template (Qwen2's).
	s := startServe(t, "--model", fixtures.Model(t, "rand-qwen2-qwen2vocab-f32.gguf"), "--served-model-name", "qwen")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := s.client()
	st := c.Chat.Completions.NewStreaming(ctx, sdk.ChatCompletionNewParams{
		Model:         "qwen",
		Messages:      []sdk.ChatCompletionMessageParamUnion{sdk.SystemMessage("Be brief."), sdk.UserMessage("Once upon a time")},
		MaxTokens:     sdk.Int(24),
		Logprobs:      sdk.Bool(true),
		TopLogprobs:   sdk.Int(3),
		Seed:          sdk.Int(5),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	})
	var ids []string
	var text, lpText strings.Builder
	finishes, chunks, usageChunks := 0, 0, 0
	var usage sdk.CompletionUsage
	for st.Next() {
		ch := st.Current()
		ids = append(ids, ch.ID)
		if chunks == 0 && (len(ch.Choices) != 1 || ch.Choices[0].Delta.Role != "assistant") {
			t.Errorf("first chunk %+v lacks the assistant role", ch)
		}
		chunks++
		if len(ch.Choices) == 0 {
			usageChunks++
			usage = ch.Usage
			continue
		}
		if usageChunks > 0 {
			t.Error("a choice chunk after the usage chunk")
		}
		if finishes > 0 {
			t.Error("a choice chunk after the finish_reason")
		}
		for _, choice := range ch.Choices {
			text.WriteString(choice.Delta.Content)
			for _, lp := range choice.Logprobs.Content {
				lpText.WriteString(lp.Token)
				if len(lp.TopLogprobs) != 3 {
					t.Errorf("%d top logprobs, want 3", len(lp.TopLogprobs))
				}
			}
			if choice.FinishReason != "" {
				finishes++
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Errorf("chunk ids differ: %q and %q", ids[0], id)
			break
		}
	}
	if finishes != 1 || usageChunks != 1 {
		t.Errorf("%d finish reasons and %d usage chunks, want 1 and 1", finishes, usageChunks)
	}
	if usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens || usage.CompletionTokens == 0 {
		t.Errorf("usage %+v", usage)
	}
	if text.Len() == 0 || lpText.String() != text.String() {
		t.Errorf("logprob tokens %q, text %q", lpText.String(), text.String())
	}
}

// TestServeBadRequestsAndQueue drives the real server with bad requests and
// a full queue; each gets its status and an OpenAI error body, and the
// server answers the next good request.
func TestServeBadRequestsAndQueue(t *testing.T) {
	s := startServe(t, "--max-seqs", "1", "--max-queue", "1", "--api-key", "k", "--public-metrics") // metrics are polled below without the key
	post := func(path, body, key string) (int, http.Header, string) {
		req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	good := `{"model":"tandem-demo","prompt":"hi","max_tokens":2}`
	cases := []struct {
		name, body, key string
		status          int
		want            string
	}{
		{"no key", good, "", 401, `"error"`},
		{"invalid JSON", `{"model":`, "k", 400, `"invalid_request_error"`},
		{"unknown model", `{"model":"gpt-9","prompt":"hi"}`, "k", 404, `"model_not_found"`},
		{"bad temperature", `{"model":"tandem-demo","prompt":"hi","temperature":-3}`, "k", 400, `"temperature"`},
		{"too long", `{"model":"tandem-demo","prompt":"hi","max_tokens":100000}`, "k", 400, `maximum context length`},
		{"bad token id", `{"model":"tandem-demo","prompt":[1,2,99999999]}`, "k", 400, `"error"`},
	}
	for _, tc := range cases {
		code, _, body := post("/v1/completions", tc.body, tc.key)
		if code != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, code, body, tc.status, tc.want)
		}
		if code, _, body := post("/v1/completions", good, "k"); code != 200 {
			t.Fatalf("after %s: %d %s", tc.name, code, body)
		}
	}

	// One running, one waiting: the next is refused with 429 and Retry-After.
	long := `{"model":"tandem-demo","prompt":"hi","max_tokens":3000,"ignore_eos":true}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waitFor := func(running, waiting int, ended chan string) {
		t.Helper()
		wantRunning := fmt.Sprintf("tandem:num_requests_running{model_name=\"tandem-demo\"} %d\n", running)
		wantWaiting := fmt.Sprintf("tandem:num_requests_waiting{model_name=\"tandem-demo\"} %d\n", waiting)
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, m := get(t, s.url+"/metrics")
			if strings.Contains(m, wantRunning) && strings.Contains(m, wantWaiting) {
				return
			}
			select {
			case how := <-ended:
				if ctx.Err() == nil {
					t.Fatalf("a long request ended before the client left: %.300s\n%s", how, s.log())
				}
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("never reached %d running, %d waiting:\n%s\n%s", running, waiting, grepLines(m, "num_requests"), s.log())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ended := make(chan string, 2) // how a long request ended early, if it did
	for i := range 2 {
		req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions", strings.NewReader(long))
		req.Header.Set("Authorization", "Bearer k")
		req.Header.Set("Content-Type", "application/json")
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ended <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ended <- fmt.Sprintf("%d %s", resp.StatusCode, b)
		}()
		waitFor(1, i, ended)
	}
	code, hdr, body := post("/v1/completions", good, "k")
	if code != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(body, `"error"`) {
		t.Errorf("full queue: %d Retry-After %q %s", code, hdr.Get("Retry-After"), body)
	}
	cancel() // both clients go away; their sequences are freed
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _, _ := post("/v1/completions", good, "k"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not recover after the clients left")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBenchAgainstServe runs `tandem bench` against a real `tandem serve`.
func TestBenchAgainstServe(t *testing.T) {
	s := startServe(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	stdout, stderr, code := runMain(t, "bench", "--base-url", s.url, "--workload", "shared-prefix",
		"--shared-prefix-groups", "2", "--shared-prefix-prompts-per-group", "4", "--shared-prefix-system-len", "64",
		"--shared-prefix-question-len", "8", "--shared-prefix-output-len", "8", "--ignore-eos", "--max-concurrency", "4", "--json-out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, stderr, s.log())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Completed  int   `json:"completed"`
		Failed     int   `json:"failed"`
		OutputLens []int `json:"output_lens"`
		Cached     []int `json:"cached_tokens"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	cached := 0
	for _, c := range res.Cached {
		cached += c
	}
	if res.Completed != 8 || res.Failed != 0 || cached == 0 || !strings.Contains(stdout, "TTFT") {
		t.Errorf("completed %d failed %d cached %d:\n%s", res.Completed, res.Failed, cached, stdout)
	}
	for _, n := range res.OutputLens {
		if n != 8 {
			t.Errorf("output lengths %v, want 8 each (ignore_eos)", res.OutputLens)
			break
		}
	}
}
