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
var buildTandem = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "tandem-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "tandem")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

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
	bin, err := buildTandem()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"serve", "--port", "0"}, args...)...)
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
		Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Hello")}, MaxTokens: sdk.Int(200)})
	chunks, signalled := 0, false
	var finish string
	for st.Next() {
		chunks++
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
	if st.Err() != nil || finish != "length" || chunks < 200 {
		t.Errorf("stream across SIGTERM: %d chunks, finish %q, err %v", chunks, finish, st.Err())
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
