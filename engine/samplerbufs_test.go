package engine

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// Samplers that borrow their buffers from one samplerBufs, sampling in turn as the
// engine's sequences do, some ending (their penalty bookkeeping then reused by the
// next ones), give bit for bit what samplers with their own buffers give: the same
// ids, logprobs, top logprobs and processed logits.
func TestLentBuffersMatchOwn(t *testing.T) {
	const vocab = 3000
	kinds := []SamplingParams{
		{},
		{Temperature: 1},
		{Temperature: 0.7, MinP: 0.05},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, TopLogprobs: 5, Logprobs: true},
		{Temperature: 1.2, TopK: 7},
		{Temperature: 0.9, TopP: 0.8, RepetitionPenalty: 1.3, FrequencyPenalty: 0.4, PresencePenalty: 0.2},
		{Temperature: 1, RepetitionPenalty: 1.1, TopLogprobs: 3},
		{RepetitionPenalty: 2, FrequencyPenalty: 1, Logprobs: true}, // greedy with penalties
	}
	type seq struct {
		own, lent *Sampler
		step      int
		steps     int
	}
	b := newSamplerBufs(vocab, 2) // keeps fewer than run at once: both paths are taken
	var live []*seq
	next, ended := 0, 0
	start := func() {
		p := seeded(kinds[next%len(kinds)], uint64(next))
		prompt := make([]int32, 20+next%50)
		for i := range prompt {
			prompt[i] = int32((next*131 + i*7919) % vocab)
		}
		live = append(live, &seq{own: NewSampler(p, vocab, prompt), lent: newSampler(p, vocab, prompt, b, nil), steps: 5 + next%17})
		next++
	}
	for range 4 {
		start()
	}
	row := 0
	for ended < 3*len(kinds) {
		for _, s := range slices.Clone(live) {
			logits := randLogits(uint64(row), vocab, 2)
			row++
			l1, l2 := slices.Clone(logits), slices.Clone(logits)
			a, c := s.own.Sample(l1), s.lent.Sample(l2)
			if a.ID != c.ID || math.Float32bits(a.Logprob) != math.Float32bits(c.Logprob) || !slices.Equal(a.Top, c.Top) ||
				!slices.EqualFunc(l1, l2, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) }) {
				t.Fatalf("sequence with %+v, step %d: own buffers %+v, lent %+v", s.lent, s.step, a, c)
			}
			if s.step++; s.step == s.steps {
				b.put(s.lent)
				live = slices.DeleteFunc(live, func(x *seq) bool { return x == s })
				ended++
				start()
			}
		}
	}
	if len(b.free) == 0 {
		t.Error("no penalty bookkeeping was kept for reuse")
	}
	// A sampler whose buffers went back refuses to sample; put ignores strangers.
	s := live[0].lent
	b.put(s)
	b.put(NewSampler(SamplingParams{}, vocab, nil))
	b.put(nil)
	defer func() {
		if recover() == nil {
			t.Error("a sampler sampled after its buffers were given back")
		}
	}()
	s.Sample(make([]float32, vocab))
}

// Once the scratch fits, lending a sampler and taking it back allocates only the
// Sampler itself, penalties and all.
func TestLentSamplerAllocs(t *testing.T) {
	const vocab = 151936
	prompt := make([]int32, 300)
	for i := range prompt {
		prompt[i] = int32(i * 97 % vocab)
	}
	b := newSamplerBufs(vocab, 4)
	logits := randLogits(1, vocab, 2)
	buf := make([]float32, vocab)
	for _, p := range []SamplingParams{
		{Temperature: 0.8, TopP: 0.95, RepetitionPenalty: 1.1, PresencePenalty: 0.5},
		{Temperature: 1, TopK: 40, TopLogprobs: 5, FrequencyPenalty: 0.5},
		{Temperature: 1},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			p := seeded(p, 1)
			allocs := testing.AllocsPerRun(100, func() {
				s := newSampler(p, vocab, prompt, b, nil)
				copy(buf, logits)
				s.Sample(buf)
				b.put(s)
			})
			if allocs > 1 {
				t.Errorf("%v allocations per sequence, want 1 (the Sampler)", allocs)
			}
		})
	}
}
