package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"tandem/hal"
)

// Dot products of one weight row with one activation row that QuantizeRow
// already converted to VecDotType of the weight type.
//
// Numerics (deterministic: they depend only on the two rows):
//   - F32, BF16: each product is formed in float32 (exact for BF16, rounded
//     for F32) and summed sequentially in float64, as ggml's generic
//     ggml_vec_dot_{f32,bf16}. The result is rounded to float32.
//   - F16: the exact float32 products are summed sequentially in float32,
//     which the packed kernels do for 16 rows per vector.
//   - Quantized types: each block's quants are multiplied and summed in
//     int32 (exact, so order does not matter); the block's contribution is
//     then scaled with float32 operations in the order of ggml's generic
//     ggml_vec_dot_*_q8_* and added to one float32 accumulator, block after
//     block. ggml's generic K-quant kernels spread the scaled sums over 8
//     float lanes first; here each super-block adds one scaled int32 sum.
//
// Every float32 product that feeds an addition is wrapped in float32(...)
// so that no Go compiler fuses it into an FMA.

// VecDot returns the dot product of the weight row w (type t, n elements)
// and the activation row x (type VecDotType(t)). n must be a multiple of
// t.BlockSize(); w and x must hold at least the bytes n elements take.
func VecDot(t hal.DType, n int, w, x []byte) float32 {
	if int(t) < len(kern.dot) {
		if f := kern.dot[t]; f != nil {
			return f(n, w, x)
		}
	}
	return vecDotRef(t, n, w, x)
}

// dotFunc is a single-row kernel; dot4Func computes the same weight row
// against the four activation rows x, x[xstride:], x[2*xstride:],
// x[3*xstride:], each with exactly the single-row kernel's operations.
// dot2Func computes the two weight rows w and w[wstride:] against the one
// activation row x, each with exactly the single-row kernel's operations.
type (
	dotFunc  func(n int, w, x []byte) float32
	dot4Func func(n int, w, x []byte, xstride int, out *[4]float32)
	dot2Func func(n int, w []byte, wstride int, x []byte, out *[2]float32)
)

// kernelTable holds the kernels chosen for this CPU, per weight type.
type kernelTable struct {
	isa  string
	dot  [32]dotFunc
	dot4 [32]dot4Func
	dot2 [32]dot2Func
}

// useTwoRow enables the two-weight-row kernels in matmul. Off: streaming
// two interleaved rows from memory measured slower on Zen 4 than one row
// at a time with prefetch (the kernels are kept, and tested).
var useTwoRow = false

// kern is set once at package initialisation from the CPU's features (or
// TANDEM_CPU_ISA=go|avx2|avx512vnni, to compare) and never changes.
var kern = newKernelTable(os.Getenv("TANDEM_CPU_ISA"))

func newKernelTable(isa string) *kernelTable {
	best := bestISA()
	if isa == "" || !isaAvailable(isa) {
		isa = best
	}
	k := &kernelTable{isa: isa}
	for t := range k.dot {
		k.dot[t], k.dot4[t] = simdKernels(hal.DType(t), isa)
		k.dot2[t] = simdKernels2(hal.DType(t), isa)
	}
	return k
}

func isaAvailable(isa string) bool {
	if isa == "go" {
		return true
	}
	for _, s := range simdISAs() {
		if s == isa {
			return true
		}
	}
	return false
}

// KernelISA names the instruction set of the dot-product kernels in use.
func KernelISA() string { return kern.isa }

// vecDotRef is the pure-Go reference twin of every kernel.
func vecDotRef(t hal.DType, n int, w, x []byte) float32 {
	switch t {
	case hal.F32:
		return dotRowF32(n, w, x)
	case hal.F16:
		return dotRowF16(n, w, x)
	case hal.BF16:
		return dotRowBF16(n, w, x)
	case hal.Q4_0:
		return dotQ4_0(n, w, x)
	case hal.Q4_1:
		return dotQ4_1(n, w, x)
	case hal.Q5_0:
		return dotQ5_0(n, w, x)
	case hal.Q5_1:
		return dotQ5_1(n, w, x)
	case hal.Q8_0:
		return dotQ8_0(n, w, x)
	case hal.Q2_K:
		return dotQ2_K(n, w, x)
	case hal.Q3_K:
		return dotQ3_K(n, w, x)
	case hal.Q4_K:
		return dotQ4_K(n, w, x)
	case hal.Q5_K:
		return dotQ5_K(n, w, x)
	case hal.Q6_K:
		return dotQ6_K(n, w, x)
	}
	panic(fmt.Sprintf("cpu: VecDot: unsupported weight type %v", t))
}

