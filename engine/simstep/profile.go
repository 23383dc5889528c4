package simstep

import (
	"context"
	"fmt"
	"slices"
	"time"

	"tandem/engine"
	"tandem/hal"
	"tandem/model"
	"tandem/sim"
)

// PrefillShape is a step of Seqs sequences each computing Tokens prompt tokens on top of
// Context tokens already in the KV cache.
type PrefillShape struct{ Seqs, Tokens, Context int }

// DecodeShape is a step of Seqs sequences each decoding one token after Context tokens.
type DecodeShape struct{ Seqs, Context int }

// A Plan lists the step shapes a profile times, each Reps times after a warm-up; a shape's
// time is the median of its repetitions, or with Fastest the least (what a machine shared
// with other work takes when that work leaves it be: other work only adds time).
type Plan struct {
	Prefill []PrefillShape
	Decode  []DecodeShape
	Reps    int
	Fastest bool
}

// DefaultPlan covers prompt chunks of 16 to 512 tokens (alone, batched, and on top of a
// cached context, which is what tells the quadratic term apart) and decode batches of 1 to
// 32 sequences at 64 to 2048 tokens of context, within the limits given.
func DefaultPlan(contextLen, maxBatchTokens, maxSeqs, reps int) Plan {
	p := Plan{Reps: max(reps, 1)}
	for _, s := range []PrefillShape{
		{1, 16, 0}, {1, 32, 0}, {1, 64, 0}, {1, 128, 0}, {1, 256, 0}, {1, 512, 0},
		{1, 128, 512}, {1, 64, 1024}, {1, 256, 1024}, {2, 128, 0}, {4, 64, 0}, {2, 64, 512},
	} {
		if s.Seqs*s.Tokens <= maxBatchTokens && s.Context+s.Tokens <= contextLen && s.Seqs <= maxSeqs {
			p.Prefill = append(p.Prefill, s)
		}
	}
	for _, ctx := range []int{64, 512, 2048} {
		for _, n := range []int{1, 2, 4, 8, 16, 32} {
			if ctx+1 <= contextLen && n <= maxSeqs && n <= maxBatchTokens {
				p.Decode = append(p.Decode, DecodeShape{n, ctx})
			}
		}
	}
	return p
}

// QuickPlan is the few shapes an engine times at start to fit the step cost its ITL
// target starts from (the engine corrects it with every step after): prompt chunks of 64
// and 256 tokens, 128 on top of 512 cached, and decode batches of 1 to 16 sequences at
// 128 to 1024 tokens of context, which keep the fit's terms apart; within the limits
// given. The fastest of three repetitions each (after a warm-up): a profile taken while
// other work runs on the cores gets its scale wrong, which the engine's live correction
// mends, but a median of one or two runs got its shape wrong too (a quadratic prefill
// term 28 times too large, on a machine with 12 runnable threads to its 2 cores), which
// no correction of scale mends. For a 0.5B model on 2 cores it takes about 4 s. A model
// whose context is shorter than a shape scales the prefill or the decode shapes down
// together, so that they still fit and keep their terms apart (a 128-token context kept
// two prefill shapes and one decode one of nine, too few to fit).
func QuickPlan(contextLen, maxBatchTokens, maxSeqs int) Plan {
	p := Plan{Reps: 3, Fastest: true}
	prefill := []PrefillShape{{1, 64, 0}, {1, 256, 0}, {1, 128, 512}, {1, 32, 0}}
	longest := 0
	for _, s := range prefill {
		longest = max(longest, s.Context+s.Tokens)
	}
	for _, s := range prefill {
		if longest > contextLen {
			s.Tokens, s.Context = max(2, s.Tokens*contextLen/longest), s.Context*contextLen/longest
		}
		s.Tokens = min(s.Tokens, maxBatchTokens)
		if s.Tokens >= 2 && s.Context+s.Tokens <= contextLen && !slices.Contains(p.Prefill, s) {
			p.Prefill = append(p.Prefill, s)
		}
	}
	decode := []DecodeShape{{1, 128}, {8, 256}, {16, 128}, {2, 1024}, {4, 64}}
	longest = 0
	for _, s := range decode {
		longest = max(longest, s.Context+1)
	}
	for _, s := range decode {
		if longest > contextLen {
			s.Context = max(1, s.Context*(contextLen-1)/(longest-1))
		}
		s.Seqs = min(s.Seqs, maxSeqs, maxBatchTokens)
		if s.Seqs >= 1 && s.Context+1 <= contextLen && !slices.Contains(p.Decode, s) {
			p.Decode = append(p.Decode, s)
		}
	}
	return p
}

