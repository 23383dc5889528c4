package cpu

// dotLanes16AVX2 is dotLanes16Ref's first n16·16 elements folded into one float32 (its
// tail is the caller's); n16 > 0.
//
//go:noescape
func dotLanes16AVX2(a, x *float32, n16 int) float32

// axpyAVX2 is axpyRef over n8·8 elements; n8 > 0.
//
//go:noescape
func axpyAVX2(dst, src *float32, s float32, n8 int)

// lowRankSIMD reports whether the low-rank kernels run (every ISA above the pure-Go one
// has AVX2; TANDEM_CPU_ISA=go turns them off with the rest).
func lowRankSIMD() bool { return kern.isa != "go" }

func dotLanes16SIMD(a, x *float32, n16 int) float32 { return dotLanes16AVX2(a, x, n16) }

func axpySIMD(dst, src *float32, s float32, n8 int) { axpyAVX2(dst, src, s, n8) }