// VecDotFunc returns the kernel VecDot uses for weight type t, so a caller
// looping over many rows can skip the dispatch; nil if t is unsupported.
func VecDotFunc(t hal.DType) func(n int, w, x []byte) float32 {
	if int(t) < len(kern.dot) {
		if f := kern.dot[t]; f != nil {
			return f
		}
	}
	switch t {
	case hal.F32:
		return dotRowF32
	case hal.F16:
		return dotRowF16
	case hal.BF16:
		return dotRowBF16
	case hal.Q4_0:
		return dotQ4_0
	case hal.Q4_1:
		return dotQ4_1
	case hal.Q5_0:
		return dotQ5_0
	case hal.Q5_1:
		return dotQ5_1
	case hal.Q8_0:
		return dotQ8_0
	case hal.Q2_K:
		return dotQ2_K
	case hal.Q3_K:
		return dotQ3_K
	case hal.Q4_K:
		return dotQ4_K
	case hal.Q5_K:
		return dotQ5_K
	case hal.Q6_K:
		return dotQ6_K
	}
	return nil
}

// ---- float rows ----

func dotRowF32(n int, w, x []byte) float32 {
	w, x = w[:4*n], x[:4*n]
	var sum float64
	for i := 0; i+4 <= len(w) && i+4 <= len(x); i += 4 {
		a := math.Float32frombits(binary.LittleEndian.Uint32(w[i:]))
		b := math.Float32frombits(binary.LittleEndian.Uint32(x[i:]))
		sum += float64(float32(a * b))
	}
	return float32(sum)
}

// dotRowF16 sums the products, each exact in float32 (11-bit significands),
// in float32 in index order: the order the packed F16 kernels keep in each
// lane (with or without FMA, as the products are exact).
func dotRowF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	tab := fp16Table
	var sum float32
	for i := 0; i+2 <= len(w) && i+2 <= len(x); i += 2 {
		a := tab[binary.LittleEndian.Uint16(w[i:])]
		b := tab[binary.LittleEndian.Uint16(x[i:])]
		sum += a * b
	}
	return sum
}

func dotRowBF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	var sum float64
	for i := 0; i+2 <= len(w) && i+2 <= len(x); i += 2 {
		a := uint32(binary.LittleEndian.Uint16(w[i:])) << 16
		b := uint32(binary.LittleEndian.Uint16(x[i:])) << 16
		sum += float64(math.Float32frombits(a)) * float64(math.Float32frombits(b))
	}
	return float32(sum)
}

// ---- 32-element blocks ----

// dot8x32 returns Σ int8(a[j])·int8(b[j]) over 32 bytes.
func dot8x32(a, b *[32]byte) int32 {
	var s int32
	for j := range a {
		s += int32(int8(a[j])) * int32(int8(b[j]))
	}
	return s
}

func dotQ4_0(n int, w, x []byte) float32 {
	nb := n / 32
	w, x = w[:18*nb], x[:34*nb]
	var sum float32
	for i := range nb {
		wb := w[18*i : 18*i+18]
		xb := x[34*i : 34*i+34]
		qw := (*[16]byte)(wb[2:18])
		qx := (*[32]byte)(xb[2:34])
		var s int32
		for j, v := range qw {
			s += (int32(v&15)-8)*int32(int8(qx[j])) + (int32(v>>4)-8)*int32(int8(qx[j+16]))
		}
		sum += float32(float32(float32(s)*f16At(wb)) * f16At(xb))
	}
	return sum
}

func dotQ4_1(n int, w, x []byte) float32 {
	nb := n / 32
	w, x = w[:20*nb], x[:36*nb]
	var sum float32
	for i := range nb {
		wb := w[20*i : 20*i+20]
		xb := x[36*i : 36*i+36]
		qw := (*[16]byte)(wb[4:20])
		qx := (*[32]byte)(xb[4:36])
		var s int32
		for j, v := range qw {
			s += int32(v&15)*int32(int8(qx[j])) + int32(v>>4)*int32(int8(qx[j+16]))
		}
		dd := f16At(wb) * f16At(xb)
		sum += float32(dd*float32(s)) + float32(f16At(wb[2:])*f16At(xb[2:]))
	}
	return sum
}

func dotQ5_0(n int, w, x []byte) float32 {
	nb := n / 32
	w, x = w[:22*nb], x[:34*nb]
	var sum float32
	for i := range nb {
		wb := w[22*i : 22*i+22]
		xb := x[34*i : 34*i+34]
		qh := binary.LittleEndian.Uint32(wb[2:])
		qw := (*[16]byte)(wb[6:22])
		qx := (*[32]byte)(xb[2:34])
		var s int32
		for j, v := range qw {
			q0 := int32(v&15|byte(qh>>j<<4)&0x10) - 16
			q1 := int32(v>>4|byte(qh>>(j+12))&0x10) - 16
			s += q0*int32(int8(qx[j])) + q1*int32(int8(qx[j+16]))
		}
		sum += float32(float32(f16At(wb)*f16At(xb)) * float32(s))
	}
	return sum
}

