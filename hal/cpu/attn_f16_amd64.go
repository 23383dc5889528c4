package cpu

import "unsafe"

//go:noescape
func attnScores16F16AVX512(q *float32, hd int, k *uint16, offs *int32, nblk int, scale float32, out *float32)

//go:noescape
func attnAccumV16F16AVX512(o *float32, hd int, v *uint16, offs *int32, n int, w *float32)

//go:noescape
func attnScores16F16AVX2(q *float32, hd int, k *uint16, offs *int32, nblk int, scale float32, out *float32)

//go:noescape
func attnAccumV16F16AVX2(o *float32, hd int, v *uint16, offs *int32, n int, w *float32)

type (
	attnScoresF16Asm func(q *float32, hd int, k *uint16, offs *int32, nblk int, scale float32, out *float32)
	attnAccumF16Asm  func(o *float32, hd int, v *uint16, offs *int32, n int, w *float32)
)

// newAttnKernelsF16 wraps a pair of assembly kernels for 16-position blocks
// with the bounds checks that keep them inside their slices.
func newAttnKernelsF16(scores attnScoresF16Asm, accum attnAccumF16Asm) *attnKernelsF16 {
	return &attnKernelsF16{
		scores: func(q []float32, k []uint16, offs []int32, scale float32, sc []float32) {
			hd := len(q)
			if len(offs) == 0 {
				return
			}
			_ = sc[16*len(offs)-1]
			blocksInBounds(k, offs, hd)
			scores(&q[0], hd, unsafe.SliceData(k), &offs[0], len(offs), scale, &sc[0])
		},
		accumV: func(o []float32, v []uint16, offs []int32, w []float32) {
			hd := len(o)
			if len(w) == 0 {
				clear(o)
				return
			}
			nblk := (len(w) + 15) / 16
			_ = offs[nblk-1]
			blocksInBounds(v, offs[:nblk], hd)
			accum(&o[0], hd, unsafe.SliceData(v), &offs[0], len(w), &w[0])
		},
	}
}

var (
	attn16F16AVX512 = newAttnKernelsF16(attnScores16F16AVX512, attnAccumV16F16AVX512)
	attn16F16AVX2   = newAttnKernelsF16(attnScores16F16AVX2, attnAccumV16F16AVX2)
)

// attnKernelsF16For returns the SIMD attention kernels over an F16 store for
// head size hd and KV block size bs, or nil where only the scalar loops
// serve: they need blocks of 16 positions and a head size that is a
// multiple of the vector width (16 floats for AVX-512, 8 for AVX2; an
// AVX-512 CPU takes the AVX2 kernels for head sizes that are only a
// multiple of 8).
func attnKernelsF16For(isa string, hd, bs int) *attnKernelsF16 {
	if bs != 16 || hd <= 0 || hd%8 != 0 {
		return nil
	}
	switch {
	case isa == "avx512vnni" && hd%16 == 0:
		return attn16F16AVX512
	case (isa == "avx512vnni" || isa == "avx2") && feat.avx2:
		return attn16F16AVX2
	}
	return nil
}
