package cpu

import (
	"fmt"
	"math"

	"tandem/hal"
)

// kvStore keeps each layer's keys and values block-major: within a block,
// one KV head's BlockSize positions are contiguous. Values are stored
// position by position ([slot][dim]); keys transposed ([dim][slot]), so
// that the scores of a block's positions are computed lane by lane, each
// with the sequential float32 sum of dotF32. Elements are float32 (k, v)
// or FP16 (k16, v16), as the layout's DType says; kb and vb are the same
// arrays as bytes.
type kvStore struct {
	layout   hal.KVLayout
	k, v     [][]float32 // per layer; F32 stores
	k16, v16 [][]uint16  // per layer; F16 stores
	kb, vb   [][]byte    // per layer, either type
}

// NewKVStore allocates a paged key/value store in host memory, of float32
// or FP16 elements.
func (b *Backend) NewKVStore(l hal.KVLayout) (hal.KVStore, error) {
	if l.Layers <= 0 || l.Blocks <= 0 || l.BlockSize <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return nil, fmt.Errorf("cpu: invalid KV layout %+v", l)
	}
	if l.DType != hal.F32 && l.DType != hal.F16 {
		return nil, fmt.Errorf("cpu: KV element type %v is not supported (F32 or F16)", l.DType)
	}
	per := l.Blocks * l.BlockSize * l.KVHeads * l.HeadDim
	if per/l.Blocks != l.BlockSize*l.KVHeads*l.HeadDim || per > math.MaxInt32 {
		// Attention addresses a layer's blocks by int32 element offsets.
		return nil, fmt.Errorf("cpu: KV layout %+v has more than 2³¹ elements a layer", l)
	}
	return newHostKVStore(l, per)
}

func (s *kvStore) Layout() hal.KVLayout { return s.layout }

func (s *kvStore) Bytes() int64 {
	l := s.layout
	return int64(l.Layers) * 2 * int64(l.Blocks*l.BlockSize*l.KVHeads*l.HeadDim) * int64(l.ElemBytes())
}

func (s *kvStore) blockLen() int { return s.layout.BlockSize * s.layout.KVHeads * s.layout.HeadDim }

func (s *kvStore) CopyBlock(dst, src int) {
	n := s.blockLen() * s.layout.ElemBytes()
	for l := range s.kb {
		copy(s.kb[l][dst*n:(dst+1)*n], s.kb[l][src*n:(src+1)*n])
		copy(s.vb[l][dst*n:(dst+1)*n], s.vb[l][src*n:(src+1)*n])
	}
}

// offset is where (block, head, slot) starts in a layer's array, in elements.
func (s *kvStore) offset(block, head, slot int) int {
	l := s.layout
	return ((block*l.KVHeads+head)*l.BlockSize + slot) * l.HeadDim
}

// StoreKV writes each token's keys and values at its position; an F16 store
// rounds them to nearest even.
func (b *Backend) StoreKV(store hal.KVStore, layer int, kb, vb hal.Buf, batch *hal.AttnBatch) {
	k, v := host(kb), host(vb)
	s := store.(*kvStore)
	l := s.layout
	row := l.KVHeads * l.HeadDim
	f16 := l.DType == hal.F16
	for t, p := range batch.Pos {
		blocks := batch.Blocks[batch.SeqOf[t]]
		blk := int(blocks[int(p)/l.BlockSize])
		slot := int(p) % l.BlockSize
		for h := 0; h < l.KVHeads; h++ {
			o := s.offset(blk, h, slot)
			ko := s.offset(blk, h, 0)
			kt := k[t*row+h*l.HeadDim : t*row+(h+1)*l.HeadDim]
			vt := v[t*row+h*l.HeadDim : t*row+(h+1)*l.HeadDim]
			if f16 {
				vd := s.v16[layer][o : o+l.HeadDim]
				for i, x := range vt {
					vd[i] = FP32ToFP16(x)
				}
				kb := s.k16[layer][ko:]
				for i, x := range kt {
					kb[i*l.BlockSize+slot] = FP32ToFP16(x)
				}
				continue
			}
			copy(s.v[layer][o:o+l.HeadDim], vt)
			kb := s.k[layer][ko:]
			for i, x := range kt {
				kb[i*l.BlockSize+slot] = x
			}
		}
	}
}

