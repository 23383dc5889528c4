package cpu

import (
	"encoding/binary"
	"math"
	"sync"
	"unsafe"

	"tandem/hal"
)

// Packed weights: for the formats with a packed kernel (see packFormats),
// MatMul first copies a weight once into an interleaved layout of groups of
// packRows rows, so that one 64-byte vector holds four quants of each of 16
// rows. A VNNI instruction then multiplies them with four activation bytes
// broadcast to every lane, and each lane accumulates one output element's
// exact int32 block sum: no horizontal reductions, each weight vector
// loaded once for up to four activation rows. The per-block float
// operations are the reference's, in its order, lane by lane, so every
// output element keeps the bits of vecDotRef.
//
// The packed quants are unsigned (VPDPBUSD multiplies unsigned by signed
// bytes): Q8_0 stores q+128, Q5_0 and Q4_0 their raw 5- and 4-bit codes
// (q+16, q+8). The offset times Σx of the activation block is subtracted
// from the int32 sum, which keeps it exact.

// packRows is the number of weight rows interleaved in one group (the
// int32 lanes of a 512-bit vector).
const packRows = 16

// packedWeight is a weight in the packed layout of its format.
type packedWeight struct {
	f      *packFormat
	groups int
	nb     int // blocks per row
	data   []byte
	free   func() // releases data
	src    packSource
	// released: the source's file pages were dropped once packed, and
	// rows read from it later (Embed) are dropped again.
	released bool
}

// packFormat describes one packed layout and its kernels.
type packFormat struct {
	// layout names the bytes pack writes, for the prepared form's format id
	// (port.go): formats whose pack functions are the same share it.
	layout          string
	groupBlockBytes int   // bytes of one block of one 16-row group
	blockElems      int   // elements in a block: 32, or 256 for K-quants
	corrMul         int32 // the weight codes' offset: s = Σcode·x − corrMul·Σx
	// sideWords is the int32 words per block of an activation side row,
	// which side writes from the activation row xq (nb blocks).
	sideWords int
	side      func(side []int32, xq []byte, nb int, corrMul int32)
	// pack writes the group of rows src (at most packRows, each nb blocks)
	// into dst; missing rows are zero.
	pack func(dst []byte, src [][]byte, nb int)
	// k4 and k1 compute 16 outputs (one per group row) for four and one
	// activation rows; see packKernel4 and packKernel1.
	k4 packKernel4
	k1 packKernel1
	// k4pf, when set, is k4 that also prefetches a quarter of the next
	// group (packKernel4PF).
	k4pf packKernel4PF
	// kw, when set, is k4 for kwRows activation rows, used on full
	// groups: more independent accumulators for formats whose kernels are
	// bound by their chains' latency (F16's FMAs), and each weight vector
	// decoded once for more rows.
	kw     packKernel4
	kwRows int
	// kwpf, when set, is kw that also prefetches kwRows/16 of the next
	// group, as k4pf.
	kwpf packKernel4PF
	// approx: the kernels sum in their own order and rounding (BF16's
	// VDPBF16PS adds products two at a time in float32 lanes, F32's FMAs
	// do not round the products), so an output is the reference's within
	// rounding, not its bits; still the same bits for any number of rows.
	approx bool
}