func dotQ5_1(n int, w, x []byte) float32 {
	nb := n / 32
	w, x = w[:24*nb], x[:36*nb]
	var sum float32
	for i := range nb {
		wb := w[24*i : 24*i+24]
		xb := x[36*i : 36*i+36]
		qh := binary.LittleEndian.Uint32(wb[4:])
		qw := (*[16]byte)(wb[8:24])
		qx := (*[32]byte)(xb[4:36])
		var s int32
		for j, v := range qw {
			q0 := int32(v&15 | byte(qh>>j<<4)&0x10)
			q1 := int32(v>>4 | byte(qh>>(j+12))&0x10)
			s += q0*int32(int8(qx[j])) + q1*int32(int8(qx[j+16]))
		}
		dd := f16At(wb) * f16At(xb)
		sum += float32(dd*float32(s)) + float32(f16At(wb[2:])*f16At(xb[2:]))
	}
	return sum
}

func dotQ8_0(n int, w, x []byte) float32 {
	nb := n / 32
	w, x = w[:34*nb], x[:34*nb]
	var sum float32
	for i := range nb {
		wb := w[34*i : 34*i+34]
		xb := x[34*i : 34*i+34]
		s := dot8x32((*[32]byte)(wb[2:34]), (*[32]byte)(xb[2:34]))
		sum += float32(float32(s) * float32(f16At(wb)*f16At(xb)))
	}
	return sum
}

// ---- 256-element super-blocks against Q8_K ----

// q8K splits a Q8_K block into its scale, quants and 16-element sums.
func q8K(b []byte) (d float32, q *[qkK]byte, bsums *[32]byte) {
	b = b[:292]
	return math.Float32frombits(binary.LittleEndian.Uint32(b)), (*[qkK]byte)(b[4:260]), (*[32]byte)(b[260:292])
}

func bsum(bs *[32]byte, g int) int32 { return int32(int16(binary.LittleEndian.Uint16(bs[2*g:]))) }

func dotQ2_K(n int, w, x []byte) float32 {
	nb := n / qkK
	w, x = w[:84*nb], x[:292*nb]
	var sum float32
	for i := range nb {
		wb := w[84*i : 84*i+84]
		yd, q8, bs := q8K(x[292*i:])
		sc := (*[16]byte)(wb[0:16])
		qs := (*[64]byte)(wb[16:80])
		var summs int32
		for g := range 16 {
			summs += bsum(bs, g) * int32(sc[g]>>4)
		}
		var isum int32
		for h := range 2 {
			q2 := (*[32]byte)(qs[32*h : 32*h+32])
			for k := range 4 {
				shift := 2 * k
				y := (*[32]byte)(q8[128*h+32*k : 128*h+32*k+32])
				var s0, s1 int32
				for l := range 16 {
					s0 += int32(int8(y[l])) * int32(q2[l]>>shift&3)
					s1 += int32(int8(y[l+16])) * int32(q2[l+16]>>shift&3)
				}
				g := 8*h + 2*k
				isum += int32(sc[g]&15)*s0 + int32(sc[g+1]&15)*s1
			}
		}
		dall := yd * f16At(wb[80:])
		dmin := yd * f16At(wb[82:])
		sum += float32(dall*float32(isum)) - float32(dmin*float32(summs))
	}
	return sum
}

func dotQ3_K(n int, w, x []byte) float32 {
	nb := n / qkK
	w, x = w[:110*nb], x[:292*nb]
	var sum float32
	for i := range nb {
		wb := w[110*i : 110*i+110]
		yd, q8, _ := q8K(x[292*i:])
		hm := (*[32]byte)(wb[0:32])
		qs := (*[64]byte)(wb[32:96])
		scales := q3Scales((*[12]byte)(wb[96:108]))
		var isum int32
		for h := range 2 {
			q3 := (*[32]byte)(qs[32*h : 32*h+32])
			for k := range 4 {
				shift := 2 * k
				m := byte(1) << (4*h + k)
				y := (*[32]byte)(q8[128*h+32*k : 128*h+32*k+32])
				var s0, s1 int32
				for l := range 16 {
					a0 := int32(q3[l] >> shift & 3)
					if hm[l]&m == 0 {
						a0 -= 4
					}
					a1 := int32(q3[l+16] >> shift & 3)
					if hm[l+16]&m == 0 {
						a1 -= 4
					}
					s0 += int32(int8(y[l])) * a0
					s1 += int32(int8(y[l+16])) * a1
				}
				g := 8*h + 2*k
				isum += scales[g]*s0 + scales[g+1]*s1
			}
		}
		d := f16At(wb[108:]) * yd
		sum += float32(d * float32(isum))
	}
	return sum
}