// Attention computes, for each token and head, softmax(q·Kᵀ·scale)·V over
// positions 0..pos of the token's sequence. Each (token, head) is computed
// alone with a fixed order over positions, so the result does not depend on
// the batch, the chunking, or the prefill/decode path. The SIMD kernels
// (attnKernels) run the same float32 operations per score and per output
// element as the scalar loops, only for several of them at once. Over an
// F16 store every key and value is widened to float32 (exactly) and then
// takes the same operations, so an F16 store gives the bits an F32 store
// holding the same rounded values would.
func (b *Backend) Attention(outb, qb hal.Buf, heads int, scale float32, store hal.KVStore, layer int, batch *hal.AttnBatch) {
	out, q := host(outb), host(qb)
	s := store.(*kvStore)
	l := s.layout
	hd, bs := l.HeadDim, l.BlockSize
	maxPos := int32(0)
	for _, p := range batch.Pos {
		maxPos = max(maxPos, p)
	}
	maxBlocks := int(maxPos)/bs + 1
	b.attn = attnTask{b: b, s: s, out: out, q: q, heads: heads, scale: scale, batch: batch, maxBlocks: maxBlocks}
	if l.DType == hal.F16 {
		b.attn.kl16, b.attn.vl16 = s.k16[layer], s.v16[layer]
		b.attn.ak16 = attnKernelsF16For(kern.isa, hd, bs)
	} else {
		b.attn.kl, b.attn.vl = s.k[layer], s.v[layer]
		b.attn.ak = attnKernelsFor(kern.isa, hd, bs)
	}
	if heads > l.KVHeads && heads%l.KVHeads == 0 && !b.perHeadAttn {
		// Grouped-query attention: one unit per (token, KV head), reading the
		// KV head once for all the query heads that share it.
		if b.attn.gk = attnGroupKernelsFor(kern.isa, l.DType, hd, bs); b.attn.gk != nil {
			b.pool.run(len(batch.Pos)*l.KVHeads, &b.attn)
			return
		}
	}
	b.pool.run(len(batch.Pos)*heads, &b.attn)
}

// attnTask computes attention for a range of (token, head) pairs, or of
// (token, KV head) pairs where gk is set.
type attnTask struct {
	b          *Backend
	s          *kvStore
	out, q     []float32
	heads      int
	scale      float32
	kl, vl     []float32 // F32 store
	kl16, vl16 []uint16  // F16 store
	batch      *hal.AttnBatch
	ak         *attnKernels
	ak16       *attnKernelsF16
	gk         *attnGroupKernels // set: units are (token, KV head), run by runGroups
	maxBlocks  int
}

func (a *attnTask) runRange(worker, lo, hi int) {
	if a.gk != nil {
		a.runGroups(worker, lo, hi)
		return
	}
	b, s, batch, heads, scale, q, out := a.b, a.s, a.batch, a.heads, a.scale, a.q, a.out
	l := s.layout
	hd, bs := l.HeadDim, l.BlockSize
	f16 := l.DType == hal.F16
	group := heads / l.KVHeads
	maxBlocks := a.maxBlocks
	scores := b.workerScratch(worker, maxBlocks*bs)
	offs := b.workerOffsets(worker, maxBlocks)
	for i := lo; i < hi; i++ {
		t, h := i/heads, i%heads
		kvh := h / group
		n := int(batch.Pos[t]) + 1
		nblk := (n + bs - 1) / bs
		blocks := batch.Blocks[batch.SeqOf[t]]
		for bi := range nblk {
			offs[bi] = int32(s.offset(int(blocks[bi]), kvh, 0))
		}
		qh := q[(t*heads+h)*hd : (t*heads+h+1)*hd]
		sc := scores[:nblk*bs]
		switch {
		case f16 && a.ak16 != nil:
			a.ak16.scores(qh, a.kl16, offs[:nblk], scale, sc)
		case f16:
			attnScoresF16Ref(qh, a.kl16, offs[:nblk], bs, scale, sc)
		case a.ak != nil:
			a.ak.scores(qh, a.kl, offs[:nblk], scale, sc)
		default:
			attnScoresRef(qh, a.kl, offs[:nblk], bs, scale, sc)
		}
		sc = sc[:n]
		inv := softmaxExp(sc)
		for j, w := range sc {
			sc[j] = w * inv
		}
		oh := out[(t*heads+h)*hd : (t*heads+h+1)*hd]
		switch {
		case f16 && a.ak16 != nil:
			a.ak16.accumV(oh, a.vl16, offs[:nblk], sc)
		case f16:
			attnAccumVF16Ref(oh, a.vl16, offs[:nblk], bs, sc)
		case a.ak != nil:
			a.ak.accumV(oh, a.vl, offs[:nblk], sc)
		default:
			attnAccumVRef(oh, a.vl, offs[:nblk], bs, sc)
		}
	}
}