// packKernel4 computes, for the group at w (nb blocks) and the activation
// rows x + m·xstride (Q8_0) with their side rows side + m·sstride, the 16
// outputs of row m at out + m·ostride bytes, for m < 4.
type packKernel4 func(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

// packKernel4PF is packKernel4 that also prefetches, unless pf is nil, a
// quarter of a group's bytes from pf on: the calls for activation rows
// 0-3, 4-7, 8-11 and 12-15 of a group fetch the four quarters of the next
// group while they compute. With 16 or more rows the kernels are bound by
// VNNI throughput, and without it each group's start waited on memory.
type packKernel4PF func(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

// packKernel1 is packKernel4 for one activation row.
type packKernel1 func(nb int, w, x, side *byte, out *float32)

// packCache holds the packed copies of the weights a backend has seen. It
// is keyed by the *hal.Weight, which it keeps alive, so that no other
// weight can take its address; a weight whose data, type or shape changed
// is packed anew. Copies live until Close.
type packCache struct {
	mu    sync.Mutex
	m     map[*hal.Weight]*packedWeight
	arena packArena // a replaced copy's slab piece stays allocated until release
	// imports release the memory of imported copies (ImportWeights), at release.
	imports []func()
	// packs counts the weights packed, imported those given by ImportWeights.
	packs, imported int
}

// packed returns w's packed copy, packing it on first use on workers; nil when w's
// format has no packed kernel on this CPU.
func (c *packCache) packed(w *hal.Weight, workers *pool) *packedWeight {
	f := packFormatFor(kern.isa, w.Type)
	if f == nil || len(w.Data) == 0 || w.Cols%f.blockElems != 0 {
		return nil
	}
	src := packSource{data: unsafe.SliceData(w.Data), n: len(w.Data), typ: w.Type, rows: w.Rows, cols: w.Cols}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.m[w]; ok {
		if p.src == src {
			return p
		}
		p.free()
		delete(c.m, w)
	}
	if c.m == nil {
		c.m = make(map[*hal.Weight]*packedWeight)
	}
	p := packWeight(f, w, c.arena.alloc, workers)
	p.src = src
	c.packs++
	c.m[w] = p
	return p
}

// packSource identifies the bytes a packed copy was made from.
type packSource struct {
	data       *byte
	n          int
	typ        hal.DType
	rows, cols int
}

// released reports whether w has a packed copy whose source pages are
// dropped after use.
func (c *packCache) released(w *hal.Weight) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.m[w]
	return ok && p.released
}

// release frees every packed copy.
func (c *packCache) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, p := range c.m {
		p.free()
		delete(c.m, k)
	}
	c.arena.release()
	for _, f := range c.imports {
		f()
	}
	c.imports = nil
}

// packWeight copies w into f's layout.
func packWeight(f *packFormat, w *hal.Weight, alloc func(int) ([]byte, func()), workers *pool) *packedWeight {
	nb := w.Cols / f.blockElems
	groups := (w.Rows + packRows - 1) / packRows
	gb := f.groupBlockBytes * nb
	data, free := alloc(groups * gb)
	p := &packedWeight{f: f, groups: groups, nb: nb, data: data, free: free}
	t := &packTask{f: f, w: w, dst: data, gb: gb, nb: nb}
	rb := w.RowBytes()
	rel := newSourceReleaser(w.Data)
	// All workers pack (packing a large model is mostly page faults on the
	// fresh copy, which the kernel serves in parallel), a wave of about
	// packWaveBytes of the source at a time, whose pages are dropped
	// before the next wave reads on.
	wave := max(1, packWaveBytes/(packRows*rb))
	for g := 0; g < groups; g += wave {
		t.first = g
		workers.run(min(wave, groups-g), t)
		rel.upTo(min((g+wave)*packRows, w.Rows) * rb)
	}
	rel.finish()
	p.released = rel.ok
	return p
}

// packWaveBytes is how much of a weight's source the workers pack between
// two releases of its pages.
const packWaveBytes = 8 << 20

// packTask packs a range of row groups of w into dst, from group first on.
type packTask struct {
	f      *packFormat
	w      *hal.Weight
	dst    []byte
	gb, nb int
	first  int
}

func (t *packTask) runRange(_, lo, hi int) {
	rb := t.w.RowBytes()
	var rows [packRows][]byte
	for g := t.first + lo; g < t.first+hi; g++ {
		src := rows[:0]
		for r := g * packRows; r < min((g+1)*packRows, t.w.Rows); r++ {
			src = append(src, t.w.Data[r*rb:(r+1)*rb])
		}
		t.f.pack(t.dst[g*t.gb:(g+1)*t.gb], src, t.nb)
	}
}

// sideQ8_0 writes, for each Q8_0 block of the activation row xq, the
// float32 scale and the int32 correction corrMul·Σx the packed kernels
// read (8 bytes a block).
func sideQ8_0(side []int32, xq []byte, nb int, corrMul int32) {
	side = side[:2*nb]
	xq = xq[:34*nb]
	for i := range nb {
		xb := xq[34*i : 34*i+34]
		side[2*i] = int32(math.Float32bits(f16At(xb)))
		side[2*i+1] = corrMul * sumInt8x32((*[32]byte)(xb[2:34]))
	}
}

