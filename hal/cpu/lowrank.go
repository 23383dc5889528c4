package cpu

import "tandem/hal"

// The low-rank update of LoRA adapters (hal.LowRanker): per row, Rank dot products of the
// input with A's rows, then Rank scaled rows of Bᵀ added up, in the order hal.LowRanker
// writes down. The amd64 kernels (lowrank_amd64.s) run the same float32 operations in the
// same order, 16 lanes at a time, so they give the reference's bits.

var _ hal.LowRanker = (*Backend)(nil)

// lowRankInline is the work (multiply-adds) below which an update runs on the calling
// goroutine: a decode row of a rank-16 adapter on a 1k-wide projection is ~30k, a few µs,
// less than waking the workers.
const lowRankInline = 1 << 16

// AddLowRank adds each span's low-rank update to its rows of out (see hal.LowRanker).
func (b *Backend) AddLowRank(outb, xb hal.Buf, spans []hal.LowRankSpan) {
	out, x := host(outb), host(xb)
	rows, work := 0, 0
	for _, s := range spans {
		w := s.W
		if len(w.A) < w.Rank*w.In || len(w.BT) < w.Rank*w.Out || (s.Row+s.Rows)*w.In > len(x) || (s.Row+s.Rows)*w.Out > len(out) {
			panic("cpu: AddLowRank: a span outside its buffers or an adapter of the wrong shape")
		}
		rows += s.Rows
		work += s.Rows * w.Rank * (w.In + w.Out)
	}
	if rows == 0 {
		return
	}
	b.lowRank = lowRankTask{b: b, spans: spans, x: x, out: out}
	if work < lowRankInline || b.pool.n == 1 {
		b.lowRank.runRange(0, 0, rows)
		return
	}
	b.pool.run(rows, &b.lowRank)
}

// lowRankTask runs the update over a range of the spans' rows, counted across the spans
// in order.
type lowRankTask struct {
	b      *Backend
	spans  []hal.LowRankSpan
	x, out []float32
}

func (t *lowRankTask) runRange(worker, lo, hi int) {
	si, base := 0, 0 // the span holding row lo, and the index of its first row
	for base+t.spans[si].Rows <= lo {
		base += t.spans[si].Rows
		si++
	}
	for i := lo; i < hi; i++ {
		for i-base >= t.spans[si].Rows {
			base += t.spans[si].Rows
			si++
		}
		s := &t.spans[si]
		w := s.W
		r := s.Row + i - base
		scratch := t.b.workerScratch(worker, w.Rank+w.Out)
		lowRankRow(t.out[r*w.Out:(r+1)*w.Out], t.x[r*w.In:(r+1)*w.In], w, scratch[:w.Rank], scratch[w.Rank:])
	}
}

// lowRankRow adds w's update of the input row x to the output row out, with t (Rank) and
// u (Out) as scratch: the kernels where the CPU has them, else the reference.
func lowRankRow(out, x []float32, w *hal.LowRank, t, u []float32) {
	for i := range w.Rank {
		t[i] = float32(w.Scale * dotLanes16(w.A[i*w.In:(i+1)*w.In], x))
	}
	clear(u)
	for i := range w.Rank {
		axpyLowRank(u, t[i], w.BT[i*w.Out:(i+1)*w.Out])
	}
	add(out, u)
}

// lowRankRowRef is lowRankRow in pure Go: the reference the kernels are held to.
func lowRankRowRef(out, x []float32, w *hal.LowRank, t, u []float32) {
	for i := range w.Rank {
		t[i] = float32(w.Scale * dotLanes16Ref(w.A[i*w.In:(i+1)*w.In], x))
	}
	clear(u)
	for i := range w.Rank {
		axpyRef(u, t[i], w.BT[i*w.Out:(i+1)*w.Out])
	}
	for j := range out {
		out[j] = out[j] + u[j]
	}
}

// dotLanes16 is Σ a[k]·x[k] in hal.LowRanker's order, by the kernel where the CPU has one.
func dotLanes16(a, x []float32) float32 {
	n := len(a) &^ 15
	if n == 0 || !lowRankSIMD() {
		return dotLanes16Ref(a, x)
	}
	_ = x[len(a)-1]
	s := dotLanes16SIMD(&a[0], &x[0], n/16)
	for k := n; k < len(a); k++ {
		s = s + float32(a[k]*x[k])
	}
	return s
}

// dotLanes16Ref is the reference of dotLanes16.
func dotLanes16Ref(a, x []float32) float32 {
	var lane [16]float32
	n := len(a) &^ 15
	x = x[:len(a)]
	for k := 0; k < n; k += 16 {
		for l := range 16 {
			lane[l] = lane[l] + float32(a[k+l]*x[k+l])
		}
	}
	for l := range 8 {
		lane[l] = lane[l] + lane[l+8]
	}
	for l := range 4 {
		lane[l] = lane[l] + lane[l+4]
	}
	for l := range 2 {
		lane[l] = lane[l] + lane[l+2]
	}
	s := lane[0] + lane[1]
	for k := n; k < len(a); k++ {
		s = s + float32(a[k]*x[k])
	}
	return s
}

// axpyLowRank sets dst[j] = dst[j] + s·src[j], the product rounded first, by the kernel where
// the CPU has one.
func axpyLowRank(dst []float32, s float32, src []float32) {
	n := 0
	if lowRankSIMD() {
		n = len(dst) &^ 7
		if n > 0 {
			_ = src[len(dst)-1]
			axpySIMD(&dst[0], &src[0], s, n/8)
		}
	}
	axpyRef(dst[n:], s, src[n:len(dst)])
}

// axpyRef is the reference of axpyLowRank.
func axpyRef(dst []float32, s float32, src []float32) {
	src = src[:len(dst)]
	for j := range dst {
		dst[j] = dst[j] + float32(s*src[j])
	}
}
