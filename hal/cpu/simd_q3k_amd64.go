package cpu

// Q3_K × Q8_K AVX2 kernels (simd_q3k_amd64.s), bit-equal to dotQ3_K.

//go:noescape
func dotQ3_KAVX2(nb int, w, x *byte, xstride int, out *float32)

//go:noescape
func dotQ3_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