// sumInt8x32 returns the sum of 32 int8 values, eight at a time in a
// uint64: flipping the sign bits makes them q+128, which pairwise add into
// 16-bit lanes without carries between lanes.
func sumInt8x32(q *[32]byte) int32 {
	const lo8 = 0x00FF00FF00FF00FF
	var s uint64
	for j := 0; j < 32; j += 8 {
		v := binary.LittleEndian.Uint64(q[j:]) ^ 0x8080808080808080
		s += v&lo8 + v>>8&lo8 // four lanes of at most 510, summed 4 times
	}
	s = s * 0x0001000100010001 >> 48 // the four lanes: at most 8160
	return int32(s) - 32*128
}

// packedTask computes the outputs of a range of row groups of packed
// weights for all activation rows, each group read once per four rows. The
// weights (up to maxProducts, of one format and width) multiply the same
// activation rows; their groups are numbered one weight after the other.
type packedTask struct {
	b         *Backend
	parts     [maxProducts]packedPart
	nparts    int
	xq        []byte
	xrb, rows int
	side      []int32
}

// packedPart is one weight of a packedTask: its groups are the task's
// first..first+p.groups.
type packedPart struct {
	p     *packedWeight
	out   []float32
	n     int // the weight's rows: the width of out
	first int
}

// maxProducts bounds the weights one MatMuls call runs as one job: the
// attention's q, k and v.
const maxProducts = 3

func (t *packedTask) runRange(worker, lo, hi int) {
	for i := range t.nparts {
		pt := &t.parts[i]
		if a, b := max(lo, pt.first), min(hi, pt.first+pt.p.groups); a < b {
			t.runGroups(worker, pt, a-pt.first, b-pt.first)
		}
	}
}

// runGroups computes groups lo..hi of one weight.
func (t *packedTask) runGroups(worker int, pt *packedPart, lo, hi int) {
	p, f, nb, n, rows, xrb := pt.p, pt.p.f, pt.p.nb, pt.n, t.rows, t.xrb
	xq, side, out := t.xq, t.side, pt.out
	gb := f.groupBlockBytes * nb
	sw := f.sideWords * nb
	sstride := 4 * sw
	tmp := &t.b.wbufs[worker].tmp
	m4 := rows &^ 3 // rows below m4 go through the four- (or wide) row kernels
	for g := lo; g < hi; g++ {
		w := &p.data[g*gb]
		j := g * packRows
		full := j+packRows <= n
		m := 0
		if f.kw != nil && full {
			for ; m+f.kwRows <= m4; m += f.kwRows {
				sp := sideRow(side, sw*m)
				if f.kwpf != nil {
					f.kwpf(nb, w, &xq[m*xrb], xrb, sp, sstride, &out[m*n+j], 4*n, p.prefetchFor(g, m))
					continue
				}
				f.kw(nb, w, &xq[m*xrb], xrb, sp, sstride, &out[m*n+j], 4*n)
			}
		}
		for ; m < m4; m += 4 {
			sp := sideRow(side, sw*m)
			if full && f.k4pf != nil {
				f.k4pf(nb, w, &xq[m*xrb], xrb, sp, sstride, &out[m*n+j], 4*n, p.prefetchFor(g, m))
				continue
			}
			if full {
				f.k4(nb, w, &xq[m*xrb], xrb, sp, sstride, &out[m*n+j], 4*n)
				continue
			}
			f.k4(nb, w, &xq[m*xrb], xrb, sp, sstride, &tmp[0], 4*packRows)
			for mm := range 4 {
				copy(out[(m+mm)*n+j:(m+mm+1)*n], tmp[mm*packRows:mm*packRows+n-j])
			}
		}
		for ; m < rows; m++ {
			sp := sideRow(side, sw*m)
			if full {
				f.k1(nb, w, &xq[m*xrb], sp, &out[m*n+j])
				continue
			}
			f.k1(nb, w, &xq[m*xrb], sp, &tmp[0])
			copy(out[m*n+j:(m+1)*n], tmp[:n-j])
		}
	}
}

// sideRow returns where the side row at word i starts; nil for formats
// without side rows.
func sideRow(side []int32, i int) *byte {
	if len(side) == 0 {
		return nil
	}
	return (*byte)(unsafe.Pointer(&side[i]))
}

