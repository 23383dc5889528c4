package vulkan

import (
	"fmt"
	"unsafe"

	"tandem/hal"
)

// The op set. Each op records its dispatches into the command buffer of the
// step being recorded, or, outside a step, into b.imm, which it then runs
// and waits for (begin, end). An op after a failure does nothing.

// begin readies a command buffer for an op; false if the backend failed.
func (b *Backend) begin() bool {
	if b.err != nil {
		return false
	}
	if b.rec != nil || b.replayed {
		if b.replayed {
			panic("vulkan: an op issued during a replayed step (hal.StepCapturer: the model issues none)")
		}
		return true
	}
	if err := b.beginCmd(b.imm, true); err != nil {
		b.fail(err)
		return false
	}
	return true
}

// end runs an op issued outside a step.
func (b *Backend) end() {
	if b.rec != nil || b.cur != b.imm || b.cur == 0 {
		return
	}
	if b.err != nil {
		b.cur, b.bound = 0, 0
		return
	}
	if err := b.endCmd(); err != nil {
		b.fail(err)
		return
	}
	if err := b.run(b.sub, b.imm); err != nil {
		b.fail(err)
	}
	b.afterRun()
}

// afterRun frees what the finished submission may have read.
func (b *Backend) afterRun() {
	b.scratch.used = 0
	b.releaseRetired()
}

// scratch is host-visible memory for the inputs of ops that are not a
// step's (bump-allocated, reset after each submission).
type scratch struct {
	buf  *buffer
	used uint64
}

func (b *Backend) scratchBytes(n int) (uint64, []byte) {
	sz := uint64(n+15) &^ 15
	s := &b.scratch
	if s.buf == nil || s.used+sz > s.buf.size {
		if s.buf != nil {
			b.retired = append(b.retired, s.buf) // the recording may read it
		}
		nb, err := b.newBuffer(max(64<<10, 2*(s.used+sz)), memHost)
		if err != nil {
			b.fail(fmt.Errorf("vulkan: scratch for op inputs: %w", err))
			s.buf = nil
			return 0, nil
		}
		s.buf, s.used = nb, 0
	}
	a, m := s.buf.addr+s.used, s.buf.bytes()[s.used:s.used+uint64(n)]
	s.used += sz
	return a, m
}

// stepInput names the step field an op's host input should be.
type stepInput int

const (
	notStep stepInput = iota
	stepTokens
	stepPos
)

