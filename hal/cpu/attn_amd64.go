package cpu

import "unsafe"

//go:noescape
func attnScores16AVX512(q *float32, hd int, k *float32, offs *int32, nblk int, scale float32, out *float32)

//go:noescape
func attnAccumV16AVX512(o *float32, hd int, v *float32, offs *int32, n int, w *float32)

// attn16AVX512 are the AVX-512 attention kernels for 16-position blocks.
var attn16AVX512 = &attnKernels{
	scores: func(q, k []float32, offs []int32, scale float32, sc []float32) {
		hd := len(q)
		if len(offs) == 0 {
			return
		}
		_ = sc[16*len(offs)-1]
		blocksInBounds(k, offs, hd)
		attnScores16AVX512(&q[0], hd, unsafe.SliceData(k), &offs[0], len(offs), scale, &sc[0])
	},
	accumV: func(o, v []float32, offs []int32, w []float32) {
		hd := len(o)
		if len(w) == 0 {
			clear(o)
			return
		}
		nblk := (len(w) + 15) / 16
		_ = offs[nblk-1]
		blocksInBounds(v, offs[:nblk], hd)
		attnAccumV16AVX512(&o[0], hd, unsafe.SliceData(v), &offs[0], len(w), &w[0])
	},
}

// attnKernelsFor returns the SIMD attention kernels for head size hd and
// KV block size bs, or nil where only the scalar loops serve: they need
// AVX-512, blocks of 16 positions and a head size that is a multiple of 16.
func attnKernelsFor(isa string, hd, bs int) *attnKernels {
	if isa != "avx512vnni" || bs != 16 || hd <= 0 || hd%16 != 0 {
		return nil
	}
	return attn16AVX512
}

// blocksInBounds panics, as an index out of range, unless each 16-position
// block of hd values at offs lies in kv: the assembly kernels do not check.
func blocksInBounds[E float32 | uint16](kv []E, offs []int32, hd int) {
	for _, o := range offs {
		_ = kv[int(o)+16*hd-1]
	}
}
