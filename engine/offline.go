package engine

import (
	"fmt"
	"math/rand/v2"
	"time"

	"tandem/hal"
	"tandem/model"
)

// OfflineBench times the forward pass alone, as llama-bench does: prompt
// processing of a fresh sequence, single-sequence generation from an empty
// context, and batched decode of several sequences at once. Token ids are
// random (the speed does not depend on them).
type OfflineBench struct {
	Runner    *model.Runner
	BlockSize int
	rng       *rand.Rand
}

// NewOfflineBench prepares timings of m on be.
func NewOfflineBench(m *model.Model, be hal.Backend) *OfflineBench {
	return &OfflineBench{Runner: model.NewRunner(m, be), BlockSize: DefaultBlockSize, rng: rand.New(rand.NewPCG(1, 1))}
}

// store allocates a KV store for seqs sequences of n positions and their
// block tables.
func (o *OfflineBench) store(seqs, n int) (hal.KVStore, [][]int32, error) {
	per := (n + o.BlockSize - 1) / o.BlockSize
	kv, err := o.Runner.Be.NewKVStore(o.Runner.M.KVLayout(seqs*per, o.BlockSize))
	if err != nil {
		return nil, nil, err
	}
	tables := make([][]int32, seqs)
	for s := range tables {
		tables[s] = make([]int32, per)
		for i := range tables[s] {
			tables[s][i] = int32(s*per + i)
		}
	}
	return kv, tables, nil
}

func (o *OfflineBench) token() int32 { return int32(o.rng.IntN(o.Runner.M.Config.VocabSize)) }

// Prompt times one forward pass over n prompt tokens (the logits of the last).
func (o *OfflineBench) Prompt(n int) (time.Duration, error) {
	kv, tables, err := o.store(1, n)
	if err != nil {
		return 0, err
	}
	b := &model.Batch{Attn: hal.AttnBatch{Blocks: tables}, Outputs: []int{n - 1}}
	for i := range n {
		b.Tokens = append(b.Tokens, o.token())
		b.Attn.Pos = append(b.Attn.Pos, int32(i))
		b.Attn.SeqOf = append(b.Attn.SeqOf, 0)
	}
	logits := make([]float32, o.Runner.M.Config.VocabSize)
	t0 := time.Now()
	err = o.Runner.Forward(kv, b, logits)
	return time.Since(t0), err
}

// Decode times steps decode steps of seqs sequences together, each step one
// token per sequence, from an empty context.
func (o *OfflineBench) Decode(seqs, steps int) (time.Duration, error) {
	if seqs <= 0 || steps <= 0 {
		return 0, fmt.Errorf("engine: decode bench needs sequences and steps")
	}
	kv, tables, err := o.store(seqs, steps)
	if err != nil {
		return 0, err
	}
	b := &model.Batch{Attn: hal.AttnBatch{Blocks: tables}}
	logits := make([]float32, seqs*o.Runner.M.Config.VocabSize)
	t0 := time.Now()
	for p := range steps {
		b.Tokens, b.Attn.Pos, b.Attn.SeqOf, b.Outputs = b.Tokens[:0], b.Attn.Pos[:0], b.Attn.SeqOf[:0], b.Outputs[:0]
		for s := range seqs {
			b.Tokens = append(b.Tokens, o.token())
			b.Attn.Pos = append(b.Attn.Pos, int32(p))
			b.Attn.SeqOf = append(b.Attn.SeqOf, int32(s))
			b.Outputs = append(b.Outputs, s)
		}
		if err := o.Runner.Forward(kv, b, logits); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}
