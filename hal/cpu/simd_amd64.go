package cpu

// SIMD kernels for amd64 (Go assembly, no cgo), chosen once at init from
// CPUID. Each kernel gives the same bits as its pure-Go twin in dot.go:
// integer block sums are exact whatever the lane order, and every float
// operation (scale products, per-block multiply, the sequential float32
// accumulation across blocks) is done in the twin's order, without FMA.
// The multi-row kernels run the same per-row operations, so an output
// element never depends on how many rows were computed together.

import (
	"encoding/binary"
	"math"

	"tandem/hal"
)

func cpuid(eax, ecx uint32) (a, b, c, d uint32)
func xgetbv() (eax, edx uint32)

// cpuFeatures are the CPU features the kernels use.
type cpuFeatures struct {
	avx2       bool // AVX2 + FMA + F16C with OS-enabled YMM state
	avx512vnni bool // AVX512F/BW/VL + VNNI with OS-enabled ZMM state
	avx512bf16 bool // avx512vnni + AVX512_BF16 (VDPBF16PS)
}

var feat = detectCPU()

func detectCPU() (f cpuFeatures) {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return
	}
	_, _, c1, _ := cpuid(1, 0)
	osxsave := c1&(1<<27) != 0
	fma := c1&(1<<12) != 0
	f16c := c1&(1<<29) != 0
	avx := c1&(1<<28) != 0
	if !osxsave || !avx {
		return f
	}
	xcr0, _ := xgetbv()
	if xcr0&6 != 6 { // XMM and YMM state
		return f
	}
	_, b7, c7, _ := cpuid(7, 0)
	f.avx2 = b7&(1<<5) != 0 && fma && f16c
	avx512 := xcr0&0xe0 == 0xe0 && // opmask, ZMM_Hi256, Hi16_ZMM
		b7&(1<<16) != 0 && b7&(1<<30) != 0 && b7&(1<<31) != 0 // F, BW, VL
	f.avx512vnni = f.avx2 && avx512 && c7&(1<<11) != 0
	a71, _, _, _ := cpuid(7, 1)
	f.avx512bf16 = f.avx512vnni && a71&(1<<5) != 0
	return f
}

//go:noescape
func dotQ4_KAVX2(nb int, w, x *byte, xstride int, out *float32)

//go:noescape
func dotQ4_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotQ6_KAVX2(nb int, w, x *byte, xstride int, out *float32)

//go:noescape
func dotQ6_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotF16AVX2(n16 int, w, x *byte) float64

//go:noescape
func dotF16x4AVX512(n16 int, w, x *byte, xstride int, out *[4]float64)

//go:noescape
func dotQ5_0AVX2(nb int, w, x *byte) float32

//go:noescape
func dotQ5_0x4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotQ5_0VNNI(nb int, w, x *byte) float32

//go:noescape
func dotQ5_0x4VNNI(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotQ8_0AVX2(nb int, w, x *byte) float32

//go:noescape
func dotQ8_0x4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)

//go:noescape
func dotQ8_0VNNI(nb int, w, x *byte) float32

//go:noescape
func dotQ8_0x4VNNI(nb int, w, x *byte, xstride int, out *[4]float32)

// simdKernels returns the single-row and 4-row kernels for weight type t
// on this CPU, with the ISA name; nil where only the pure-Go twin exists.
func simdKernels(t hal.DType, isa string) (dotFunc, dot4Func) {
	switch isa {
	case "avx512vnni", "avx2":
	default:
		return nil, nil
	}
	vnni := isa == "avx512vnni"
	switch t {
	case hal.Q8_0:
		if vnni {
			one, _ := wrapQ32x1(34, dotQ8_0x1VNNI)
			_, four := wrapQ32(34, 34, dotQ8_0VNNI, dotQ8_0x4VNNI)
			return one, four
		}
		return wrapQ32(34, 34, dotQ8_0AVX2, dotQ8_0x4AVX2)
	case hal.Q5_0:
		if vnni {
			one, _ := wrapQ32x1(22, dotQ5_0x1VNNI)
			_, four := wrapQ32(22, 34, dotQ5_0VNNI, dotQ5_0x4VNNI)
			return one, four
		}
		return wrapQ32(22, 34, dotQ5_0AVX2, dotQ5_0x4AVX2)
	case hal.Q4_0:
		return wrapQ32(18, 34, dotQ4_0AVX2, dotQ4_0x4AVX2)
	case hal.Q4_1:
		return wrapQ32(20, 36, dotQ4_1AVX2, dotQ4_1x4AVX2)
	case hal.Q5_1:
		return wrapQ32(24, 36, dotQ5_1AVX2, dotQ5_1x4AVX2)
	case hal.Q3_K:
		return wrapQK(110, dotQ3_KAVX2, dotQ3_Kx4AVX2)
	case hal.Q4_K:
		return wrapQK(144, dotQ4_KAVX2, dotQ4_Kx4AVX2)
	case hal.Q5_K:
		return wrapQK(176, dotQ5_KAVX2, dotQ5_Kx4AVX2)
	case hal.Q2_K:
		return wrapQK(84, dotQ2_KAVX2, dotQ2_Kx4AVX2)
	case hal.F16:
		// The AVX-512 4-row F16 kernel is no faster than four single-row
		// calls on this Zen 4 (double-pumped zmm); kept, tested, unused.
		return wrapF16(false)
	case hal.Q6_K:
		return wrapQK(210, dotQ6_KAVX2, dotQ6_Kx4AVX2)
	case hal.BF16:
		return wrapBF16()
	case hal.F32:
		return wrapF32()
	}
	return nil, nil
}

