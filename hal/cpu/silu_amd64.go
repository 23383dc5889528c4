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
