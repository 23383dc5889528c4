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
	// kv and logits are reused from test to test (see Reserve), so that
	// repeated tests do not pile up garbage the size of the KV store.
	kv     hal.KVStore
	logits []float32
}

// KVShape is what a test asks of the KV store: Seqs sequences of
// Positions positions each.
type KVShape struct{ Seqs, Positions int }

// blocks is the number of KV blocks the shape takes.
func (o *OfflineBench) blocks(s KVShape) int {
	return s.Seqs * ((s.Positions + o.BlockSize - 1) / o.BlockSize)
}

// Reserve allocates ahead of the tests the KV store for the largest of
// shapes: the tests then share it, and its size is the run's KV budget
// (KVBytes). The logits buffer is sized for the most sequences too, so
// that the smaller tests' buffers do not become garbage.
func (o *OfflineBench) Reserve(shapes ...KVShape) error {
	var big KVShape
	seqs := 0
	for _, s := range shapes {
		if o.blocks(s) > o.blocks(big) {
			big = s
		}
		seqs = max(seqs, s.Seqs)
	}
	if o.blocks(big) == 0 {
		return nil
	}
	o.logitsBuf(seqs * o.Runner.M.Config.VocabSize)
	_, _, err := o.store(big.Seqs, big.Positions)
	return err
}

// KVBytes is the size of the KV store the tests use, 0 before the first.
func (o *OfflineBench) KVBytes() int64 {
	if o.kv == nil {
		return 0
	}
	return o.kv.Bytes()
}

// logitsBuf returns a reused buffer of n logits.
func (o *OfflineBench) logitsBuf(n int) []float32 {
	if cap(o.logits) < n {
		o.logits = make([]float32, n)
	}
	return o.logits[:n]
}

// NewOfflineBench prepares timings of m on be.
func NewOfflineBench(m *model.Model, be hal.Backend) *OfflineBench {
	return &OfflineBench{Runner: model.NewRunner(m, be), BlockSize: DefaultBlockSize, rng: rand.New(rand.NewPCG(1, 1))}
}

// store returns a KV store for seqs sequences of n positions, the one
// from before when it is large enough, and their block tables.
func (o *OfflineBench) store(seqs, n int) (hal.KVStore, [][]int32, error) {
	per := o.blocks(KVShape{1, n})
	if o.kv == nil || o.kv.Layout().Blocks < seqs*per || o.kv.Layout().BlockSize != o.BlockSize {
		o.kv = nil // let the old one go before the new one is allocated
		kv, err := o.Runner.Be.NewKVStore(o.Runner.M.KVLayout(seqs*per, o.BlockSize))
		if err != nil {
			return nil, nil, err
		}
		o.kv = kv
	}
	kv := o.kv
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
	logits := o.logitsBuf(o.Runner.M.Config.VocabSize)
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
	logits := o.logitsBuf(seqs * o.Runner.M.Config.VocabSize)
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
