package engine

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"

	"tandem/llm"
)

// Prompt log-probabilities are the logits at each prompt position, bit for bit what a
// request for the prompt cut there reports for its first token (batch invariance), with
// every position computed even where the prefix cache holds the prompt, and under chunked
// prefill.
func TestPromptLogprobs(t *testing.T) {
	for _, budget := range []int{512, 7} {
		e, m := startEngine(t, Config{MaxBatchTokens: budget})
		prompt := m.Tokenizer.Encode(prompts[6], true, false)                      // shares a prefix with others
		collectReq(t, e, &llm.Request{Prompt: slices.Clone(prompt), MaxTokens: 1}) // fill the prefix cache
		_, ev := firstEvent(t, e, &llm.Request{Prompt: prompt, MaxTokens: 1, PromptLogprobs: true, PromptTopLogprobs: 3})
		if len(ev.PromptLogprobs) != len(prompt)-1 {
			t.Fatalf("budget %d: %d prompt logprobs for a %d-token prompt", budget, len(ev.PromptLogprobs), len(prompt))
		}
		for k := 1; k < len(prompt); k += 9 {
			_, ref := firstEvent(t, e, &llm.Request{Prompt: prompt[:k], MaxTokens: 1, Sampling: llm.SamplingParams{Logprobs: true, TopLogprobs: 3}})
			got := ev.PromptLogprobs[k-1]
			if !slices.Equal(got.Top, ref.Top) {
				t.Errorf("budget %d: position %d: top %v, the cut prompt's first token saw %v", budget, k, got.Top, ref.Top)
			}
			if got.Rank < 1 || (got.Rank == 1) != (got.Top[0].ID == prompt[k]) {
				t.Errorf("budget %d: position %d: rank %d, best %d, token %d", budget, k, got.Rank, got.Top[0].ID, prompt[k])
			}
			if got.Rank == 1 && got.Logprob != got.Top[0].Logprob {
				t.Errorf("budget %d: position %d: logprob %v, best %v", budget, k, got.Logprob, got.Top[0].Logprob)
			}
		}
	}
}

// firstEvent returns a request's tokens and its first event.
func firstEvent(t *testing.T, e *Engine, req *llm.Request) ([]int32, llm.Event) {
	t.Helper()
	s, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := collect(t, s)
	return append([]int32{ev.Token}, ids...), ev
}

// An embedding is the same bits alone, among generating requests, under chunked prefill
// and with its prompt in the prefix cache; mean and last pooling agree with each other on
// a one-token prompt and differ otherwise.
func TestEmbeddingBatchInvariant(t *testing.T) {
	embed := func(e *Engine, prompt []int32, pool llm.Pooling) llm.Event {
		ids, ev := firstEvent(t, e, &llm.Request{Prompt: prompt, Pooling: pool})
		if len(ids) != 1 || ev.Token != -1 || ev.Finish != llm.FinishStop || ev.Usage.CompletionTokens != 0 || ev.Usage.PromptTokens != len(prompt) {
			t.Fatalf("embedding event %+v (%d events)", ev, len(ids))
		}
		return ev
	}
	e, m := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode(prompts[3], true, false)
	for _, pool := range llm.Poolings {
		alone := embed(e, prompt, pool).Embedding
		if len(alone) != m.Config.Embd {
			t.Fatalf("%s: %d values, model width %d", pool, len(alone), m.Config.Embd)
		}
		// In a batch: the same request among others that generate.
		var wg sync.WaitGroup
		var batched []float32
		for i, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i == 3 {
					batched = embed(e, prompt, pool).Embedding
					return
				}
				collectReq(t, e, &llm.Request{Prompt: m.Tokenizer.Encode(p, true, false), MaxTokens: 8})
			}()
		}
		wg.Wait()
		small, _ := startEngine(t, Config{MaxBatchTokens: 5})
		chunked := embed(small, prompt, pool).Embedding
		again := embed(e, prompt, pool).Embedding // the prompt is in the prefix cache now
		for name, v := range map[string][]float32{"batched": batched, "chunked": chunked, "cached": again} {
			if !sameBits(alone, v) {
				t.Errorf("%s: %s embedding differs from the one alone", pool, name)
			}
		}
	}
	one := []int32{prompt[0]}
	if !sameBits(embed(e, one, llm.PoolMean).Embedding, embed(e, one, llm.PoolLast).Embedding) {
		t.Error("one token: mean and last pooling differ")
	}
	if sameBits(embed(e, prompt, llm.PoolMean).Embedding, embed(e, prompt, llm.PoolLast).Embedding) {
		t.Error("mean and last pooling agree on a long prompt")
	}
	if _, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, Pooling: "cls"}); err == nil {
		t.Error("an unknown pooling was accepted")
	}
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// min_tokens holds back end-of-generation and stop tokens; allowed_token_ids limits every
// token to a set.
func TestMinTokensAndAllowedTokens(t *testing.T) {
	e, m := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode(prompts[0], true, false)
	// A logit bias makes the end-of-generation token certain; min_tokens holds it back.
	eos := m.Tokenizer.EOS()
	bias := map[int32]float32{eos: 100}
	ids, _ := collectReq(t, e, &llm.Request{Prompt: prompt, MaxTokens: 20, Sampling: llm.SamplingParams{LogitBias: bias}})
	if len(ids) != 1 || ids[0] != eos {
		t.Fatalf("with the bias, the run is %v, want just the EOS %d", ids, eos)
	}
	ids, last := collectReq(t, e, &llm.Request{Prompt: prompt, MaxTokens: 20, Sampling: llm.SamplingParams{LogitBias: bias, MinTokens: 5}})
	if len(ids) != 6 || ids[5] != eos || slices.Contains(ids[:5], eos) || last.Finish != llm.FinishStop {
		t.Errorf("min_tokens 5: %v (%s), want 5 tokens then the EOS (as vLLM)", ids, last.Finish)
	}
	// A stop token is held back too.
	ids, _ = collectReq(t, e, &llm.Request{Prompt: prompt, MaxTokens: 10})
	stop := ids[2]
	got, _ := collectReq(t, e, &llm.Request{Prompt: prompt, MaxTokens: 10, StopTokens: []int32{stop}})
	if len(got) != 3 {
		t.Fatalf("stop token %d: %v", stop, got)
	}
	got, _ = collectReq(t, e, &llm.Request{Prompt: prompt, MaxTokens: 10, StopTokens: []int32{stop}, Sampling: llm.SamplingParams{MinTokens: 6}})
	if i := slices.Index(got, stop); i >= 0 && i < 6 {
		t.Errorf("stop token %d at %d under min_tokens 6: %v", stop, i, got)
	}

	allowed := []int32{ids[0], ids[1], 300, 301}
	for _, temp := range []float32{0, 1} {
		got, _ := collectReq(t, e, &llm.Request{Prompt: prompt, MaxTokens: 30, Sampling: llm.SamplingParams{Temperature: temp, Seed: 3, HasSeed: true, AllowedTokens: allowed}})
		for _, id := range got {
			if !slices.Contains(allowed, id) {
				t.Fatalf("temperature %v: token %d outside the allowed %v: %v", temp, id, allowed, got)
			}
		}
	}
	if _, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, Sampling: llm.SamplingParams{AllowedTokens: []int32{int32(m.Config.VocabSize)}}}); err == nil {
		t.Error("an allowed token outside the vocabulary was accepted")
	}
}
