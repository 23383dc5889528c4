package engine

import (
	"context"
	"runtime"
	"testing"

	"tandem/llm"
	"tandem/model"
)

// qwenVocabEngine runs an engine on the fixture model with the full Qwen2 vocabulary
// (151936 tokens, tiny random weights): a request's vocabulary-sized buffers are then as
// large as on a real Qwen model, while its forward pass costs little.
func qwenVocabEngine(tb testing.TB) (*Engine, *model.Model) {
	tb.Helper()
	m, be := loadFixture(tb, "rand-qwen2-qwen2vocab-f32.gguf", 1)
	e, err := New(m, be, Config{KVBlocks: 64})
	if err != nil {
		tb.Fatal(err)
	}
	runEngine(tb, e)
	return e, m
}

// requestKinds are the sampling settings whose buffers differ: none (greedy), the
// whole-vocabulary weights (temperature only), every token as a top-p candidate, a top-k
// heap with top logprobs, and the penalties' per-sequence bookkeeping.
var requestKinds = []struct {
	name string
	p    llm.SamplingParams
}{
	{"greedy", llm.SamplingParams{}},
	{"T1", llm.SamplingParams{Temperature: 1}},
	{"topp0.9", llm.SamplingParams{Temperature: 0.8, TopP: 0.9}},
	{"topk40_logprobs5", llm.SamplingParams{Temperature: 0.8, TopK: 40, Logprobs: true, TopLogprobs: 5}},
	{"penalties_topp0.9", llm.SamplingParams{Temperature: 0.8, TopP: 0.9, RepetitionPenalty: 1.1, FrequencyPenalty: 0.5, PresencePenalty: 0.5}},
	// min_tokens and allowed_token_ids: a list of end tokens, and one bit per vocabulary entry.
	{"min_tokens_allowed", llm.SamplingParams{Temperature: 1, MinTokens: 3, AllowedTokens: []int32{11, 13, 576, 5562, 9707}}},
}

// shortRequest runs one 8-token prompt to 4 generated tokens and returns how many came.
func shortRequest(tb testing.TB, e *Engine, p llm.SamplingParams, i int) int {
	prompt := []int32{9707, 11, 1879, 0, 13, 576, 5562, int32(100 + i%1000)}
	p.Seed, p.HasSeed = uint64(i), true
	s, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, Sampling: p, MaxTokens: 4, IgnoreEOS: true})
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for {
		if _, err := s.Next(context.Background()); err != nil {
			break
		}
		n++
	}
	return n
}

// BenchmarkRequestAllocs: one op is one short request (8 prompt tokens, 4 generated) through
// an engine on a model with a 151936-token vocabulary, one request at a time. B/op and
// allocs/op are everything the request allocates: the caller's side, the scheduler's and
// the sampler's.
//
//	go test -run x -bench RequestAllocs -benchmem ./engine
func BenchmarkRequestAllocs(b *testing.B) {
	e, _ := qwenVocabEngine(b)
	for _, k := range requestKinds {
		b.Run(k.name, func(b *testing.B) {
			for i := range 4 { // warm up: the engine's own buffers reach their size
				shortRequest(b, e, k.p, i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if shortRequest(b, e, k.p, i) != 4 {
					b.Fatal("short request")
				}
				i++
			}
		})
	}
}

// Once warm, a request allocates nothing of the vocabulary's size: its heap allocations,
// all goroutines counted, stay below one float32 per vocabulary entry per request.
func TestRequestAllocatesNoVocabularyBuffers(t *testing.T) {
	e, m := qwenVocabEngine(t)
	limit := uint64(4 * m.Config.VocabSize)
	for _, k := range requestKinds {
		t.Run(k.name, func(t *testing.T) {
			for i := range 4 {
				shortRequest(t, e, k.p, i)
			}
			const n = 20
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := range n {
				shortRequest(t, e, k.p, i)
			}
			runtime.ReadMemStats(&after)
			per := (after.TotalAlloc - before.TotalAlloc) / n
			t.Logf("%d bytes, %d allocations per request", per, (after.Mallocs-before.Mallocs)/n)
			if per >= limit {
				t.Errorf("%d bytes allocated per request, want < %d (one float32 per vocabulary entry)", per, limit)
			}
		})
	}
}
