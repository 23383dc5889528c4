package cpu

import (
	"math"

	"tandem/hal"
)

// MatMul converts each activation row once to the weight's vec-dot type (as
// llama.cpp does), then computes every output element as one dot product
// with a fixed reduction order. Work is split over weight rows, so each
// weight row is read once for the whole batch.
func (b *Backend) MatMul(out, x hal.Buf, rows int, w *hal.Weight) {
	b.matMul(host(out), host(x), rows, w)
}

// Logits is MatMul into host memory, which on the CPU is where MatMul writes.
func (b *Backend) Logits(dst []float32, x hal.Buf, rows int, w *hal.Weight) {
	b.matMul(dst, host(x), rows, w)
}

func (b *Backend) matMul(out, x []float32, rows int, w *hal.Weight) {
	if p := b.packs.packed(w, b.pool); p != nil {
		b.matMulPacked(x, rows, w, packedPart{p: p, out: out, n: w.Rows})
		return
	}
	k, n := w.Cols, w.Rows
	xq, xrb := b.quantize(x, rows, w, nil)
	b.mm = matmulTask{b: b, typ: w.Type, k: k, n: n, rows: rows, w: w.Data, wrb: w.RowBytes(), xq: xq, xrb: xrb, out: out}
	b.pool.run(n, &b.mm)
}

// MatMuls does MatMul(p.Out, x, rows, p.W) for each p of ps. Weights with
// packed copies of one format and width (a layer's q, k and v; gate and
// up) share one conversion of x and one job over all their rows: one wait
// for the workers instead of two per weight, and the small k and v
// projections no longer make jobs of their own.
func (b *Backend) MatMuls(xb hal.Buf, rows int, ps []hal.MatMulOut) {
	x := host(xb)
	var parts [maxProducts]packedPart
	shared := len(ps) <= maxProducts
	for i := 0; shared && i < len(ps); i++ {
		w := ps[i].W
		p := b.packs.packed(w, b.pool)
		shared = p != nil && (i == 0 || p.f == parts[0].p.f && w.Cols == ps[0].W.Cols)
		parts[i] = packedPart{p: p, out: host(ps[i].Out), n: w.Rows}
	}
	if !shared {
		for _, p := range ps {
			b.matMul(host(p.Out), x, rows, p.W)
		}
		return
	}
	b.matMulPacked(x, rows, ps[0].W, parts[:len(ps)]...)
}

// matMulPacked multiplies x by the packed weights of parts, which share w's
// format and width.
func (b *Backend) matMulPacked(x []float32, rows int, w *hal.Weight, parts ...packedPart) {
	xq, xrb := b.quantize(x, rows, w, parts[0].p)
	b.mmPack = packedTask{b: b, xq: xq, xrb: xrb, rows: rows, side: b.quant.side, nparts: len(parts)}
	groups := 0
	for i, pt := range parts {
		pt.first = groups
		b.mmPack.parts[i] = pt
		groups += pt.p.groups
	}
	b.pool.run(groups, &b.mmPack)
}

// quantize converts the rows of x to w's vec-dot type in a reused buffer
// and, for a packed weight p, writes the side rows its kernels read in the
// same job (each worker right after the row it converted).
func (b *Backend) quantize(x []float32, rows int, w *hal.Weight, p *packedWeight) (xq []byte, xrb int) {
	k := w.Cols
	vt := VecDotType(w.Type)
	xrb, err := vt.RowBytes(k)
	if err != nil {
		panic("cpu: MatMul: " + err.Error())
	}
	if need := rows * xrb; cap(b.xq) < need {
		b.xq = make([]byte, need)
	}
	xq = b.xq[:rows*xrb]
	b.quant = quantTask{vt: vt, k: k, x: x, xq: xq, xrb: xrb}
	if p != nil {
		sw := p.f.sideWords * p.nb
		if need := sw * rows; cap(b.sideBuf) < need {
			b.sideBuf = make([]int32, need)
		}
		b.quant.f, b.quant.side, b.quant.nb = p.f, b.sideBuf[:sw*rows], p.nb
	}
	b.pool.run(rows, &b.quant)
	return xq, xrb
}

