package cpu

// Declarations and the bounds-checking wrapper of the AVX2 kernels in
// simd_q4_amd64.s (Q4_0 against Q8_0; Q4_1 and Q5_1 against Q8_1).

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

// wrapQ8_1 bounds-checks the rows for kernels over 32-element weight
// blocks of wsize bytes against Q8_1 activations (36 bytes a block).
func wrapQ8_1(wsize int, k1 func(nb int, w, x *byte) float32, k4 func(nb int, w, x *byte, xstride int, out *[4]float32)) (dotFunc, dot4Func) {
	return func(n int, w, x []byte) float32 {
			nb := n / 32
			if nb == 0 {
				return 0
			}
			_, _ = w[wsize*nb-1], x[36*nb-1]
			return k1(nb, &w[0], &x[0])
		}, func(n int, w, x []byte, xstride int, out *[4]float32) {
			nb := n / 32
			if nb == 0 {
				*out = [4]float32{}
				return
			}
			_, _ = w[wsize*nb-1], x[3*xstride+36*nb-1]
			k4(nb, &w[0], &x[0], xstride, out)
		}
}