// prefetchFor returns where the call of a PF kernel for group g and
// activation rows from m on starts prefetching: the share m/16 of the next
// group, as the calls for the first 16 rows each fetch their part of it;
// nil (no prefetch) for later rows and for the last group.
func (p *packedWeight) prefetchFor(g, m int) *byte {
	if m >= packRows || g+1 >= p.groups {
		return nil
	}
	gb := p.f.groupBlockBytes * p.nb
	return &p.data[(g+1)*gb+m*gb/packRows]
}

// packQ8_0 lays out one 16-row group of Q8_0 rows: per block, the 16 FP16
// scales (32 bytes), then for each 4-quant step k of 8 the four codes
// q+128 of rows 0..15 (64 bytes).
func packQ8_0(dst []byte, src [][]byte, nb int) {
	const gbb = 32 + 8*64
	dst = dst[:gbb*nb]
	for i := range dst {
		dst[i] = 0
	}
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for k := range 8 {
			for r := range packRows {
				for i := range 4 {
					d[32+64*k+4*r+i] = 0x80 // code of a zero quant in missing rows
				}
			}
		}
		for r, row := range src {
			blk := row[34*b : 34*b+34]
			d[2*r], d[2*r+1] = blk[0], blk[1]
			for k := range 8 {
				for i := range 4 {
					d[32+64*k+4*r+i] = blk[2+4*k+i] ^ 0x80
				}
			}
		}
	}
}

// packQ5_0 lays out one 16-row group of Q5_0 rows: per block, the 16 FP16
// scales (32 bytes); for t < 4 the bytes 4t..4t+3 of the 16 rows' low-bit
// nibbles (64 bytes each: low nibbles are quants 4t.., high nibbles quants
// 16+4t..); then each row's high bits as a 32-bit word H (64 bytes), where
// the high bit of quant 4s+i (s < 8, i < 4) is bit 8i+s, so that one shift
// and mask put step s's four high bits at bit 4 of their bytes.
func packQ5_0(dst []byte, src [][]byte, nb int) {
	const gbb = 32 + 4*64 + 64
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[22*b : 22*b+22]
			d[2*r], d[2*r+1] = blk[0], blk[1]
			for t := range 4 {
				copy(d[32+64*t+4*r:32+64*t+4*r+4], blk[6+4*t:6+4*t+4])
			}
			binary.LittleEndian.PutUint32(d[288+4*r:], q5HighWord(binary.LittleEndian.Uint32(blk[2:6])))
		}
	}
}

// packQ4_0 lays out one 16-row group of Q4_0 rows: per block, the 16 FP16
// scales (32 bytes), then for t < 4 the bytes 4t..4t+3 of the 16 rows'
// nibbles (64 bytes each).
func packQ4_0(dst []byte, src [][]byte, nb int) {
	const gbb = 32 + 4*64
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[18*b : 18*b+18]
			d[2*r], d[2*r+1] = blk[0], blk[1]
			for t := range 4 {
				copy(d[32+64*t+4*r:32+64*t+4*r+4], blk[2+4*t:2+4*t+4])
			}
		}
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// packQ4_K lays out one 16-row group of Q4_K rows: per super-block, the
// rows' FP16 d (32 bytes) and dmin (32 bytes); the 6-bit scales as bytes,
// sub-block j's 16 at 64+16j; the 6-bit mins as bytes in pairs, rows'
// (m_2i, m_2i+1) at 192+32i (a word pair per row once widened); then for
// each 32-byte chunk c of the quants and step t the bytes 32c+4t..32c+4t+3
// of the 16 rows (64 bytes at 320+512c+64t: low nibbles are sub-block 2c,
// high nibbles sub-block 2c+1).
func packQ4_K(dst []byte, src [][]byte, nb int) { packQK(dst, src, nb, false) }

// packQ5_K is packQ4_K's layout for Q5_K rows, followed by the 5th bits:
// for step t the bytes 4t..4t+3 of the 16 rows' qh (64 bytes at 2368+64t;
// bit 2c is the 5th bit of chunk c's low nibble, bit 2c+1 of its high one).
func packQ5_K(dst []byte, src [][]byte, nb int) { packQK(dst, src, nb, true) }

