package worker_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/openai"
	"tandem/router"
	"tandem/router/live"
)

// killMidStream streams prompt through c's router with params and stops the serving worker
// after the tenth chunk. It returns the text received and the stream's error.
func killMidStream(t *testing.T, c *testCluster, nodes map[string]*node, params sdk.CompletionNewParams) (string, error) {
	t.Helper()
	var resp *http.Response
	stream := client(c.router.URL()).Completions.NewStreaming(testCtx(t), params, option.WithResponseInto(&resp))
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Text)
		}
		if chunks++; chunks == 10 {
			victim := nodes[resp.Header.Get(openai.WorkerHeader)]
			if victim == nil {
				t.Fatalf("X-Tandem-Worker %q", resp.Header.Get(openai.WorkerHeader))
			}
			go victim.stop()
		}
	}
	if chunks < 10 {
		t.Fatalf("the stream ended after %d chunks, before a worker could be stopped", chunks)
	}
	return text.String(), stream.Err()
}

// A seeded, sampled request whose worker dies mid-stream continues on another worker with
// the same draws and penalties: the client gets exactly the uninterrupted text.
func TestClusterMigrationSampled(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	c.slow = 5 * time.Millisecond
	nodes := c.addWorkers("w1", "w2")
	params := sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
		Temperature: sdk.Float(1.2), TopP: sdk.Float(0.95), FrequencyPenalty: sdk.Float(0.7), Seed: sdk.Int(11),
		MaxTokens: sdk.Int(80),
	}
	want, err := client(c.router.URL()).Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
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

// With migrations turned off (tandem-router --max-migrations 0), a stream whose worker dies
// ends with an error instead of moving.
func TestClusterMigrationLimit(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond,
		HeartbeatTimeout: 2 * time.Second, MaxMigrations: -1})
	c.slow = 5 * time.Millisecond
	nodes := c.addWorkers("w1", "w2")
	_, err := killMidStream(t, c, nodes, sdk.CompletionNewParams{
		Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
		Temperature: sdk.Float(0), MaxTokens: sdk.Int(80),
	})
	if err == nil {
		t.Fatal("the stream completed although migrations are off")
	}
	if strings.Contains(c.logs.String(), "migrating the request") {
		t.Error("the router migrated a request with migrations off")
	}
}