// wrapQ32 bounds-checks the rows for kernels over 32-element weight
// blocks of wsize bytes against activation blocks of xsize bytes (Q8_0:
// 34, Q8_1: 36).
func wrapQ32(wsize, xsize int, k1 func(nb int, w, x *byte) float32, k4 func(nb int, w, x *byte, xstride int, out *[4]float32)) (dotFunc, dot4Func) {
	return func(n int, w, x []byte) float32 {
			nb := n / 32
			if nb == 0 {
				return 0
			}
			_, _ = w[wsize*nb-1], x[xsize*nb-1]
			return k1(nb, &w[0], &x[0])
		}, func(n int, w, x []byte, xstride int, out *[4]float32) {
			nb := n / 32
			if nb == 0 {
				*out = [4]float32{}
				return
			}
			_, _ = w[wsize*nb-1], x[3*xstride+xsize*nb-1]
			k4(nb, &w[0], &x[0], xstride, out)
		}
}

// x1Prefetch is how far ahead (bytes) the single-row VNNI kernels
// prefetch weights: past the row's end it reaches the next rows, which a
// matmul reads next.
const x1Prefetch = 4096

// wrapQ32x1 bounds-checks one weight row of 32-element blocks of wsize
// bytes against one Q8_0 activation row, for the prefetching kernels.
func wrapQ32x1(wsize int, k1 func(nb int, w, x *byte, pf int) float32) (dotFunc, dot4Func) {
	return func(n int, w, x []byte) float32 {
		nb := n / 32
		if nb == 0 {
			return 0
		}
		_, _ = w[wsize*nb-1], x[34*nb-1]
		return k1(nb, &w[0], &x[0], x1Prefetch)
	}, nil
}

// wrapQK bounds-checks the rows for kernels over 256-element super-blocks
// of wsize bytes against Q8_K activations (292 bytes a block).
func wrapQK(wsize int, k1 func(nb int, w, x *byte, xstride int, out *float32), k4 func(nb int, w, x *byte, xstride int, out *[4]float32)) (dotFunc, dot4Func) {
	return func(n int, w, x []byte) float32 {
			nb := n / 256
			if nb == 0 {
				return 0
			}
			_, _ = w[wsize*nb-1], x[292*nb-1]
			var out float32
			k1(nb, &w[0], &x[0], 0, &out)
			return out
		}, func(n int, w, x []byte, xstride int, out *[4]float32) {
			nb := n / 256
			if nb == 0 {
				*out = [4]float32{}
				return
			}
			_, _ = w[wsize*nb-1], x[3*xstride+292*nb-1]
			k4(nb, &w[0], &x[0], xstride, out)
		}
}

// f16Tail adds the elements from i on, in order, as dotRowF16 does.
func f16Tail(sum float64, i, n int, w, x []byte) float32 {
	tab := fp16Table
	for ; i < n; i++ {
		a := tab[uint16(w[2*i])|uint16(w[2*i+1])<<8]
		b := tab[uint16(x[2*i])|uint16(x[2*i+1])<<8]
		sum += float64(a) * float64(b)
	}
	return float32(sum)
}

