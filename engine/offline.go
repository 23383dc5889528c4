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
	// Depth is the context every test starts after (llama-bench's -d): each
	// sequence's positions 0..Depth-1 hold random keys and values, written
	// before the timed passes, so attention reads Depth positions more from
	// memory as it would after a prompt of that length.
	Depth int
	rng   *rand.Rand
	// kv and logits are reused from test to test (see Reserve), so that
	// repeated tests do not pile up garbage the size of the KV store.
	kv     hal.KVStore
	logits []float32
	// filledPer and filledSeqs: the first filledSeqs sequences of filledPer
	// blocks each hold their Depth positions of context.
	filledPer, filledSeqs int
}

// KVShape is what a test asks of the KV store: Seqs sequences of
// Positions positions each.
type KVShape struct{ Seqs, Positions int }

// blocks is the number of KV blocks the shape takes, after Depth positions of context.
func (o *OfflineBench) blocks(s KVShape) int {
	return s.Seqs * ((o.Depth + s.Positions + o.BlockSize - 1) / o.BlockSize)
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

// store returns a KV store for seqs sequences of Depth+n positions, the one
// from before when it is large enough, and their block tables; each
// sequence's first Depth positions hold context.
func (o *OfflineBench) store(seqs, n int) (hal.KVStore, [][]int32, error) {
	per := o.blocks(KVShape{1, n})
	if o.kv == nil || o.kv.Layout().Blocks < seqs*per || o.kv.Layout().BlockSize != o.BlockSize || o.kv.Layout().DType != o.Runner.M.KVType {
		o.kv = nil // let the old one go before the new one is allocated
		kv, err := o.Runner.Be.NewKVStore(o.Runner.M.KVLayout(seqs*per, o.BlockSize))
		if err != nil {
			return nil, nil, err
		}
		o.kv = kv
		o.filledSeqs = 0
	}
	kv := o.kv
	tables := make([][]int32, seqs)
	for s := range tables {
		tables[s] = make([]int32, per)
		for i := range tables[s] {
			tables[s][i] = int32(s*per + i)
		}
	}
	if o.Depth > 0 {
		if per != o.filledPer {
			o.filledPer, o.filledSeqs = per, 0
		}
		for ; o.filledSeqs < seqs; o.filledSeqs++ {
			if err := o.fillContext(kv, tables[o.filledSeqs]); err != nil {
				return nil, nil, err
			}
		}
	}
	return kv, tables, nil
}

// fillContext writes random keys and values (uniform in [-1, 1)) at positions 0..Depth-1 of
// the sequence with block table table, in every layer. Untouched KV pages would read as the
// one shared zero page, from cache, not from memory.
func (o *OfflineBench) fillContext(kv hal.KVStore, table []int32) error {
	const chunk = 256
	be := o.Runner.Be
	l := kv.Layout()
	row := l.KVHeads * l.HeadDim
	k, v := make([]float32, chunk*row), make([]float32, chunk*row)
	kb, err := be.NewBuf(chunk * row)
	if err != nil {
		return err
	}
	defer be.FreeBuf(kb)
	vb, err := be.NewBuf(chunk * row)
	if err != nil {
		return err
	}
	defer be.FreeBuf(vb)
	b := &hal.AttnBatch{Blocks: [][]int32{table}}
	for from := 0; from < o.Depth; from += chunk {
		n := min(chunk, o.Depth-from)
		b.Pos, b.SeqOf = b.Pos[:0], b.SeqOf[:0]
		for p := range n {
			b.Pos = append(b.Pos, int32(from+p))
			b.SeqOf = append(b.SeqOf, 0)
		}
		for layer := range l.Layers {
			for i := range k[:n*row] {
				k[i], v[i] = 2*o.rng.Float32()-1, 2*o.rng.Float32()-1
			}
			if err := be.WriteBuf(kb, k[:n*row]); err != nil {
				return err
			}
			if err := be.WriteBuf(vb, v[:n*row]); err != nil {
				return err
			}
			be.StoreKV(kv, layer, kb.Slice(0, n*row), vb.Slice(0, n*row), b)
		}
	}
	return be.Err()
}

func (o *OfflineBench) token() int32 { return int32(o.rng.IntN(o.Runner.M.Config.VocabSize)) }

// Prompt times one forward pass over n prompt tokens (the logits of the last), after Depth
// positions of context.
func (o *OfflineBench) Prompt(n int) (time.Duration, error) {
	kv, tables, err := o.store(1, n)
	if err != nil {
		return 0, err
	}
	b := &model.Batch{Attn: hal.AttnBatch{Blocks: tables}, Outputs: []int{n - 1}}
	for i := range n {
		b.Tokens = append(b.Tokens, o.token())
		b.Attn.Pos = append(b.Attn.Pos, int32(o.Depth+i))
		b.Attn.SeqOf = append(b.Attn.SeqOf, 0)
	}
	logits := o.logitsBuf(o.Runner.M.Config.VocabSize)
	t0 := time.Now()
	err = o.Runner.Forward(kv, b, logits)
	return time.Since(t0), err
}

// Decode times steps decode steps of seqs sequences together, each step one
// token per sequence, after Depth positions of context.
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
			b.Attn.Pos = append(b.Attn.Pos, int32(o.Depth+p))
			b.Attn.SeqOf = append(b.Attn.SeqOf, int32(s))
			b.Outputs = append(b.Outputs, s)
		}
		if err := o.Runner.Forward(kv, b, logits); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}
