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
	// Hidden, if not nil, receives the final normalised hidden state of each output row
	// (the input of the logits), len(Outputs)×Embd values in Outputs' order: what an
	// embedding is pooled from.
	Hidden []float32
	// Adapters, if not empty, is each sequence's LoRA adapter (indexed as Attn.Blocks; nil:
	// the base model): its rows take the adapter's low-rank updates after the base matmuls.
	Adapters []*Adapter
}

// Runner runs forward passes of a model on a backend, reusing its activation
// buffers across steps. A Runner is not safe for concurrent use.
type Runner struct {
	M  *Model
	Be hal.Backend

	rope *hal.RoPE
	// The activations, in the backend's memory: x, xn, tmp, q, att, k and v
	// hold tokCap tokens, gate and up min(tokCap, ffnChunkRows), outX and
	// outN outCap output rows. They grow with the batch and are kept, so
	// that steps of one shape use the same buffers (hal.StepShape).
	x, xn, q, k, v, att, tmp hal.Buf
	gate, up                 hal.Buf
	outX, outN               hal.Buf
	tokCap, outCap           int

	multi   hal.MultiMatMuler // be, where it has MatMuls
	capture hal.StepCapturer  // be, where it runs a step as one unit
	prods   [3]hal.MatMulOut
	step    hal.Step
	lora    loraStep // the step's adapters (lora.go)
}

// NewRunner prepares m to run on be.
func NewRunner(m *Model, be hal.Backend) *Runner {
	r := &Runner{M: m, Be: be, rope: m.RoPE()}
	r.multi, _ = be.(hal.MultiMatMuler)
	if m.Stage.Whole() {
		// A stage's step also moves its activations in or out (ForwardStage), which a
		// capture would not replay: stages run their ops one by one.
		r.capture, _ = be.(hal.StepCapturer)
	}
	r.lora.op, _ = be.(hal.LowRanker)
	return r
}