// quantTask converts activation rows to a vec-dot type and, for a packed
// weight (f set), writes each row's side row too.
type quantTask struct {
	vt     hal.DType
	k, xrb int
	x      []float32
	xq     []byte

	f    *packFormat
	side []int32
	nb   int
}

func (t *quantTask) runRange(_, lo, hi int) {
	for m := lo; m < hi; m++ {
		xq := t.xq[m*t.xrb : (m+1)*t.xrb]
		QuantizeRow(t.vt, t.x[m*t.k:(m+1)*t.k], xq)
		if t.f != nil {
			sw := t.f.sideWords * t.nb
			t.f.side(t.side[sw*m:sw*(m+1)], xq, t.nb, t.f.corrMul)
		}
	}
}

// matmulTask runs matmulRange over a range of weight rows.
type matmulTask struct {
	b                    *Backend
	typ                  hal.DType
	k, n, rows, wrb, xrb int
	w, xq                []byte
	out                  []float32
}

func (t *matmulTask) runRange(worker, lo, hi int) {
	matmulRange(kern, t.typ, t.k, t.n, t.rows, t.w, t.wrb, t.xq, t.xrb, t.out, lo, hi, &t.b.wbufs[worker])
}

// Embed dequantizes the embedding rows of ids.
func (b *Backend) Embed(outb hal.Buf, w *hal.Weight, ids []int32) {
	out := host(outb)
	k := w.Cols
	rb := w.RowBytes()
	packed := b.packs.released(w)
	for i, id := range ids {
		row := w.Data[int(id)*rb : (int(id)+1)*rb]
		DequantizeRow(w.Type, row, out[i*k:(i+1)*k])
		if packed {
			// A tied embedding is also a packed output matrix: its file
			// pages need not stay resident beside the packed copy.
			releaseRow(row, w.Data)
		}
	}
}

// RMSNorm follows ggml: the mean square is summed in float64, the scale
// applied in float32, then the weight multiplied in.
func (b *Backend) RMSNorm(outb, xb hal.Buf, weight []float32, eps float32) {
	out, x := host(outb), host(xb)
	n := len(weight)
	rows := len(x) / n
	if rows*n < 4096 {
		for r := 0; r < rows; r++ {
			rmsNormRow(out[r*n:(r+1)*n], x[r*n:(r+1)*n], weight, eps)
		}
		return
	}
	b.norm = normTask{out: out, x: x, weight: weight, eps: eps}
	b.pool.run(rows, &b.norm)
}

// normTask normalises a range of rows.
type normTask struct {
	out, x, weight []float32
	eps            float32
}

func (t *normTask) runRange(_, lo, hi int) {
	n := len(t.weight)
	for r := lo; r < hi; r++ {
		rmsNormRow(t.out[r*n:(r+1)*n], t.x[r*n:(r+1)*n], t.weight, t.eps)
	}
}

func rmsNormRow(out, x, weight []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	mean := float32(sum / float64(len(x)))
	scale := float32(1 / math.Sqrt(float64(mean+eps)))
	out = out[:len(x)]
	weight = weight[:len(x)]
	for i, v := range x {
		out[i] = (v * scale) * weight[i]
	}
}

// RoPE rotates pairs of each head by position-dependent angles. Angles are
// built as ggml builds them: θ_i = pos · base^(-2i/dims) by repeated float32
// multiplication, divided by the frequency factor and scaled.
func (b *Backend) RoPE(x hal.Buf, heads, headDim int, pos []int32, r *hal.RoPE) {
	b.rope = ropeTask{b: b, x: host(x), heads: heads, headDim: headDim, pos: pos, r: r}
	b.pool.run(len(pos), &b.rope)
}

// ropeTask rotates a range of rows.
type ropeTask struct {
	b              *Backend
	x              []float32
	heads, headDim int
	pos            []int32
	r              *hal.RoPE
}

func (t *ropeTask) runRange(worker, lo, hi int) {
	r := t.r
	rowLen := t.heads * t.headDim
	cache := t.b.workerScratch(worker, r.Dims)
	for i := lo; i < hi; i++ {
		ropeCache(cache, float32(t.pos[i]), r)
		row := t.x[i*rowLen : (i+1)*rowLen]
		for h := 0; h < t.heads; h++ {
			ropeHead(row[h*t.headDim:(h+1)*t.headDim], cache, r)
		}
	}
}

