package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	"tandem/llm"
)

// A request resumed from its first k tokens (as the router does when it migrates a request)
// continues exactly as the uninterrupted run, sampling with a seed and penalties included.
func TestResumedRequestContinuesExactly(t *testing.T) {
	e, m := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode("Once upon a time", true, false)
	sampling := llm.SamplingParams{Temperature: 1.1, TopP: 0.95, FrequencyPenalty: 0.5, RepetitionPenalty: 1.2, Seed: 7, HasSeed: true}
	const n = 40
	run := func(req *llm.Request) []int32 {
		t.Helper()
		s, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := collect(t, s)
		return ids
	}
	full := run(&llm.Request{Prompt: prompt, Sampling: sampling, MaxTokens: n, IgnoreEOS: true})
	if len(full) != n {
		t.Fatalf("%d tokens, want %d", len(full), n)
	}
	for _, k := range []int{1, 13, n - 1} {
		req := &llm.Request{Prompt: append(slices.Clone(prompt), full[:k]...), Resumed: k, Sampling: sampling, MaxTokens: n - k, IgnoreEOS: true}
		if got := run(req); !slices.Equal(got, full[k:]) {
			t.Errorf("resumed after %d: %v, want %v", k, got, full[k:])
		}
	}
	// Without Resumed the tail is prompt, and the continuation differs (so the test can fail).
	plain := run(&llm.Request{Prompt: append(slices.Clone(prompt), full[:13]...), Sampling: sampling, MaxTokens: n - 13, IgnoreEOS: true})
	if slices.Equal(plain, full[13:]) {
		t.Error("a plain continuation equals the resumed one; the test does not tell them apart")
	}
	for _, bad := range []int{-1, len(prompt)} {
		_, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, Resumed: bad})
		if !errors.Is(err, llm.ErrInvalid) {
			t.Errorf("Resumed %d: %v, want ErrInvalid", bad, err)
		}
	}
}