func packQK(dst []byte, src [][]byte, nb int, q5 bool) {
	gbb, bb, qs := 2368, 144, 16
	if q5 {
		gbb, bb, qs = 2880, 176, 48
	}
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[bb*b : bb*(b+1)]
			d[2*r], d[2*r+1] = blk[0], blk[1]
			d[32+2*r], d[32+2*r+1] = blk[2], blk[3]
			scales := (*[12]byte)(blk[4:16])
			for j := range 8 {
				sc, m := scaleMinK4(j, scales)
				d[64+16*j+r] = sc
				d[192+32*(j/2)+2*r+j%2] = m
			}
			for c := range 4 {
				for t := range 8 {
					copy(d[320+512*c+64*t+4*r:320+512*c+64*t+4*r+4], blk[qs+32*c+4*t:qs+32*c+4*t+4])
				}
			}
			if q5 {
				for t := range 8 {
					copy(d[2368+64*t+4*r:2368+64*t+4*r+4], blk[16+4*t:16+4*t+4])
				}
			}
		}
	}
}

// sideQ8_K writes, for each Q8_K super-block of the activation row xq, the
// float32 scale and the four int16 pairs (p_2i, p_2i+1), p_j the sum of
// sub-block j's quants (from the block's 16-element sums), which the
// packed K-quant kernels multiply with the mins (8 words a block).
func sideQ8_K(side []int32, xq []byte, nb int, _ int32) {
	side = side[:8*nb]
	for i := range nb {
		yd, _, bs := q8K(xq[292*i:])
		o := side[8*i : 8*i+8]
		o[0] = int32(math.Float32bits(yd))
		for k := range 4 {
			p0 := bsum(bs, 4*k) + bsum(bs, 4*k+1)
			p1 := bsum(bs, 4*k+2) + bsum(bs, 4*k+3)
			o[1+k] = int32(uint32(uint16(int16(p0))) | uint32(uint16(int16(p1)))<<16)
		}
		o[5], o[6], o[7] = 0, 0, 0
	}
}

// packQ6_K lays out one 16-row group of Q6_K rows: per super-block, the
// rows' FP16 d (32 bytes); the 16 int8 group scales, group G's 16 at
// 32+16G; then the low-bit bytes (ql) of each half h in 4-byte chunks j
// < 16, 64 bytes of 16 rows at q6kQL(h, j), and the high bits (qh) in
// chunks j < 8 at q6kQH(h, j).
func packQ6_K(dst []byte, src [][]byte, nb int) {
	const gbb = 3360
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[210*b : 210*b+210]
			d[2*r], d[2*r+1] = blk[208], blk[209]
			for g := range 16 {
				d[32+16*g+r] = blk[192+g]
			}
			for h := range 2 {
				for j := range 16 {
					o := q6kQL(h, j) + 4*r
					copy(d[o:o+4], blk[64*h+4*j:64*h+4*j+4])
				}
				for j := range 8 {
					o := q6kQH(h, j) + 4*r
					copy(d[o:o+4], blk[128+32*h+4*j:128+32*h+4*j+4])
				}
			}
		}
	}
}

// The codes of a packed Q6_K block come in the order the kernels read
// them: for each half h and quarter q, the chunks of steps 4q..4q+3 as
// (ql, qh) pairs, then the ql chunks of their second pass. With the ql and
// qh arrays apart, the reads hopped across the block and the hardware
// prefetcher fell behind (10 GB/s from memory instead of 25).
func q6kRegion(h, step int) int { return 288 + 768*(2*h+step/4) }

// q6kQL is the offset of 64-byte ql chunk j (0..15) of half h.
func q6kQL(h, j int) int {
	step := j % 8
	if j < 8 {
		return q6kRegion(h, step) + 128*(step%4)
	}
	return q6kRegion(h, step) + 512 + 64*(step%4)
}

// q6kQH is the offset of 64-byte qh chunk j (0..7) of half h.
func q6kQH(h, j int) int { return q6kRegion(h, j) + 128*(j%4) + 64 }

