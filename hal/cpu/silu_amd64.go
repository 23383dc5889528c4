package cpu

//go:noescape
func siluMulAVX512(gate, up *float32, n int) int

// siluMulSIMD does a prefix of SiLUMul with SIMD and returns its length.
func siluMulSIMD(gate, up []float32) int {
	if kern.isa != "avx512vnni" || len(gate) < 8 {
		return 0
	}
	_ = up[len(gate)-1]
	return siluMulAVX512(&gate[0], &up[0], len(gate))
}

//go:noescape
func addF32AVX512(dst, src *float32, n int) int

// addSIMD does a prefix of dst[i] += src[i] with SIMD and returns its length.
func addSIMD(dst, src []float32) int {
	if kern.isa != "avx512vnni" || len(dst) < 16 {
		return 0
	}
	_ = src[len(dst)-1]
	return addF32AVX512(&dst[0], &src[0], len(dst))
}

//go:noescape
func quantizeQ8_0AVX512(src *float32, dst *byte, nb int, d *float32) int

// quantizeQ8_0SIMD quantizes a prefix of the blocks of src to Q8_0 in dst
// with the same bits as quantizeQ8_0 and returns how many blocks it did.
func quantizeQ8_0SIMD(src []float32, dst []byte) int {
	if kern.isa != "avx512vnni" {
		return 0
	}
	nb := min(len(src)/32, len(dst)/34)
	var d [64]float32
	done := 0
	for done < nb {
		n := min(nb-done, len(d))
		k := quantizeQ8_0AVX512(&src[32*done], &dst[34*done], n, &d[0])
		for i := range k {
			putF16(dst[34*(done+i):], d[i])
		}
		done += k
		if k < n {
			break
		}
	}
	return done
}

//go:noescape
func quantizeQ8_KAVX512(src *float32, dst *byte, nb int) int

// quantizeQ8_KSIMD quantizes a prefix of the blocks of src to Q8_K in dst
// with the same bits as quantizeQ8_KBlock and returns how many blocks it did.
func quantizeQ8_KSIMD(src []float32, dst []byte) int {
	if kern.isa != "avx512vnni" {
		return 0
	}
	nb := min(len(src)/qkK, len(dst)/292)
	if nb == 0 {
		return 0
	}
	return quantizeQ8_KAVX512(&src[0], &dst[0], nb)
}

//go:noescape
func expShiftedAVX512(v *float32, n int, m float32) int

// expShiftedSIMD does a prefix of v[j] = float32(math.Exp(float64(v[j]-m)))
// with the same bits and returns its length.
func expShiftedSIMD(v []float32, m float32) int {
	if kern.isa != "avx512vnni" || len(v) < 8 {
		return 0
	}
	return expShiftedAVX512(&v[0], len(v), m)
}

//go:noescape
func f32ToF16AVX512(src *float32, dst *byte, n int) int

// f32ToF16SIMD converts a prefix of src to FP16 in dst with the bits of
// FP32ToFP16 and returns its length.
func f32ToF16SIMD(src []float32, dst []byte) int {
	if kern.isa != "avx512vnni" || len(src) < 16 {
		return 0
	}
	_ = dst[2*len(src)-1]
	return f32ToF16AVX512(&src[0], &dst[0], len(src))
}