// ints is the device address of v: its place in the arena of the step being
// recorded where v is (a range of) the step's field in, else a copy.
func (b *Backend) ints(v []int32, in stepInput) uint64 {
	if len(v) == 0 {
		return 0
	}
	if c := b.rec; c != nil {
		var field []int32
		var off uint64
		switch in {
		case stepTokens:
			field, off = b.step.Tokens, c.tokOff
		case stepPos:
			field, off = b.step.Attn.Pos, c.posOff
		}
		if i, ok := within(v, field); ok {
			return c.arena.addr + off + 4*uint64(i)
		}
		c.dirty = true // a replay would not find this input
	}
	a, m := b.scratchBytes(4 * len(v))
	if m != nil {
		copy(m, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
	}
	return a
}

// within reports whether v is a range of field, and where it starts.
func within[T any](v, field []T) (int, bool) {
	if len(field) == 0 || len(v) > len(field) {
		return 0, false
	}
	p, lo := uintptr(unsafe.Pointer(&v[0])), uintptr(unsafe.Pointer(&field[0]))
	sz := unsafe.Sizeof(v[0])
	if p < lo || (p-lo)%sz != 0 {
		return 0, false
	}
	i := int((p - lo) / sz)
	return i, i+len(v) <= len(field)
}

// attn is the device addresses of a batch's positions, owning sequences
// and block tables, and the tables' stride.
func (b *Backend) attn(batch *hal.AttnBatch) (pos, seq, tables uint64, stride uint32) {
	if c := b.rec; c != nil && batch == b.step.Attn {
		return c.arena.addr + c.posOff, c.arena.addr + c.seqOff, c.arena.addr + c.tabOff, c.stride
	}
	if b.rec != nil {
		b.rec.dirty = true
	}
	stride = 1
	for _, t := range batch.Blocks {
		stride = max(stride, uint32(len(t)))
	}
	pos = b.ints(batch.Pos, notStep)
	seq = b.ints(batch.SeqOf, notStep)
	a, m := b.scratchBytes(4 * len(batch.Blocks) * int(stride))
	if m != nil {
		tb := unsafe.Slice((*int32)(unsafe.Pointer(&m[0])), len(m)/4)
		for s, t := range batch.Blocks {
			copy(tb[s*int(stride):], t)
		}
	}
	return pos, seq, a, stride
}

// rowsOf is the device address of CopyRows' row indices.
func (b *Backend) rowsOf(rows []int) uint64 {
	if len(rows) == 0 {
		return 0
	}
	if c := b.rec; c != nil {
		if i, ok := within(rows, b.step.Outputs); ok {
			return c.arena.addr + c.outOff + 4*uint64(i)
		}
		c.dirty = true
	}
	a, m := b.scratchBytes(4 * len(rows))
	if m != nil {
		v := unsafe.Slice((*int32)(unsafe.Pointer(&m[0])), len(rows))
		for i, r := range rows {
			v[i] = int32(r)
		}
	}
	return a
}

// foldRows is the (y, z) extent of a grid of n rows (tokens) one
// workgroup high, folded into z past 65535 (the shaders' foldedRow).
func foldRows(n int) (y, z uint32) {
	if n <= 65535 {
		return uint32(n), 1
	}
	return 65535, ceilDiv(n, 65535)
}

// vecDotConv is the conversion MatMul applies to activations for weights
// of encoding enc (-1: none, the F32 values are read as they are).
func vecDotConv(enc int) int {
	switch enc {
	case encF16:
		return convF16
	case encBF16:
		return convBF16
	case encQ8_0:
		return convQ8_0
	case encQ4_K, encQ6_K:
		return convQ8_K
	}
	return -1
}

// convStride is the words per row of k activations converted by conv.
func convStride(conv, k int) int {
	switch conv {
	case convF16, convBF16:
		return (k + 1) / 2
	case convQ8_0:
		return k / 32 * 9
	case convQ8_K:
		return k / 256 * 65
	}
	return k
}

// convert records the conversion of rows rows of x (k values each) for
// weights of encoding enc, and returns the converted rows' address and
// stride (in the shader's units: floats, halves or words).
func (b *Backend) convert(x hal.Buf, rows, k, enc int) (addr uint64, stride int, ok bool) {
	conv := vecDotConv(enc)
	if conv < 0 {
		return b.addr(x), k, true
	}
	words := convStride(conv, k)
	need := uint64(4 * words * rows)
	if b.xq == nil || b.xq.size < need {
		if b.xq != nil {
			b.dropCaptures()
			if b.xqUsed && b.rec != nil {
				b.rec.dirty = true
			}
			b.retired = append(b.retired, b.xq)
			b.xq = nil
		}
		xq, err := b.newBuffer(max(need, 1<<20), memDevice)
		if err != nil {
			b.fail(fmt.Errorf("vulkan: converted activations (%d bytes): %w", need, err))
			return 0, 0, false
		}
		b.xq = xq
	}
	b.xqUsed = true
	per := k / 32
	switch conv {
	case convF16, convBF16:
		per = (k + 1) / 2
	case convQ8_K:
		per = k / 256
	}
	b.pc.reset().addr(b.addr(x)).addr(b.xq.addr).u32(uint32(rows), uint32(k), uint32(words), 0)
	y, z := foldRows(rows)
	b.dispatch(b.quantizePipe(conv), ceilDiv(per, 64), y, z)
	stride = words
	if conv == convF16 || conv == convBF16 {
		stride = 2 * words // halves
	}
	return b.xq.addr, stride, true
}

// matmul records out = x·Wᵀ with x already converted (xa, xStride).
func (b *Backend) matmul(out uint64, outStride int, xa uint64, xStride, rows int, dw *devWeight) {
	form := b.matmulForm(rows, dw.rows)
	tilesN := ceilDiv(dw.rows, int(tileCols[form]))
	x, z := b.fold(tilesN)
	b.pc.reset().addr(dw.buf.addr).addr(xa).addr(out).
		u32(uint32(rows), uint32(dw.rows), uint32(dw.cols), uint32(outStride), x, uint32(xStride))
	b.dispatch(b.matmulPipe(dw.enc, form), x, ceilDiv(rows, int(tileRows[form])), z)
}

// MatMul sets out[m][n] = Σ_k x[m][k]·W[n][k].
func (b *Backend) MatMul(out, x hal.Buf, rows int, w *hal.Weight) {
	if rows == 0 || !b.begin() {
		return
	}
	defer b.end()
	dw := b.weight(w)
	if dw == nil {
		return
	}
	if xa, xs, ok := b.convert(x, rows, w.Cols, dw.enc); ok {
		b.matmul(b.addr(out), w.Rows, xa, xs, rows, dw)
	}
}

// MatMuls multiplies x by several weights, converting x once where they
// share a conversion; each product is MatMul's bits.
func (b *Backend) MatMuls(x hal.Buf, rows int, ps []hal.MatMulOut) {
	if rows == 0 || len(ps) == 0 || !b.begin() {
		return
	}
	defer b.end()
	var xa uint64
	var xs, conv, cols int
	for i, p := range ps {
		dw := b.weight(p.W)
		if dw == nil {
			return
		}
		if c := vecDotConv(dw.enc); i == 0 || c != conv || p.W.Cols != cols {
			var ok bool
			if xa, xs, ok = b.convert(x, rows, p.W.Cols, dw.enc); !ok {
				return
			}
			conv, cols = c, p.W.Cols
		}
		b.matmul(b.addr(p.Out), p.W.Rows, xa, xs, rows, dw)
	}
}

// Logits is MatMul into host memory: in a step, a host-visible buffer of
// the capture that EndStep (or the replay) copies into dst.
func (b *Backend) Logits(dst []float32, x hal.Buf, rows int, w *hal.Weight) {
	if rows == 0 || !b.begin() {
		return
	}
	n := rows * w.Rows
	out := b.logitsBuf(dst[:n])
	if dw := b.weight(w); out != nil && dw != nil {
		if xa, xs, ok := b.convert(x, rows, w.Cols, dw.enc); ok {
			b.matmul(out.addr, w.Rows, xa, xs, rows, dw)
		}
	}
	if b.rec == nil {
		b.end()
		if b.err == nil {
			copy(dst[:n], unsafe.Slice((*float32)(out.mapped), n))
		}
	}
}

// logitsBuf is the host-visible buffer Logits writes dst's values to.
func (b *Backend) logitsBuf(dst []float32) *buffer {
	need := uint64(4 * len(dst))
	slot := &b.logitsB
	if c := b.rec; c != nil {
		if len(b.step.Logits) == 0 || &dst[0] != &b.step.Logits[0] {
			c.dirty = true
		}
		c.logitsDst, c.nLogits = dst, len(dst)
		slot = &c.logits
	}
	if *slot == nil || (*slot).size < need {
		b.freeBuffer(*slot)
		*slot = nil
		lb, err := b.newBuffer(need, memHost)
		if err != nil {
			b.fail(fmt.Errorf("vulkan: logits (%d values): %w", len(dst), err))
			return nil
		}
		*slot = lb
	}
	return *slot
}

// Embed copies the rows ids of w into out as float32.
func (b *Backend) Embed(out hal.Buf, w *hal.Weight, ids []int32) {
	if len(ids) == 0 || !b.begin() {
		return
	}
	defer b.end()
	dw := b.weight(w)
	if dw == nil {
		return
	}
	idsAddr := b.ints(ids, stepTokens)
	b.pc.reset().addr(dw.buf.addr).addr(idsAddr).addr(b.addr(out)).u32(uint32(len(ids)), uint32(w.Cols))
	y, z := foldRows(len(ids))
	b.dispatch(b.embedPipe(dw.enc), ceilDiv(w.Cols, 64), y, z)
}

// CopyRows sets row i of dst to row rows[i] of src.
func (b *Backend) CopyRows(dst, src hal.Buf, width int, rows []int) {
	if len(rows) == 0 || !b.begin() {
		return
	}
	defer b.end()
	n := len(rows) * width
	x, z := b.fold(ceilDiv(n, 256))
	b.pc.reset().addr(b.addr(dst)).addr(b.addr(src)).addr(b.rowsOf(rows)).u32(uint32(n), 1, uint32(width), x)
	b.dispatch(b.elementwisePipe(opCopyRows), x, 1, z)
}

// RMSNorm normalises each row of x (rows of len(weight)) and scales by weight.
func (b *Backend) RMSNorm(out, x hal.Buf, weight []float32, eps float32) {
	n := len(weight)
	if n == 0 || x.Len() == 0 || !b.begin() {
		return
	}
	defer b.end()
	rows := x.Len() / n
	w := b.param(weight)
	b.pc.reset().addr(b.addr(x)).addr(b.addr(out)).addr(w).u32(uint32(n), uint32(rows)).f32(eps)
	b.dispatch(b.rmsNormPipe(), uint32(min(rows, 65535)), ceilDiv(rows, 65535), 1)
}

// RoPE rotates each head of each row of x in place; row i is at pos[i].
func (b *Backend) RoPE(x hal.Buf, heads, headDim int, pos []int32, r *hal.RoPE) {
	if len(pos) == 0 || !b.begin() {
		return
	}
	defer b.end()
	maxPos := int32(0)
	for _, p := range pos {
		if p < 0 {
			panic(fmt.Sprintf("vulkan: RoPE at position %d", p))
		}
		maxPos = max(maxPos, p)
	}
	t := b.rope(r, maxPos)
	if t == nil {
		return
	}
	if c := b.rec; c != nil {
		t.recUsed = true
		c.ropeCover = min(c.ropeCover, t.cover)
	}
	neox := uint32(0)
	if r.Neox {
		neox = 1
	}
	pairs := r.Dims / 2
	b.pc.reset().addr(b.addr(x)).addr(b.ints(pos, stepPos)).addr(t.buf.addr).
		u32(uint32(len(pos)), uint32(heads), uint32(headDim), uint32(r.Dims), neox)
	y, z := foldRows(len(pos))
	b.dispatch(b.ropePipe(), ceilDiv(heads*pairs, 64), y, z)
}

// StoreKV writes the keys and values of each token of the batch into layer
// layer of kv at the token's position.
func (b *Backend) StoreKV(kv hal.KVStore, layer int, k, v hal.Buf, batch *hal.AttnBatch) {
	if len(batch.Pos) == 0 || !b.begin() {
		return
	}
	defer b.end()
	s := b.store(kv)
	l := s.layout
	pos, seq, tables, stride := b.attn(batch)
	ka, va := s.layerAddr(layer)
	b.pc.reset().addr(b.addr(k)).addr(b.addr(v)).addr(pos).addr(seq).addr(tables).addr(ka).addr(va).
		u32(uint32(len(batch.Pos)), uint32(l.KVHeads), uint32(l.HeadDim), uint32(l.BlockSize), stride)
	y, z := foldRows(len(batch.Pos))
	b.dispatch(b.storeKVPipe(s.f16()), ceilDiv(l.KVHeads*l.HeadDim, 64), y, z)
}

// Attention computes causal attention of q over layer layer of kv.
func (b *Backend) Attention(out, q hal.Buf, heads int, scale float32, kv hal.KVStore, layer int, batch *hal.AttnBatch) {
	if len(batch.Pos) == 0 || !b.begin() {
		return
	}
	defer b.end()
	s := b.store(kv)
	l := s.layout
	if l.HeadDim > 256 || heads%l.KVHeads != 0 {
		panic(fmt.Sprintf("vulkan: attention with head size %d (at most 256) and %d heads over %d KV heads", l.HeadDim, heads, l.KVHeads))
	}
	pos, seq, tables, stride := b.attn(batch)
	ka, va := s.layerAddr(layer)
	b.pc.reset().addr(b.addr(q)).addr(b.addr(out)).addr(pos).addr(seq).addr(tables).addr(ka).addr(va).
		u32(uint32(heads), uint32(l.KVHeads), uint32(l.HeadDim), uint32(l.BlockSize), stride).f32(scale)
	y, z := foldRows(len(batch.Pos))
	b.dispatch(b.attentionPipe(s.f16()), uint32(heads), y, z)
}

// elementwise records op over n values of dst.
func (b *Backend) elementwise(op int, dst, src uint64, n, srcLen int) {
	x, z := b.fold(ceilDiv(n, 256))
	b.pc.reset().addr(dst).addr(src).addr(0).u32(uint32(n), uint32(srcLen), 1, x)
	b.dispatch(b.elementwisePipe(op), x, 1, z)
}

// SiLUMul sets gate[i] = silu(gate[i]) · up[i].
func (b *Backend) SiLUMul(gate, up hal.Buf) {
	if gate.Len() == 0 || !b.begin() {
		return
	}
	defer b.end()
	b.elementwise(opSiLUMul, b.addr(gate), b.addr(up), gate.Len(), gate.Len())
}

// Add sets dst[i] += src[i].
func (b *Backend) Add(dst, src hal.Buf) {
	if dst.Len() == 0 || !b.begin() {
		return
	}
	defer b.end()
	b.elementwise(opAdd, b.addr(dst), b.addr(src), dst.Len(), dst.Len())
}

// AddBias adds bias to every row of x.
func (b *Backend) AddBias(x hal.Buf, bias []float32) {
	if x.Len() == 0 || len(bias) == 0 || !b.begin() {
		return
	}
	defer b.end()
	n := x.Len() / len(bias) * len(bias)
	b.elementwise(opAdd, b.addr(x), b.param(bias), n, len(bias))
}
