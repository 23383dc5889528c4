package model

import (
	"fmt"

	"tandem/hal"
)

// Batch is one forward step over a flattened set of tokens from one or more
// sequences: prefill chunks and decode tokens alike.
type Batch struct {
	Tokens []int32
	Attn   hal.AttnBatch // positions, owning sequence and block tables
	// Outputs lists the indices into Tokens whose logits are wanted, in the
	// order they are written to the logits slice.
	Outputs []int
}

// Runner runs forward passes of a model on a backend, reusing its scratch
// buffers across steps. A Runner is not safe for concurrent use.
type Runner struct {
	M  *Model
	Be hal.Backend

	rope                     *hal.RoPE
	x, xn, q, k, v, att, tmp []float32
	gate, up                 []float32
	outX, outN               []float32

	multi multiMatMuler // be, where it has MatMuls
	prods [3]hal.MatMulOut
}

// multiMatMuler is a backend that multiplies one input by several weights
// in one pass (the attention's q, k and v; the FFN's gate and up).
type multiMatMuler interface {
	MatMuls(x []float32, rows int, ps []hal.MatMulOut)
}

// NewRunner prepares m to run on be.
func NewRunner(m *Model, be hal.Backend) *Runner {
	r := &Runner{M: m, Be: be, rope: m.RoPE()}
	r.multi, _ = be.(multiMatMuler)
	return r
}

// matMuls sets p.Out = x·p.Wᵀ for each p of ps, in one call where the
// backend can.
func (r *Runner) matMuls(x []float32, rows int, ps ...hal.MatMulOut) {
	if r.multi == nil || len(ps) > len(r.prods) {
		for _, p := range ps {
			r.Be.MatMul(p.Out, x, rows, p.W)
		}
		return
	}
	n := copy(r.prods[:], ps)
	r.multi.MatMuls(x, rows, r.prods[:n])
}

// ffnChunkRows bounds the rows of the FFN's two hidden-width buffers (gate
// and up, FFN wide, 5× the model width or more): a long prompt runs its FFN
// in chunks of this many tokens, so the buffers stay a few MiB instead of
// growing with the prompt. The rows are independent, so the results are the
// same bits; the kernels stay compute-bound at this many rows.
// (Measured: pp256 on Llama-3.2-1B Q4_K_M, one thread, 134.5 tok/s per CPU
// second with 512 rows and with 64; Qwen2.5-0.5B Q8_0 pp512 the same within
// noise from 32 to 512 rows.)
const ffnChunkRows = 64

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// Forward runs the batch through the model, storing every token's keys and
// values in kv, and writes len(b.Outputs) rows of logits into logits.
func (r *Runner) Forward(kv hal.KVStore, b *Batch, logits []float32) error {
	m, be := r.M, r.Be
	c := &m.Config
	n := len(b.Tokens)
	if n == 0 {
		return nil
	}
	if len(b.Attn.Pos) != n || len(b.Attn.SeqOf) != n {
		return fmt.Errorf("model: batch of %d tokens has %d positions and %d sequence ids", n, len(b.Attn.Pos), len(b.Attn.SeqOf))
	}
	if len(logits) < len(b.Outputs)*c.VocabSize {
		return fmt.Errorf("model: logits buffer holds %d values, want %d", len(logits), len(b.Outputs)*c.VocabSize)
	}
	for _, id := range b.Tokens {
		if id < 0 || int(id) >= c.VocabSize {
			return fmt.Errorf("model: token id %d outside the vocabulary of %d", id, c.VocabSize)
		}
	}
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	r.x = grow(r.x, n*c.Embd)
	r.xn = grow(r.xn, n*c.Embd)
	r.tmp = grow(r.tmp, n*c.Embd)
	r.q = grow(r.q, n*qDim)
	r.att = grow(r.att, n*qDim)
	r.k = grow(r.k, n*kvDim)
	r.v = grow(r.v, n*kvDim)
	ffnRows := min(n, ffnChunkRows)
	r.gate = grow(r.gate, ffnRows*c.FFN)
	r.up = grow(r.up, ffnRows*c.FFN)

	be.Embed(r.x, m.Embedding, b.Tokens)
	scale := attnScale(c.HeadDim)
	for li := range m.Layers {
		l := &m.Layers[li]
		be.RMSNorm(r.xn, r.x, l.AttnNorm, c.NormEps)
		r.matMuls(r.xn, n, hal.MatMulOut{Out: r.q, W: l.Wq}, hal.MatMulOut{Out: r.k, W: l.Wk}, hal.MatMulOut{Out: r.v, W: l.Wv})
		if l.Bq != nil {
			be.AddBias(r.q, l.Bq)
		}
		if l.Bk != nil {
			be.AddBias(r.k, l.Bk)
		}
		if l.Bv != nil {
			be.AddBias(r.v, l.Bv)
		}
		if l.QNorm != nil {
			be.RMSNorm(r.q, r.q, l.QNorm, c.NormEps)
		}
		if l.KNorm != nil {
			be.RMSNorm(r.k, r.k, l.KNorm, c.NormEps)
		}
		be.RoPE(r.q, c.Heads, c.HeadDim, b.Attn.Pos, r.rope)
		be.RoPE(r.k, c.KVHeads, c.HeadDim, b.Attn.Pos, r.rope)
		be.StoreKV(kv, li, r.k, r.v, &b.Attn)
		be.Attention(r.att, r.q, c.Heads, scale, kv, li, &b.Attn)
		be.MatMul(r.tmp, r.att, n, l.Wo)
		be.Add(r.x, r.tmp)

		be.RMSNorm(r.xn, r.x, l.FFNNorm, c.NormEps)
		for lo := 0; lo < n; lo += ffnRows {
			hi := min(n, lo+ffnRows)
			gate, up := r.gate[:(hi-lo)*c.FFN], r.up[:(hi-lo)*c.FFN]
			r.matMuls(r.xn[lo*c.Embd:hi*c.Embd], hi-lo, hal.MatMulOut{Out: gate, W: l.Gate}, hal.MatMulOut{Out: up, W: l.Up})
			be.SiLUMul(gate, up)
			be.MatMul(r.tmp[lo*c.Embd:hi*c.Embd], gate, hi-lo, l.Down)
		}
		be.Add(r.x, r.tmp)
	}
	if len(b.Outputs) == 0 {
		return nil
	}
	no := len(b.Outputs)
	r.outX = grow(r.outX, no*c.Embd)
	r.outN = grow(r.outN, no*c.Embd)
	for i, t := range b.Outputs {
		copy(r.outX[i*c.Embd:(i+1)*c.Embd], r.x[t*c.Embd:(t+1)*c.Embd])
	}
	be.RMSNorm(r.outN, r.outX, m.OutputNorm, c.NormEps)
	be.MatMul(logits[:no*c.VocabSize], r.outN, no, m.Output)
	return nil
}