// sideQ6_K writes, for each Q8_K super-block of the activation row xq, the
// float32 scale and 32·(sum of quant group G) for the 16 groups, which
// the packed Q6_K kernels subtract for the codes' offset of 32 (20 words
// a block).
func sideQ6_K(side []int32, xq []byte, nb int, _ int32) {
	side = side[:20*nb]
	for i := range nb {
		yd, _, bs := q8K(xq[292*i:])
		o := side[20*i : 20*i+20]
		o[0] = int32(math.Float32bits(yd))
		for g := range 16 {
			o[1+g] = 32 * bsum(bs, g)
		}
		o[17], o[18], o[19] = 0, 0, 0
	}
}

// packF16 lays out one 16-row group of F16 rows: for each of the block's
// 16 columns k, the 16 rows' values (32 bytes).
func packF16(dst []byte, src [][]byte, nb int) {
	const gbb = 16 * 32
	dst = dst[:gbb*nb]
	clear(dst)
	for r, row := range src {
		row = row[:32*nb]
		for k := range 16 * nb {
			dst[32*k+2*r], dst[32*k+2*r+1] = row[2*k], row[2*k+1]
		}
	}
}

// packBF16 lays out one 16-row group of BF16 rows: for each of the block's
// 8 column pairs (2p, 2p+1), the 16 rows' pairs (64 bytes), as VDPBF16PS
// multiplies them with an activation pair.
func packBF16(dst []byte, src [][]byte, nb int) { packWords(dst, src, 8*nb) }

// packF32 lays out one 16-row group of F32 rows: for each of the block's
// 16 columns k, the 16 rows' values (64 bytes).
func packF32(dst []byte, src [][]byte, nb int) { packWords(dst, src, 16*nb) }

// packWords interleaves the 4-byte words of up to 16 rows of n words: word
// i of row r goes to dst[64i+4r:].
func packWords(dst []byte, src [][]byte, n int) {
	dst = dst[:64*n]
	clear(dst)
	for r, row := range src {
		row = row[:4*n]
		for i := range n {
			binary.LittleEndian.PutUint32(dst[64*i+4*r:], binary.LittleEndian.Uint32(row[4*i:]))
		}
	}
}

// packQ4_1 lays out one 16-row group of Q4_1 rows: per block, the 16 FP16
// scales d (32 bytes) and mins m (32 bytes), then the nibbles as packQ4_0.
func packQ4_1(dst []byte, src [][]byte, nb int) {
	const gbb = 64 + 4*64
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[20*b : 20*b+20]
			d[2*r], d[2*r+1] = blk[0], blk[1]
			d[32+2*r], d[32+2*r+1] = blk[2], blk[3]
			for t := range 4 {
				copy(d[64+64*t+4*r:64+64*t+4*r+4], blk[4+4*t:4+4*t+4])
			}
		}
	}
}

// packQ5_1 lays out one 16-row group of Q5_1 rows: d and m as packQ4_1,
// then the nibbles and high-bit words as packQ5_0.
func packQ5_1(dst []byte, src [][]byte, nb int) {
	const gbb = 64 + 4*64 + 64
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[24*b : 24*b+24]
			d[2*r], d[2*r+1] = blk[0], blk[1]
			d[32+2*r], d[32+2*r+1] = blk[2], blk[3]
			for t := range 4 {
				copy(d[64+64*t+4*r:64+64*t+4*r+4], blk[8+4*t:8+4*t+4])
			}
			binary.LittleEndian.PutUint32(d[320+4*r:], q5HighWord(binary.LittleEndian.Uint32(blk[4:8])))
		}
	}
}

// q5HighWord reorders a Q5 block's high bits: the bit of quant 4s+i goes
// to bit 8i+s.
func q5HighWord(qh uint32) uint32 {
	var h uint32
	for s := range 8 {
		for i := range 4 {
			h |= (qh >> (4*s + i) & 1) << (8*i + s)
		}
	}
	return h
}

// sideQ8_1 writes, for each Q8_1 block of the activation row xq, its scale
// d and its stored sum s as float32 (8 bytes a block).
func sideQ8_1(side []int32, xq []byte, nb int, _ int32) {
	side = side[:2*nb]
	xq = xq[:36*nb]
	for i := range nb {
		xb := xq[36*i : 36*i+36]
		side[2*i] = int32(math.Float32bits(f16At(xb)))
		side[2*i+1] = int32(math.Float32bits(f16At(xb[2:])))
	}
}