// minsDot returns Σ m_j·(bsums[2j]+bsums[2j+1]) over the eight 32-element
// sub-blocks of a Q4_K/Q5_K super-block.
func minsDot(scales *[12]byte, bs *[32]byte) int32 {
	var s int32
	for j := range 8 {
		_, m := scaleMinK4(j, scales)
		s += int32(m) * (bsum(bs, 2*j) + bsum(bs, 2*j+1))
	}
	return s
}

func dotQ4_K(n int, w, x []byte) float32 {
	nb := n / qkK
	w, x = w[:144*nb], x[:292*nb]
	var sum float32
	for i := range nb {
		wb := w[144*i : 144*i+144]
		yd, q8, bs := q8K(x[292*i:])
		scales := (*[12]byte)(wb[4:16])
		qs := (*[128]byte)(wb[16:144])
		var isum int32
		for c := range 4 {
			q := (*[32]byte)(qs[32*c : 32*c+32])
			ylo := (*[32]byte)(q8[64*c : 64*c+32])
			yhi := (*[32]byte)(q8[64*c+32 : 64*c+64])
			var slo, shi int32
			for l, v := range q {
				slo += int32(v&15) * int32(int8(ylo[l]))
				shi += int32(v>>4) * int32(int8(yhi[l]))
			}
			s1, _ := scaleMinK4(2*c, scales)
			s2, _ := scaleMinK4(2*c+1, scales)
			isum += int32(s1)*slo + int32(s2)*shi
		}
		d := f16At(wb) * yd
		dmin := f16At(wb[2:]) * yd
		sum += float32(d * float32(isum))
		sum -= float32(dmin * float32(minsDot(scales, bs)))
	}
	return sum
}

func dotQ5_K(n int, w, x []byte) float32 {
	nb := n / qkK
	w, x = w[:176*nb], x[:292*nb]
	var sum float32
	for i := range nb {
		wb := w[176*i : 176*i+176]
		yd, q8, bs := q8K(x[292*i:])
		scales := (*[12]byte)(wb[4:16])
		qh := (*[32]byte)(wb[16:48])
		qs := (*[128]byte)(wb[48:176])
		var isum int32
		for c := range 4 {
			q := (*[32]byte)(qs[32*c : 32*c+32])
			ylo := (*[32]byte)(q8[64*c : 64*c+32])
			yhi := (*[32]byte)(q8[64*c+32 : 64*c+64])
			sh := uint(2 * c)
			var slo, shi int32
			for l, v := range q {
				h := qh[l] >> sh
				lo := int32(v&15 | (h&1)<<4)
				hi := int32(v>>4 | (h&2)<<3)
				slo += lo * int32(int8(ylo[l]))
				shi += hi * int32(int8(yhi[l]))
			}
			s1, _ := scaleMinK4(2*c, scales)
			s2, _ := scaleMinK4(2*c+1, scales)
			isum += int32(s1)*slo + int32(s2)*shi
		}
		d := f16At(wb) * yd
		dmin := f16At(wb[2:]) * yd
		sum += float32(d * float32(isum))
		sum -= float32(dmin * float32(minsDot(scales, bs)))
	}
	return sum
}

func dotQ6_K(n int, w, x []byte) float32 {
	nb := n / qkK
	w, x = w[:210*nb], x[:292*nb]
	var sum float32
	for i := range nb {
		wb := w[210*i : 210*i+210]
		yd, q8, _ := q8K(x[292*i:])
		sc := (*[16]byte)(wb[192:208])
		var isum int32
		for h := range 2 {
			ql := (*[64]byte)(wb[64*h : 64*h+64])
			qh := (*[32]byte)(wb[128+32*h : 128+32*h+32])
			y := (*[128]byte)(q8[128*h : 128*h+128])
			// Four runs of 32 elements; each run has two 16-element scales.
			var s [8]int32
			for l := range 32 {
				hb := qh[l]
				a := ql[l]
				b := ql[l+32]
				q1 := int32(a&15|(hb&3)<<4) - 32
				q2 := int32(b&15|(hb>>2&3)<<4) - 32
				q3 := int32(a>>4|(hb>>4&3)<<4) - 32
				q4 := int32(b>>4|(hb>>6&3)<<4) - 32
				g := l >> 4
				s[g] += q1 * int32(int8(y[l]))
				s[2+g] += q2 * int32(int8(y[l+32]))
				s[4+g] += q3 * int32(int8(y[l+64]))
				s[6+g] += q4 * int32(int8(y[l+96]))
			}
			for g := range 8 {
				isum += int32(int8(sc[8*h+g])) * s[g]
			}
		}
		d := f16At(wb[208:]) * yd
		sum += float32(d * float32(isum))
	}
	return sum
}