// matMuls sets p.Out = x·p.Wᵀ for each p of ps, in one call where the
// backend can.
func (r *Runner) matMuls(x hal.Buf, rows int, ps ...hal.MatMulOut) {
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

// reserve makes the activation buffers hold n tokens and outs output rows,
// replacing those that are too small.
func (r *Runner) reserve(n, outs int) error {
	c := &r.M.Config
	if n > r.tokCap {
		embd, q, kv, ffn := n*c.Embd, n*c.Heads*c.HeadDim, n*c.KVHeads*c.HeadDim, min(n, ffnChunkRows)*c.FFN
		r.tokCap = 0 // until every buffer holds n
		for _, f := range []struct {
			b *hal.Buf
			n int
		}{{&r.x, embd}, {&r.xn, embd}, {&r.tmp, embd}, {&r.q, q}, {&r.att, q}, {&r.k, kv}, {&r.v, kv}, {&r.gate, ffn}, {&r.up, ffn}} {
			if err := r.fit(f.b, f.n); err != nil {
				return err
			}
		}
		r.tokCap = n
	}
	if outs > r.outCap {
		r.outCap = 0
		if err := r.fit(&r.outX, outs*c.Embd); err != nil {
			return err
		}
		if err := r.fit(&r.outN, outs*c.Embd); err != nil {
			return err
		}
		r.outCap = outs
	}
	return nil
}

// fit makes *b hold n values, replacing it (freed first) if it is smaller.
func (r *Runner) fit(b *hal.Buf, n int) error {
	if b.Len() >= n {
		return nil
	}
	if b.Len() > 0 {
		r.Be.FreeBuf(*b)
	}
	*b = hal.Buf{}
	nb, err := r.Be.NewBuf(n)
	if err != nil {
		return fmt.Errorf("model: activations for the batch: %w", err)
	}
	*b = nb
	return nil
}

// Forward runs the batch through the model, storing every token's keys and
// values in kv, and writes len(b.Outputs) rows of logits into logits.
func (r *Runner) Forward(kv hal.KVStore, b *Batch, logits []float32) error {
	if !r.M.Stage.Whole() {
		return fmt.Errorf("model: %s holds part of the model; run it with ForwardStage", r.M.Stage)
	}
	return r.ForwardStage(kv, b, nil, nil, logits)
}

// ForwardStage runs a pipeline stage's share of the batch (Model.Stage), storing the KV of
// its layers in kv: the first stage embeds b.Tokens, the others start from in, the hidden
// states the previous stage wrote (len(b.Attn.Pos)×Embd values); the last writes the logits
// of b.Outputs into logits (and b.Hidden), the others their layers' hidden states into out.
// Of the whole model it is Forward.
func (r *Runner) ForwardStage(kv hal.KVStore, b *Batch, in, out, logits []float32) error {
	m := r.M
	c := &m.Config
	n := len(b.Attn.Pos)
	if m.Stage.First() {
		n = len(b.Tokens)
	}
	if n == 0 {
		return nil
	}
	if len(b.Attn.Pos) != n || len(b.Attn.SeqOf) != n {
		return fmt.Errorf("model: batch of %d tokens has %d positions and %d sequence ids", n, len(b.Attn.Pos), len(b.Attn.SeqOf))
	}
	if m.Stage.Last() && len(logits) < len(b.Outputs)*c.VocabSize {
		return fmt.Errorf("model: logits buffer holds %d values, want %d", len(logits), len(b.Outputs)*c.VocabSize)
	}
	if !m.Stage.First() && len(in) < n*c.Embd || !m.Stage.Last() && len(out) < n*c.Embd {
		return fmt.Errorf("model: %s: hidden states of %d and %d values for %d tokens of %d", m.Stage, len(in), len(out), n, c.Embd)
	}
	for _, id := range b.Tokens {
		if id < 0 || int(id) >= c.VocabSize {
			return fmt.Errorf("model: token id %d outside the vocabulary of %d", id, c.VocabSize)
		}
	}
	outs := len(b.Outputs)
	if !m.Stage.Last() {
		outs = 0 // the rows are the next stage's to pick
	}
	if err := r.reserve(n, outs); err != nil {
		return err
	}
	if err := r.setAdapters(b); err != nil {
		return err
	}
	s := &r.step
	*s = hal.Step{Tokens: b.Tokens, Attn: &b.Attn, Outputs: b.Outputs, KV: kv}
	if m.Stage.Last() {
		s.Logits = logits[:len(b.Outputs)*c.VocabSize]
	}
	if !m.Stage.First() {
		if err := r.Be.WriteBuf(r.x.Slice(0, n*c.Embd), in[:n*c.Embd]); err != nil {
			return fmt.Errorf("model: %s: the hidden states in: %w", m.Stage, err)
		}
	}
	if r.capture == nil {
		r.ops(s)
	} else {
		if !r.capture.BeginStep(s) {
			r.ops(s)
		}
		if err := r.capture.EndStep(); err != nil {
			return fmt.Errorf("model: forward step: %w", err)
		}
	}
	if !m.Stage.Last() {
		if err := r.Be.ReadBuf(out[:n*c.Embd], r.x.Slice(0, n*c.Embd)); err != nil {
			return fmt.Errorf("model: %s: the hidden states out: %w", m.Stage, err)
		}
	}
	if err := r.Be.Err(); err != nil {
		return fmt.Errorf("model: forward step on %s: %w", r.Be.Name(), err)
	}
	if m.Stage.Last() && b.Hidden != nil && len(b.Outputs) > 0 {
		// Read after the step, outside its capture: the step's ops stay those of its shape.
		rows := len(b.Outputs) * c.Embd
		if len(b.Hidden) < rows {
			return fmt.Errorf("model: hidden-state buffer holds %d values, want %d", len(b.Hidden), rows)
		}
		if err := r.Be.ReadBuf(b.Hidden[:rows], r.outN.Slice(0, rows)); err != nil {
			return fmt.Errorf("model: reading the hidden states: %w", err)
		}
	}
	return nil
}

// ops issues the ops of step s (of the model's stage: its layers; the embedding on the
// first, the logits on the last). What they are depends on s's shape alone; the host
// slices they read and write are s's (see hal.StepCapturer).
func (r *Runner) ops(s *hal.Step) {
	m, be := r.M, r.Be
	c := &m.Config
	n := len(s.Attn.Pos)
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	x, xn, tmp := r.x.Slice(0, n*c.Embd), r.xn.Slice(0, n*c.Embd), r.tmp.Slice(0, n*c.Embd)
	q, att := r.q.Slice(0, n*qDim), r.att.Slice(0, n*qDim)
	k, v := r.k.Slice(0, n*kvDim), r.v.Slice(0, n*kvDim)
	ffnRows := min(n, ffnChunkRows)

	if m.Stage.First() {
		be.Embed(x, m.Embedding, s.Tokens)
	}
	scale := attnScale(c.HeadDim)
	lo, hi := m.layerRange()
	for li := lo; li < hi; li++ {
		l := &m.Layers[li]
		kl := li - lo // the layer's index in the stage's KV store
		be.RMSNorm(xn, x, l.AttnNorm, c.NormEps)
		r.matMuls(xn, n, hal.MatMulOut{Out: q, W: l.Wq}, hal.MatMulOut{Out: k, W: l.Wk}, hal.MatMulOut{Out: v, W: l.Wv})
		r.adapt(q, xn, li, RoleQ, 0, n)
		r.adapt(k, xn, li, RoleK, 0, n)
		r.adapt(v, xn, li, RoleV, 0, n)
		if l.Bq != nil {
			be.AddBias(q, l.Bq)
		}
		if l.Bk != nil {
			be.AddBias(k, l.Bk)
		}
		if l.Bv != nil {
			be.AddBias(v, l.Bv)
		}
		if l.QNorm != nil {
			be.RMSNorm(q, q, l.QNorm, c.NormEps)
		}
		if l.KNorm != nil {
			be.RMSNorm(k, k, l.KNorm, c.NormEps)
		}
		be.RoPE(q, c.Heads, c.HeadDim, s.Attn.Pos, r.rope)
		be.RoPE(k, c.KVHeads, c.HeadDim, s.Attn.Pos, r.rope)
		be.StoreKV(s.KV, kl, k, v, s.Attn)
		be.Attention(att, q, c.Heads, scale, s.KV, kl, s.Attn)
		be.MatMul(tmp, att, n, l.Wo)
		r.adapt(tmp, att, li, RoleO, 0, n)
		be.Add(x, tmp)

		be.RMSNorm(xn, x, l.FFNNorm, c.NormEps)
		for lo := 0; lo < n; lo += ffnRows {
			hi := min(n, lo+ffnRows)
			gate, up := r.gate.Slice(0, (hi-lo)*c.FFN), r.up.Slice(0, (hi-lo)*c.FFN)
			xc := xn.Slice(lo*c.Embd, hi*c.Embd)
			r.matMuls(xc, hi-lo, hal.MatMulOut{Out: gate, W: l.Gate}, hal.MatMulOut{Out: up, W: l.Up})
			r.adapt(gate, xc, li, RoleGate, lo, hi)
			r.adapt(up, xc, li, RoleUp, lo, hi)
			be.SiLUMul(gate, up)
			be.MatMul(tmp.Slice(lo*c.Embd, hi*c.Embd), gate, hi-lo, l.Down)
			r.adapt(tmp.Slice(lo*c.Embd, hi*c.Embd), gate, li, RoleDown, lo, hi)
		}
		be.Add(x, tmp)
	}
	no := len(s.Outputs)
	if no == 0 || !m.Stage.Last() {
		return
	}
	outX, outN := r.outX.Slice(0, no*c.Embd), r.outN.Slice(0, no*c.Embd)
	be.CopyRows(outX, x, c.Embd, s.Outputs)
	be.RMSNorm(outN, outX, m.OutputNorm, c.NormEps)
	be.Logits(s.Logits, outN, no, m.Output)
}
