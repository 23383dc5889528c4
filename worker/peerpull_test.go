package worker_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/orpc"
	"tandem/worker"
)

// generateVia runs req on the worker behind c (Worker.Generate) and returns its tokens and
// final usage.
func generateVia(t *testing.T, c *orpc.Client, req *cluster.GenerateRequest) ([]int32, llm.Usage) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := c.Stream(ctx, cluster.MethodGenerate, req)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	out, usage, err := readGenerate(t, cs, nil)
	if err != nil {
		t.Fatalf("error event: %v", err)
	}
	return out, usage
}

// A worker told to pull a prompt's prefix from a peer that holds it in its cache gets the
// blocks (checked) and the tokens of one that computes the prompt; a peer that dies in the
// middle of the pull leaves the blocks that arrived, and the rest is computed, with the
// same tokens.
func TestPeerPull(t *testing.T) {
	env := newPeerEnv(t)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	holder := env.start("holder", path, worker.Config{})
	puller := env.start("puller", path, worker.Config{})
	agg := env.start("agg", path, worker.Config{})
	text := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 4)
	prompt := holder.m.Tokenizer.Encode(text, true, false)
	const maxTokens = 16
	want := reference(t, agg, prompt, maxTokens)
	reference(t, holder, prompt, 1) // the holder's cache has the prompt now
	holder.idle(t)
	blocks := (len(prompt) - 1) / 16

	pc := env.dial(puller)
	got, usage := generateVia(t, pc, &cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: maxTokens},
		Peer: cluster.KVPeer{Addr: holder.w.Addr(), Node: "holder", Blocks: blocks}})
	if !slices.Equal(got, want) {
		t.Fatalf("after a peer pull %v, computed %v", got, want)
	}
	if n := testutil.ToFloat64(puller.met.PeerPulls.WithLabelValues("ok")); n != 1 {
		t.Fatalf("peer pulls ok %v, want 1", n)
	}
	if n := testutil.ToFloat64(puller.met.Blocks.WithLabelValues("received")); n != float64(blocks) {
		t.Fatalf("received %v blocks, want %d", n, blocks)
	}
	if usage.CachedTokens < blocks*16 {
		t.Fatalf("usage %+v: the pulled blocks are not counted as cached", usage)
	}
	puller.idle(t)
	holder.idle(t)
}

func TestPeerPullPeerDies(t *testing.T) {
	env := newPeerEnv(t)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	// The holder sends a block about every 200 ms, so the pull is under way when it dies.
	holder := env.start("holder", path, worker.Config{KVSendRate: 5 * 5 * 2 * 16 * 4 * 8 * 4})
	puller := env.start("puller", path, worker.Config{})
	agg := env.start("agg", path, worker.Config{})
	text := strings.Repeat("The little dog ran to the big tree and barked at the cat who sat on a branch. ", 3)
	prompt := holder.m.Tokenizer.Encode(text, true, false)
	const maxTokens = 12
	want := reference(t, agg, prompt, maxTokens)
	reference(t, holder, prompt, 1)
	holder.idle(t)
	blocks := (len(prompt) - 1) / 16
	if blocks < 6 {
		t.Fatalf("prompt of %d blocks", blocks)
	}
	go func() {
		// Kill the holder once it has sent two blocks.
		deadline := time.Now().Add(20 * time.Second)
		for testutil.ToFloat64(holder.met.Blocks.WithLabelValues("sent")) < 2 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		holder.kill()
	}()
	got, usage := generateVia(t, env.dial(puller), &cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: maxTokens},
		Peer: cluster.KVPeer{Addr: holder.w.Addr(), Node: "holder", Blocks: blocks, TimeoutMs: 20000}})
	if !slices.Equal(got, want) {
		t.Fatalf("after a peer died mid-pull %v, computed %v", got, want)
	}
	if n := testutil.ToFloat64(puller.met.PeerPulls.WithLabelValues("failed")); n != 1 {
		t.Fatalf("failed peer pulls %v, want 1", n)
	}
	if usage.CachedTokens >= blocks*16 || usage.CachedTokens < 16 {
		t.Fatalf("usage %+v: want the blocks that arrived before the peer died (some, not all %d) cached", usage, blocks)
	}
	puller.idle(t)
}