// softmaxExp sets sc[j] = exp(sc[j] − max sc) and returns the factor,
// 1/Σ, that makes them the softmax. The per-head and grouped paths both
// call it: their outputs are the same bits.
func softmaxExp(sc []float32) float32 {
	expShifted(sc, maxOf(sc))
	return float32(1 / softmaxSum(sc))
}

// maxOf returns the largest of v (−Inf for none), four running maxima at a
// time: max is exact and, NaN and ±0 included, the same in any order.
func maxOf(v []float32) float32 {
	m0, m1, m2, m3 := float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))
	j := 0
	for ; j+4 <= len(v); j += 4 {
		m0, m1, m2, m3 = max(m0, v[j]), max(m1, v[j+1]), max(m2, v[j+2]), max(m3, v[j+3])
	}
	for ; j < len(v); j++ {
		m0 = max(m0, v[j])
	}
	return max(max(m0, m1), max(m2, m3))
}

// softmaxSum is the softmax's normalizer Σv in float64, in a fixed order that
// does not depend on the batch: four lanes, lane i summing v[i], v[i+4], …
// in turn, then (lane 0 + lane 1) + (lane 2 + lane 3), then the tail. Four
// chains instead of one: a single sequential float64 sum waited on the adder's
// latency for every score, a tenth of a long prompt's time.
func softmaxSum(v []float32) float64 {
	var s0, s1, s2, s3 float64
	j := 0
	for ; j+4 <= len(v); j += 4 {
		s0 += float64(v[j])
		s1 += float64(v[j+1])
		s2 += float64(v[j+2])
		s3 += float64(v[j+3])
	}
	sum := (s0 + s1) + (s2 + s3)
	for ; j < len(v); j++ {
		sum += float64(v[j])
	}
	return sum
}

// attnScoresRef sets sc[j] = (q·k_j)·scale for the positions of the blocks
// at offs (keys transposed: k_j[i] at off + i·bs + slot), each dot product
// summed in float32 in index order, as dotF32.
func attnScoresRef(q, k []float32, offs []int32, bs int, scale float32, sc []float32) {
	for bi, off := range offs {
		kb := k[off : int(off)+len(q)*bs]
		for slot := range bs {
			var d float32
			for i, qv := range q {
				d += float32(qv * kb[i*bs+slot])
			}
			sc[bi*bs+slot] = d * scale
		}
	}
}

// attnAccumVRef sets o = Σ_j w[j]·v_j over the positions j < len(w), in
// order of j, as axpy does.
func attnAccumVRef(o, v []float32, offs []int32, bs int, w []float32) {
	clear(o)
	hd := len(o)
	for j, wj := range w {
		off := int(offs[j/bs]) + (j%bs)*hd
		axpy(o, v[off:off+hd], wj)
	}
}

// attnKernels are the SIMD versions of attnScoresRef and attnAccumVRef for
// one head size and block size.
type attnKernels struct {
	scores func(q, k []float32, offs []int32, scale float32, sc []float32)
	accumV func(o, v []float32, offs []int32, w []float32)
}

func axpy(dst, x []float32, a float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += float32(a * x[i])
	}
}

// expShifted sets v[j] = float32(math.Exp(float64(v[j] - m))), with SIMD
// where it gives the same bits.
func expShifted(v []float32, m float32) {
	for i := 0; i < len(v); {
		i += expShiftedSIMD(v[i:], m)
		end := min(i+8, len(v))
		for j := i; j < end; j++ {
			v[j] = float32(math.Exp(float64(v[j] - m)))
		}
		i = end
	}
}