// Blocks is the KV blocks of blockSize tokens that the plan's largest step needs.
func (p Plan) Blocks(blockSize int) int {
	need := 0
	for _, s := range p.Prefill {
		need = max(need, s.Seqs*ceilDiv(s.Context+s.Tokens, blockSize))
	}
	for _, s := range p.Decode {
		need = max(need, s.Seqs*ceilDiv(s.Context+1, blockSize))
	}
	return need
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// A Step is one of the forward steps an engine drives and Profile times.
var _ engine.Forwarder = (*Step)(nil)

// Profile times f on every step of p and returns one sample per shape: the median of its
// repetitions, after one warm-up step. Token ids are arbitrary (pseudo-random below vocab):
// the time of a step does not depend on them, nor on what the KV cache holds, so no
// context is prefilled first. clock nil is the wall clock; progress, if set, is told how
// many shapes are done.
func Profile(ctx context.Context, f engine.Forwarder, vocab, blockSize int, p Plan, clock Clock, progress func(done, total int)) ([]sim.Sample, error) {
	if clock == nil {
		clock = realClock{}
	}
	if vocab < 1 || blockSize < 1 {
		return nil, fmt.Errorf("simstep: profile needs a vocabulary and a block size")
	}
	type shape struct{ seqs, tokens, context int }
	var shapes []shape
	for _, s := range p.Prefill {
		shapes = append(shapes, shape{s.Seqs, s.Tokens, s.Context})
	}
	for _, s := range p.Decode {
		shapes = append(shapes, shape{s.Seqs, 1, s.Context})
	}
	var (
		out    []sim.Sample
		logits []float32
		b      model.Batch
		times  []time.Duration
		rng    = uint64(1)
	)
	for k, sh := range shapes {
		if sh.seqs < 1 || sh.tokens < 1 || sh.context < 0 {
			return nil, fmt.Errorf("simstep: profile shape %+v", sh)
		}
		per := ceilDiv(sh.context+sh.tokens, blockSize)
		b = model.Batch{Attn: hal.AttnBatch{Blocks: make([][]int32, sh.seqs)}}
		for s := range sh.seqs {
			b.Attn.Blocks[s] = make([]int32, per)
			for i := range per {
				b.Attn.Blocks[s][i] = int32(s*per + i)
			}
			for j := range sh.tokens {
				rng = splitmix(rng)
				b.Tokens = append(b.Tokens, int32(rng%uint64(vocab)))
				b.Attn.Pos = append(b.Attn.Pos, int32(sh.context+j))
				b.Attn.SeqOf = append(b.Attn.SeqOf, int32(s))
			}
			b.Outputs = append(b.Outputs, len(b.Tokens)-1)
		}
		if need := sh.seqs * vocab; cap(logits) < need {
			logits = make([]float32, need)
		}
		times = times[:0]
		for r := range p.Reps + 1 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t0 := clock.Now()
			if err := f.Forward(&b, logits[:sh.seqs*vocab]); err != nil {
				return nil, fmt.Errorf("simstep: profile step %+v: %w", sh, err)
			}
			if r > 0 {
				times = append(times, clock.Now().Sub(t0))
			}
		}
		slices.Sort(times)
		st, _, _ := Shape(&b, nil, nil)
		took := times[len(times)/2]
		if p.Fastest {
			took = times[0]
		}
		out = append(out, sim.Sample{Shape: st, Time: took})
		if progress != nil {
			progress(k+1, len(shapes))
		}
	}
	return out, nil
}