func ropeCache(cache []float32, p float32, r *hal.RoPE) {
	thetaScale := float32(math.Pow(r.Base, -2.0/float64(r.Dims)))
	freqScale := r.FreqScale
	if freqScale == 0 {
		freqScale = 1
	}
	theta := p
	for i := 0; i < r.Dims; i += 2 {
		ff := float32(1)
		if r.FreqFactors != nil {
			ff = r.FreqFactors[i/2]
		}
		th := freqScale * (theta / ff)
		cache[i] = float32(math.Cos(float64(th)))
		cache[i+1] = float32(math.Sin(float64(th)))
		theta *= thetaScale
	}
}

func ropeHead(x, cache []float32, r *hal.RoPE) {
	half := r.Dims / 2
	for i := 0; i < r.Dims; i += 2 {
		c, s := cache[i], cache[i+1]
		var a, b int
		if r.Neox {
			a, b = i/2, i/2+half
		} else {
			a, b = i, i+1
		}
		x0, x1 := x[a], x[b]
		x[a] = x0*c - x1*s
		x[b] = x0*s + x1*c
	}
}

// SiLUMul sets gate[i] = silu(gate[i]) · up[i].
// The SIMD kernel gives the same bits (see silu_amd64.s); it leaves chunks
// with extreme inputs to siluMulRef.
func (b *Backend) SiLUMul(gateb, upb hal.Buf) {
	gate := host(gateb)
	up := host(upb)[:len(gate)]
	if len(gate) < 2*elementwiseChunk {
		siluMul(gate, up)
		return
	}
	b.silu = siluTask{gate: gate, up: up}
	b.pool.run((len(gate)+elementwiseChunk-1)/elementwiseChunk, &b.silu)
}

// elementwiseChunk is the elements of one index of an elementwise op's pool
// job. SiLU costs about a nanosecond an element (an exact float64 exp), so
// a batch's 16 × 4864 gate values are worth splitting; a residual add of
// that size is not.
const elementwiseChunk = 4096

// siluTask runs SiLUMul over a range of chunks.
type siluTask struct{ gate, up []float32 }

func (t *siluTask) runRange(_, lo, hi int) {
	end := min(hi*elementwiseChunk, len(t.gate))
	siluMul(t.gate[lo*elementwiseChunk:end], t.up[lo*elementwiseChunk:end])
}

func siluMul(gate, up []float32) {
	for i := 0; i < len(gate); {
		i += siluMulSIMD(gate[i:], up[i:])
		end := min(i+8, len(gate))
		siluMulRef(gate[i:end], up[i:end])
		i = end
	}
}

func siluMulRef(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
	}
}

// Add sets dst[i] += src[i].
func (b *Backend) Add(dst, src hal.Buf) { add(host(dst), host(src)) }

func add(dst, src []float32) {
	src = src[:len(dst)]
	i := addSIMD(dst, src)
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// AddBias adds bias to every row of x.
func (b *Backend) AddBias(xb hal.Buf, bias []float32) {
	x := host(xb)
	n := len(bias)
	for r := 0; r+n <= len(x); r += n {
		add(x[r:r+n], bias)
	}
}

// CopyRows sets row i of dst to row rows[i] of src.
func (b *Backend) CopyRows(dstb, srcb hal.Buf, width int, rows []int) {
	dst, src := host(dstb), host(srcb)
	for i, r := range rows {
		copy(dst[i*width:(i+1)*width], src[r*width:(r+1)*width])
	}
}

func (b *Backend) workerScratch(worker, n int) []float32 {
	if cap(b.scratch[worker]) < n {
		b.scratch[worker] = make([]float32, n)
	}
	return b.scratch[worker][:n]
}

func (b *Backend) workerOffsets(worker, n int) []int32 {
	if cap(b.offsets[worker]) < n {
		b.offsets[worker] = make([]int32, n)
	}
	return b.offsets[worker][:n]
}
