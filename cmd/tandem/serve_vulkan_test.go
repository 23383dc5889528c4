package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"

	"tandem/internal/fixtures"
	"tandem/internal/vulkantest"
)

// TestServeVulkanEndToEnd serves the stories model with --device vulkan (on
// lavapipe in CI) as a real process and talks to it with the OpenAI SDK:
// the banner names the device, greedy completions from eight clients at
// once, streaming and not, are llama.cpp's continuation (the CPU backend's
// text), decode steps are replays of recorded command buffers (/metrics
// says so), and a bad request gets an OpenAI-style error. The demo model's
// greedy chat stream is the CPU backend's too.
func TestServeVulkanEndToEnd(t *testing.T) {
	vulkantest.Skip(t)
	for _, c := range []struct{ file, want string }{
		{"stories260K-f32.gguf", ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"},
		{"stories260K-q8_0.gguf", ""}, // Q8_0 kernels: the same text as the CPU backend serves
	} {
		t.Run(c.file, func(t *testing.T) {
			want := c.want
			if want == "" {
				want = cpuCompletion(t, c.file)
			}
			s := startServe(t, "--model", fixtures.Model(t, c.file), "--served-model-name", "stories", "--device", "vulkan", "--kv-cache-memory", "32MiB")
			if m := s.logMatch(regexp.MustCompile(`backend (vulkan:\d+ \([^\n]+\))`)); m == nil {
				t.Errorf("the banner does not name the Vulkan device:\n%s", s.log())
			} else {
				t.Logf("device: %s", m[1])
			}
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			cl := s.client()
			params := sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
				Temperature: sdk.Float(0), MaxTokens: sdk.Int(32)}
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if i%2 == 0 {
						resp, err := cl.Completions.New(ctx, params)
						if err != nil {
							errs <- err
						} else if resp.Choices[0].Text != want || resp.Usage.CompletionTokens != 32 {
							errs <- fmt.Errorf("completion %q usage %+v, want %q", resp.Choices[0].Text, resp.Usage, want)
						}
						return
					}
					st := cl.Completions.NewStreaming(ctx, params)
					var text strings.Builder
					for st.Next() {
						for _, ch := range st.Current().Choices {
							text.WriteString(ch.Text)
						}
					}
					if st.Err() != nil || text.String() != want {
						errs <- fmt.Errorf("stream %q: %v, want %q", text.String(), st.Err(), want)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if _, err := cl.Completions.New(ctx, sdk.CompletionNewParams{Model: "nope", Prompt: params.Prompt}); err == nil || !strings.Contains(err.Error(), "404") {
				t.Errorf("unknown model: %v", err)
			}
			_, metrics := get(t, s.url+"/metrics")
			if !regexp.MustCompile(`tandem:device_step_replays_total\{model_name="stories"\} [1-9]`).MatchString(metrics) {
				t.Errorf("no replayed steps on /metrics:\n%s", grepLines(metrics, "tandem:device_"))
			}
		})
	}
}

func TestServeVulkanChat(t *testing.T) {
	vulkantest.Skip(t)
	chat := func(s *server) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		st := s.client().Chat.Completions.NewStreaming(ctx, sdk.ChatCompletionNewParams{Model: "demo",
			Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("Tell me a story")}, MaxTokens: sdk.Int(24), Temperature: sdk.Float(0)})
		var text strings.Builder
		for st.Next() {
			for _, ch := range st.Current().Choices {
				text.WriteString(ch.Delta.Content)
			}
		}
		if st.Err() != nil || text.Len() == 0 {
			t.Fatalf("chat stream %q: %v", text.String(), st.Err())
		}
		return text.String()
	}
	want := chat(startServe(t, "--served-model-name", "demo", "--kv-cache-memory", "32MiB"))
	if got := chat(startServe(t, "--served-model-name", "demo", "--kv-cache-memory", "32MiB", "--device", "vulkan")); got != want {
		t.Errorf("chat on Vulkan %q, on the CPU %q", got, want)
	}
}

// cpuCompletion is the greedy completion the CPU backend computes for the
// test's prompt, in-process.
func cpuCompletion(t *testing.T, file string) string {
	t.Helper()
	s := startServe(t, "--model", fixtures.Model(t, file), "--served-model-name", "stories", "--kv-cache-memory", "32MiB")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := s.client().Completions.New(ctx, sdk.CompletionNewParams{Model: "stories", Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(32)})
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Process.Kill()
	return resp.Choices[0].Text
}

// bench-engine --device vulkan reports, per test, the steps and how many
// were replays (every one after the warm-up's first of a shape), and with
// --replay=false none is.
func TestBenchEngineVulkan(t *testing.T) {
	vulkantest.Skip(t)
	for _, replay := range []bool{true, false} {
		out, errOut, code := runMain(t, "bench-engine", "--device", "vulkan", "-p", "16", "-n", "4", "--batch", "2", "-r", "2", "-d", "32", "--json", fmt.Sprintf("--replay=%v", replay))
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var results []struct {
			Test     string  `json:"test"`
			Backend  string  `json:"backend"`
			TPS      float64 `json:"tokens_per_second"`
			Steps    int64   `json:"steps"`
			Replays  int64   `json:"replayed_steps"`
			HostUS   float64 `json:"host_us_per_step"`
			SubmitUS float64 `json:"submit_us_per_step"`
		}
		if err := json.Unmarshal([]byte(out), &results); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(results) != 3 {
			t.Fatalf("results %+v", results)
		}
		for _, r := range results {
			wantReplays := r.Steps
			if !replay {
				wantReplays = 0
			}
			if !strings.HasPrefix(r.Backend, "vulkan:") || r.TPS <= 0 || r.Steps == 0 || r.Replays != wantReplays || r.HostUS <= 0 {
				t.Errorf("--replay=%v: %+v", replay, r)
			}
		}
	}
}
