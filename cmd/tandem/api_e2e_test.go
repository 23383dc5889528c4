package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"tandem/internal/fixtures"
)

// vllmDashboardSeries are the series vLLM's stock Grafana dashboard
// (examples/online_serving/prometheus_grafana/grafana.json) queries, each by model_name.
var vllmDashboardSeries = []string{
	"vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count",
	"vllm:prompt_tokens_total", "vllm:generation_tokens_total",
	"vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
	"vllm:num_requests_running", "vllm:num_requests_waiting",
	"vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
	"vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
	"vllm:request_success_total", "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
	"vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_sum",
	// The other metrics the issue names.
	"vllm:request_params_n_bucket", "vllm:request_params_max_tokens_bucket", "vllm:request_inference_time_seconds_bucket", "vllm:cache_config_info",
}

// A stored response survives a restart of the process (the same --state-dir), and expires
// by --response-ttl, counted; the model's id is its file's name; --metrics-prefix vllm
// serves what vLLM's stock dashboard reads, beside tandem's own names; CORS and the
// request id on a real server.
func TestServeResponsesSurviveRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the server three times")
	}
	dir := t.TempDir()
	model := fixtures.Model(t, "rand-qwen2-qwen2vocab-f32.gguf")
	args := []string{"--model", model, "--state-dir", dir, "--kv-cache-memory", "64MiB", "--metrics-prefix", "vllm", "--allowed-origins", "http://app.test"}
	s := startServe(t, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := s.client()
	const id = "rand-qwen2-qwen2vocab-f32"
	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != id {
		t.Fatalf("models: %+v %v (want the file's name, not general.name)", models, err)
	}
	if !strings.Contains(s.log(), "responses: stored in "+dir) {
		t.Errorf("the banner does not say where responses are kept:\n%s", s.log())
	}
	var raw *http.Response
	noThinking := option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false})
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: id, Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("Hello")},
		MaxOutputTokens: sdk.Int(6), Temperature: sdk.Float(0)}, noThinking, option.WithResponseInto(&raw),
		option.WithHeader("X-Request-Id", "e2e-req-1"), option.WithHeader("Origin", "http://app.test"))
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("X-Request-Id") != "e2e-req-1" || raw.Header.Get("Access-Control-Allow-Origin") != "http://app.test" {
		t.Errorf("headers %v", raw.Header)
	}
	_, metrics := get(t, s.url+"/metrics")
	for _, series := range vllmDashboardSeries {
		if !regexp.MustCompile(regexp.QuoteMeta(series) + `\{[^}]*model_name="` + id + `"`).MatchString(metrics) {
			t.Errorf("/metrics lacks %s for model_name %q", series, id)
		}
	}
	if !strings.Contains(metrics, "tandem:time_to_first_token_seconds_bucket") || !strings.Contains(metrics, "tandem:responses_stored 1") {
		t.Errorf("tandem's own names are gone:\n%s", grepLines(metrics, "tandem:responses"))
	}

	// Restart: the response is still there, and the conversation goes on from it.
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("tandem serve did not exit on SIGTERM")
	}
	s = startServe(t, args...)
	c = s.client()
	got, err := c.Responses.Get(ctx, first.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != first.OutputText() {
		t.Fatalf("after a restart: %v, %q (was %q)", err, got.OutputText(), first.OutputText())
	}
	next, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: id, PreviousResponseID: sdk.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: sdk.String("More")}, MaxOutputTokens: sdk.Int(2)}, noThinking)
	if err != nil || next.Usage.InputTokens <= first.Usage.InputTokens {
		t.Fatalf("previous_response_id after a restart: %v (%d input tokens, the first had %d)", err, next.Usage.InputTokens, first.Usage.InputTokens)
	}

	storedLast := time.Now()

	// A short TTL: the responses stored before are past it; the sweep removes and counts them.
	s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.exited
	time.Sleep(time.Until(storedLast.Add(1100 * time.Millisecond))) // both are older than 1 s
	s = startServe(t, append(args, "--response-ttl", "1s")...)
	if code, _ := get(t, s.url+"/v1/responses/"+first.ID); code != http.StatusNotFound {
		t.Errorf("a response past its TTL: %d", code)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, metrics = get(t, s.url+"/metrics")
		if strings.Contains(metrics, "tandem:responses_expired_total 2") && strings.Contains(metrics, "tandem:responses_stored 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sweep did not remove the two expired responses:\n%s", grepLines(metrics, "responses_"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
