package cpu

// Q2_K × Q8_K AVX2 kernels (simd_q2k_amd64.s), bit-equal to dotQ2_K.

//go:noescape
func dotQ2_KAVX2(nb int, w, x *byte, xstride int, out *float32)

//go:noescape
func dotQ2_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
