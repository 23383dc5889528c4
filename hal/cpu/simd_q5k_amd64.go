package cpu

// Q5_K × Q8_K AVX2 kernels (simd_q5k_amd64.s), bit-equal to dotQ5_K.

//go:noescape
func dotQ5_KAVX2(nb int, w, x *byte, xstride int, out *float32)

//go:noescape
func dotQ5_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
