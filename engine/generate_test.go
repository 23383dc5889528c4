package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/model"
)

func loadStories(t *testing.T) (*model.Model, *cpu.Backend) {
	t.Helper()
	return loadFixture(t, "stories260K-f32.gguf", 0)
}

// loadFixture loads the fixture model name on a CPU backend of threads workers (0: all
// cores), both closed when the test ends.
func loadFixture(tb testing.TB, name string, threads int) (*model.Model, *cpu.Backend) {
	tb.Helper()
	be := cpu.New(threads)
	tb.Cleanup(func() { be.Close() })
	m, err := model.Load(fixtures.Model(tb, name), be)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m, be
}

func generate(t *testing.T, g *Generator, req *Request) (Result, []int32) {
	t.Helper()
	var got []int32
	res, err := g.Generate(context.Background(), req, func(tok Token) error {
		got = append(got, tok.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return res, got
}

func TestGenerateGreedyMatchesLlamaCpp(t *testing.T) {
	m, be := loadStories(t)
	prompt := m.Tokenizer.Encode("Once upon a time", true, false)
	// llama.cpp's greedy continuation (golden stories260K-f32, prompt "short").
	want := []int32{432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394}
	for _, chunk := range []int{1, 2, 512} {
		g := NewGenerator(m, be)
		g.ChunkSize = chunk
		res, got := generate(t, g, &Request{Prompt: prompt, MaxTokens: 32})
		if !slices.Equal(got, want) || !slices.Equal(res.Tokens, want) {
			t.Errorf("chunk %d: got %v, want %v", chunk, got, want)
		}
		if res.FinishReason != llm.FinishLength || res.PromptTokens != len(prompt) {
			t.Errorf("chunk %d: finish %q, prompt tokens %d", chunk, res.FinishReason, res.PromptTokens)
		}
	}
}

func TestGenerateStopsAndSeeds(t *testing.T) {
	m, be := loadStories(t)
	g := NewGenerator(m, be)
	prompt := m.Tokenizer.Encode("Once upon a time", true, false)

	res, got := generate(t, g, &Request{Prompt: prompt, MaxTokens: 32, StopTokens: []int32{261}})
	if res.FinishReason != llm.FinishStop || got[len(got)-1] != 261 || slices.Contains(got[:len(got)-1], 261) {
		t.Errorf("stop token 261: finish %q, tokens %v", res.FinishReason, got)
	}

	sampled := SamplingParams{Temperature: 1, TopP: 0.9, Seed: 7, HasSeed: true}
	_, a := generate(t, g, &Request{Prompt: prompt, MaxTokens: 24, Params: sampled})
	_, b := generate(t, g, &Request{Prompt: prompt, MaxTokens: 24, Params: sampled})
	sampled.Seed = 8
	_, c := generate(t, g, &Request{Prompt: prompt, MaxTokens: 24, Params: sampled})
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different tokens:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8 gave the same 24 tokens %v", a)
	}
}

func TestGenerateErrors(t *testing.T) {
	m, be := loadStories(t)
	g := NewGenerator(m, be)
	long := make([]int32, m.Config.ContextLen)
	if _, err := g.Generate(context.Background(), &Request{Prompt: long}, func(Token) error { return nil }); !errors.Is(err, llm.ErrPromptTooLong) {
		t.Errorf("prompt of the full context: %v, want ErrPromptTooLong", err)
	}
	if _, err := g.Generate(context.Background(), &Request{Prompt: []int32{1, 2}, Params: SamplingParams{Temperature: -1}}, func(Token) error { return nil }); err == nil {
		t.Error("negative temperature accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := g.Generate(ctx, &Request{Prompt: []int32{1, 403}, MaxTokens: 100}, func(Token) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 3 {
		t.Errorf("cancel after 3 tokens: err %v after %d tokens", err, n)
	}
	stop := errors.New("client gone")
	if _, err := g.Generate(context.Background(), &Request{Prompt: []int32{1, 403}, MaxTokens: 100}, func(Token) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("emit error: %v", err)
	}
}