// wrapF16: the single-row AVX2 kernel everywhere, the 4-row kernel where
// AVX-512 is (it has the same lanes and fold, so the same bits).
func wrapF16(avx512 bool) (dotFunc, dot4Func) {
	one := func(n int, w, x []byte) float32 {
		_, _ = w[:2*n], x[:2*n]
		n16 := n / 16
		var s float64
		if n16 > 0 {
			s = dotF16AVX2(n16, &w[0], &x[0])
		}
		return f16Tail(s, 16*n16, n, w, x)
	}
	if !avx512 {
		return one, nil
	}
	return one, func(n int, w, x []byte, xstride int, out *[4]float32) {
		_, _ = w[:2*n], x[:3*xstride+2*n]
		n16 := n / 16
		var s [4]float64
		if n16 > 0 {
			dotF16x4AVX512(n16, &w[0], &x[0], xstride, &s)
		}
		for r := range 4 {
			out[r] = f16Tail(s[r], 16*n16, n, w, x[r*xstride:])
		}
	}
}

// bestISA is the widest instruction set this CPU runs kernels for.
func bestISA() string {
	switch {
	case feat.avx512vnni:
		return "avx512vnni"
	case feat.avx2:
		return "avx2"
	}
	return "go"
}

// simdISAs lists the ISAs this CPU can run, widest first, for tests.
func simdISAs() []string {
	var s []string
	if feat.avx512vnni {
		s = append(s, "avx512vnni")
	}
	if feat.avx2 {
		s = append(s, "avx2")
	}
	return s
}

//go:noescape
func dotQ8_0x2VNNI(nb int, w *byte, wstride int, x *byte, pf int, out *[2]float32)

//go:noescape
func dotQ5_0x2VNNI(nb int, w *byte, wstride int, x *byte, pf int, out *[2]float32)

// simdKernels2 returns the two-weight-row kernel for weight type t, or nil.
func simdKernels2(t hal.DType, isa string) dot2Func {
	if isa != "avx512vnni" {
		return nil
	}
	if !useTwoRow {
		return nil
	}
	switch t {
	case hal.Q8_0:
		return wrapQ32x2(34, dotQ8_0x2VNNI)
	case hal.Q5_0:
		return wrapQ32x2(22, dotQ5_0x2VNNI)
	}
	return nil
}

// x2Prefetch is how many weight rows ahead the two-row kernels prefetch:
// two is the pair the next call reads.
const x2Prefetch = 2

// wrapQ32x2 bounds-checks two weight rows wstride bytes apart, of 32-element
// blocks of wsize bytes, against one Q8_0 activation row.
func wrapQ32x2(wsize int, k2 func(nb int, w *byte, wstride int, x *byte, pf int, out *[2]float32)) dot2Func {
	return func(n int, w []byte, wstride int, x []byte, out *[2]float32) {
		nb := n / 32
		if nb == 0 {
			*out = [2]float32{}
			return
		}
		_, _ = w[wstride+wsize*nb-1], x[34*nb-1]
		k2(nb, &w[0], wstride, &x[0], x2Prefetch*wstride, out)
	}
}

//go:noescape
func dotQ8_0x1VNNI(nb int, w, x *byte, pf int) float32

//go:noescape
func dotQ5_0x1VNNI(nb int, w, x *byte, pf int) float32

//go:noescape
func dotBF16AVX2(n16 int, w, x *byte) float64

//go:noescape
func dotF32AVX2(n16 int, w, x *byte) float64

// wrapBF16 is the single-row BF16 kernel: 16 float64 lanes, folded, then
// the tail in order (as wrapF16).
func wrapBF16() (dotFunc, dot4Func) {
	return func(n int, w, x []byte) float32 {
		_, _ = w[:2*n], x[:2*n]
		n16 := n / 16
		var s float64
		if n16 > 0 {
			s = dotBF16AVX2(n16, &w[0], &x[0])
		}
		for i := 16 * n16; i < n; i++ {
			a := math.Float32frombits(uint32(w[2*i])<<16 | uint32(w[2*i+1])<<24)
			b := math.Float32frombits(uint32(x[2*i])<<16 | uint32(x[2*i+1])<<24)
			s += float64(a) * float64(b)
		}
		return float32(s)
	}, nil
}

// wrapF32 is the single-row F32 kernel: products rounded to float32, 16
// float64 lanes, folded, then the tail in order.
func wrapF32() (dotFunc, dot4Func) {
	return func(n int, w, x []byte) float32 {
		_, _ = w[:4*n], x[:4*n]
		n16 := n / 16
		var s float64
		if n16 > 0 {
			s = dotF32AVX2(n16, &w[0], &x[0])
		}
		for i := 16 * n16; i < n; i++ {
			a := math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:]))
			b := math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
			s += float64(float32(a * b))
		}
		return float32(s)
	}, nil
}
