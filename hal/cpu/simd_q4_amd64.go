package cpu

// Declarations of the AVX2 kernels in simd_q4_amd64.s (Q4_0 against Q8_0;
// Q4_1 and Q5_1 against Q8_1).

//go:noescape
func dotQ4_0AVX2(nb int, w, x *byte) float32

//go:noescape
func dotQ4_0x4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotQ4_1AVX2(nb int, w, x *byte) float32

//go:noescape
func dotQ4_1x4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotQ5_1AVX2(nb int, w, x *byte) float32

//go:noescape
func dotQ5_1x4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
