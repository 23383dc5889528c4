package cpu

import (
	"unsafe"

	"tandem/hal"
)

//go:noescape
func packQ8_0x4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ8_0x4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ8_0x1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ5_0x4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ5_0x4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ5_0x1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ4_0x4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ4_0x4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ4_0x1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ4_Kx4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ4_Kx4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ4_Kx1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ6_Kx4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ6_Kx4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ6_Kx1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packF16x4AVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packF16x1AVX512(nb int, w, x, side *byte, out *float32)

//go:noescape
func sideF16AVX512(n int, src *byte, dst *int32)

//go:noescape
func packF16x8PFAVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packF16x8AVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ5_Kx4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ5_Kx4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ5_Kx1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ4_1x4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ4_1x4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ4_1x1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ5_1x4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ5_1x4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ5_1x1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packBF16x8AVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packBF16x8PFAVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packBF16x4AVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packBF16x1AVX512(nb int, w, x, side *byte, out *float32)

//go:noescape
func packF32x8AVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packF32x8PFAVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packF32x4AVX512(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packF32x1AVX512(nb int, w, x, side *byte, out *float32)

//go:noescape
func packF16x4AVX2(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packF16x1AVX2(nb int, w, x, side *byte, out *float32)

//go:noescape
func packBF16x4AVX2(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packBF16x1AVX2(nb int, w, x, side *byte, out *float32)

//go:noescape
func packF32x4AVX2(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packF32x1AVX2(nb int, w, x, side *byte, out *float32)

var (
	packFormatQ8_0 = &packFormat{layout: "q8_0.vnni", groupBlockBytes: 544, corrMul: 128, blockElems: 32, sideWords: 2, side: sideQ8_0, pack: packQ8_0, k4: packQ8_0x4VNNI, k4pf: packQ8_0x4PFVNNI, k1: packQ8_0x1VNNI}
	packFormatQ5_0 = &packFormat{layout: "q5_0", groupBlockBytes: 352, corrMul: 16, blockElems: 32, sideWords: 2, side: sideQ8_0, pack: packQ5_0, k4: packQ5_0x4VNNI, k4pf: packQ5_0x4PFVNNI, k1: packQ5_0x1VNNI}
	packFormatQ4_K = &packFormat{layout: "q4_k", groupBlockBytes: 2368, blockElems: 256, sideWords: 8, side: sideQ8_K, pack: packQ4_K, k4: packQ4_Kx4VNNI, k4pf: packQ4_Kx4PFVNNI, k1: packQ4_Kx1VNNI}
	packFormatQ5_K = &packFormat{layout: "q5_k", groupBlockBytes: 2880, blockElems: 256, sideWords: 8, side: sideQ8_K, pack: packQ5_K, k4: packQ5_Kx4VNNI, k4pf: packQ5_Kx4PFVNNI, k1: packQ5_Kx1VNNI}
	packFormatQ6_K = &packFormat{layout: "q6_k.vnni", groupBlockBytes: 3360, blockElems: 256, sideWords: 20, side: sideQ6_K, pack: packQ6_K, k4: packQ6_Kx4VNNI, k4pf: packQ6_Kx4PFVNNI, k1: packQ6_Kx1VNNI}
	packFormatF16  = &packFormat{layout: "f16", groupBlockBytes: 512, blockElems: 16, sideWords: 16, side: sideF16SIMD, pack: packF16, k4: packF16x4AVX512, k1: packF16x1AVX512, kw: packF16x8AVX512, kwpf: packF16x8PFAVX512, kwRows: 8}
	packFormatQ4_1 = &packFormat{layout: "q4_1", groupBlockBytes: 320, blockElems: 32, sideWords: 2, side: sideQ8_1, pack: packQ4_1, k4: packQ4_1x4VNNI, k4pf: packQ4_1x4PFVNNI, k1: packQ4_1x1VNNI}
	packFormatQ5_1 = &packFormat{layout: "q5_1", groupBlockBytes: 384, blockElems: 32, sideWords: 2, side: sideQ8_1, pack: packQ5_1, k4: packQ5_1x4VNNI, k4pf: packQ5_1x4PFVNNI, k1: packQ5_1x1VNNI}
	packFormatBF16 = &packFormat{layout: "bf16", groupBlockBytes: 512, blockElems: 16, side: sideNone, pack: packBF16, k4: packBF16x4AVX512, k1: packBF16x1AVX512, kw: packBF16x8AVX512, kwpf: packBF16x8PFAVX512, kwRows: 8, approx: true}
	packFormatF32  = &packFormat{layout: "f32", groupBlockBytes: 1024, blockElems: 16, side: sideNone, pack: packF32, k4: packF32x4AVX512, k1: packF32x1AVX512, kw: packF32x8AVX512, kwpf: packF32x8PFAVX512, kwRows: 8, approx: true}
	// The float formats for CPUs with AVX2 but not AVX-512 (BF16 also
	// where AVX-512 lacks AVX512_BF16): the layouts above, 8 lanes at a time.
	packFormatF16AVX2  = &packFormat{layout: "f16", groupBlockBytes: 512, blockElems: 16, sideWords: 16, side: sideF16, pack: packF16, k4: packF16x4AVX2, k1: packF16x1AVX2}
	packFormatBF16AVX2 = &packFormat{layout: "bf16", groupBlockBytes: 512, blockElems: 16, sideWords: 16, side: sideBF16, pack: packBF16, k4: packBF16x4AVX2, k1: packBF16x1AVX2, approx: true}
	packFormatF32AVX2  = &packFormat{layout: "f32", groupBlockBytes: 1024, blockElems: 16, side: sideNone, pack: packF32, k4: packF32x4AVX2, k1: packF32x1AVX2, approx: true}
	packFormatQ4_0     = &packFormat{layout: "q4_0", groupBlockBytes: 288, corrMul: 8, blockElems: 32, sideWords: 2, side: sideQ8_0, pack: packQ4_0, k4: packQ4_0x4VNNI, k4pf: packQ4_0x4PFVNNI, k1: packQ4_0x1VNNI}
)

// packFormatFor returns the packed layout MatMul uses for weights of type
// t under isa, or nil.
func packFormatFor(isa string, t hal.DType) *packFormat {
	if isa == "avx2" {
		switch t {
		case hal.F16:
			return packFormatF16AVX2
		case hal.BF16:
			return packFormatBF16AVX2
		case hal.F32:
			return packFormatF32AVX2
		}
		return packFormatIntAVX2(t)
	}
	if isa != "avx512vnni" {
		return nil
	}
	switch t {
	case hal.Q8_0:
		return packFormatQ8_0
	case hal.Q5_0:
		return packFormatQ5_0
	case hal.Q4_0:
		return packFormatQ4_0
	case hal.Q4_1:
		return packFormatQ4_1
	case hal.Q5_1:
		return packFormatQ5_1
	case hal.Q4_K:
		return packFormatQ4_K
	case hal.Q5_K:
		return packFormatQ5_K
	case hal.Q6_K:
		return packFormatQ6_K
	case hal.Q3_K:
		return packFormatQ3_K
	case hal.Q2_K:
		return packFormatQ2_K
	case hal.F16:
		return packFormatF16
	case hal.BF16:
		if feat.avx512bf16 {
			return packFormatBF16
		}
		return packFormatBF16AVX2
	case hal.F32:
		return packFormatF32
	}
	return nil
}

// sideF16SIMD widens the F16 activation row xq to float32 (16 words a
// block of 16), which the packed F16 kernels broadcast. VCVTPH2PS widens
// exactly, as fp16Table does (NaNs aside, which it quiets).
func sideF16SIMD(side []int32, xq []byte, nb int, _ int32) {
	n := 16 * nb
	if n == 0 {
		return
	}
	_, _ = side[n-1], xq[2*n-1]
	sideF16AVX512(n, &xq[0], &side[0])
}

// sideNone is the side row of formats whose kernels read the activation
// rows alone.
func sideNone([]int32, []byte, int, int32) {}

// sideF16 and sideBF16 widen the activation row xq to float32 (16 words a
// block of 16), which the packed AVX2 F16 and BF16 kernels broadcast.
func sideF16(side []int32, xq []byte, nb int, _ int32)  { widenSide(hal.F16, side, xq, nb) }
func sideBF16(side []int32, xq []byte, nb int, _ int32) { widenSide(hal.BF16, side, xq, nb) }

func widenSide(t hal.DType, side []int32, xq []byte, nb int) {
	n := 16 * nb
	if n == 0 {
		return
	}
	DequantizeRow(t, xq[:2*n], unsafe.Slice((*float32)(unsafe.Pointer(&side[0])), n))
}

// kernelFeatures names the kernels in use and the features that choose
// among packed layouts, for PreparedKey.
func kernelFeatures() string {
	if kern.isa == "avx512vnni" && feat.avx512bf16 {
		return "avx512vnni+bf16"
	}
	return kern.isa
}
