package cpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// q8kCase is one input row for the Q8_K quantizer; simd says whether the
// AVX-512 kernel must do every block itself (finite values, max magnitude
// not tiny), so that a silent fallback to Go cannot pass for equality.
type q8kCase struct {
	name string
	src  []float32
	simd bool
}

func q8kRandomBlocks(r *rand.Rand, nb int, scale float64) []float32 {
	src := make([]float32, qkK*nb)
	for i := range src {
		src[i] = float32(r.NormFloat64() * scale)
	}
	return src
}

func q8kCases() []q8kCase {
	r := rand.New(rand.NewPCG(91, 92))
	var cs []q8kCase
	for _, scale := range []float64{1e-30, 1e-6, 1e-3, 1, 7.5, 1e3, 1e30} {
		cs = append(cs, q8kCase{fmt.Sprintf("random scale %g", scale), q8kRandomBlocks(r, 3, scale), true})
	}
	for _, nb := range []int{0, 1, 2, 3, 19, 64} {
		cs = append(cs, q8kCase{fmt.Sprintf("%d blocks", nb), q8kRandomBlocks(r, nb, 1), true})
	}
	// Lengths off the block size: the tail is not quantized.
	cs = append(cs, q8kCase{"2 blocks and a tail", q8kRandomBlocks(r, 3, 1)[:2*qkK+100], true})

	// Ties: +a and -a both of the largest magnitude, in both orders, in the
	// same 16-lane vector and in different ones; the first decides the sign.
	for _, pos := range [][2]int{{3, 200}, {200, 3}, {0, 255}, {255, 0}, {16, 15}, {15, 16}, {5, 9}, {9, 5}, {130, 129}} {
		for _, a := range []float32{1, 2.5, 3e-20, 1e35} {
			src := q8kRandomBlocks(r, 2, float64(a)/8)
			for b := range 2 {
				x := src[qkK*b : qkK*b+qkK]
				for i := range x {
					x[i] = max(-a/2, min(a/2, x[i]))
				}
				x[pos[0]], x[pos[1]] = a, -a
				if b == 1 {
					x[pos[0]], x[pos[1]] = -a, a
				}
			}
			cs = append(cs, q8kCase{fmt.Sprintf("tie %g at %v", a, pos), src, true})
		}
	}
	// Three holders of the largest magnitude, the first one negative.
	tri := q8kRandomBlocks(r, 1, 0.1)
	tri[40], tri[41], tri[250] = -4, 4, 4
	cs = append(cs, q8kCase{"tie -4, 4, 4", tri, true})

	zeros := make([]float32, 3*qkK)
	cs = append(cs, q8kCase{"all zero", zeros, true})
	negZeros := make([]float32, 2*qkK)
	for i := range negZeros {
		if i%3 != 0 {
			negZeros[i] = float32(math.Copysign(0, -1))
		}
	}
	cs = append(cs, q8kCase{"mixed ±0", negZeros, true})
	// A zero block between two ordinary ones.
	mid := q8kRandomBlocks(r, 3, 1)
	clear(mid[qkK : 2*qkK])
	cs = append(cs, q8kCase{"zero block in the middle", mid, true})

	// One nonzero value, the rest ±0.
	for _, p := range []int{0, 1, 15, 16, 100, 255} {
		for _, v := range []float32{1, -1, 0.3, -1e-30, 3e38, -3e38} {
			src := make([]float32, qkK)
			for i := range src {
				if i%2 == 1 {
					src[i] = float32(math.Copysign(0, -1))
				}
			}
			src[p] = v
			cs = append(cs, q8kCase{fmt.Sprintf("single %g at %d", v, p), src, true})
		}
	}

	// Near rounding midpoints: m = ∓127 gives iscale = ±1, so v = k+0.5 is
	// an exact tie; the neighbouring floats just miss it. A scale that is
	// not a power of two puts iscale·v near ties after rounding.
	for _, m := range []float32{127, -127, 127 * 0.75, -3.3} {
		src := make([]float32, 2*qkK)
		iscale := -127 / m
		for i := range src {
			k := float32(r.IntN(254) - 127)
			v := (k + 0.5) / iscale
			switch i % 3 {
			case 1:
				v = math.Nextafter32(v, float32(math.Inf(1)))
			case 2:
				v = math.Nextafter32(v, float32(math.Inf(-1)))
			}
			if abs := float32(math.Abs(float64(v))); abs >= float32(math.Abs(float64(m))) {
				v = 0
			}
			src[i] = v
		}
		src[7], src[qkK+300%qkK] = m, m
		cs = append(cs, q8kCase{fmt.Sprintf("midpoints m=%g", m), src, true})
	}

	// Blocks the kernel leaves to Go, between blocks it does: NaN (also with
	// a payload), ±Inf, and a largest magnitude so small that -127/m
	// overflows (subnormal and just below the limit).
	for _, bad := range []float32{
		float32(math.NaN()), math.Float32frombits(0x7fc00005), math.Float32frombits(0xffa00001),
		float32(math.Inf(1)), float32(math.Inf(-1)),
	} {
		src := q8kRandomBlocks(r, 3, 1)
		src[qkK+77] = bad
		cs = append(cs, q8kCase{fmt.Sprintf("bad %#x in block 1", math.Float32bits(bad)), src, false})
	}
	for _, tiny := range []float32{1e-45, -1e-40, 1e-38, -3e-37} {
		src := q8kRandomBlocks(r, 3, 1)
		x := src[qkK : 2*qkK]
		for i := range x {
			x[i] *= tiny / 8
		}
		x[33] = tiny
		cs = append(cs, q8kCase{fmt.Sprintf("tiny max %g", tiny), src, false})
	}
	// Every bit pattern (finite or not).
	bits := make([]float32, 4*qkK)
	for i := range bits {
		bits[i] = math.Float32frombits(r.Uint32())
	}
	cs = append(cs, q8kCase{"random bits", bits, false})
	return cs
}

// TestQuantizeQ8_KSIMDBitEqual: the Q8_K activation quantizer gives the
// pure-Go reference's bytes (quantize_row_q8_K_ref) on every case above, and
// on an AVX-512 CPU the SIMD kernel itself did the blocks it is meant to.
func TestQuantizeQ8_KSIMDBitEqual(t *testing.T) {
	for _, c := range q8kCases() {
		t.Run(c.name, func(t *testing.T) {
			nb := len(c.src) / qkK
			got := bytes.Repeat([]byte{0xa5}, 292*nb)
			want := bytes.Repeat([]byte{0x5a}, 292*nb)
			quantizeQ8_K(c.src, got)
			quantizeQ8_KRef(c.src, want)
			for i := range nb {
				g, w := got[292*i:292*i+292], want[292*i:292*i+292]
				if !bytes.Equal(g, w) {
					t.Fatalf("block %d of %d differs\nd %#x vs ref %#x\nq    %x\nref  %x\nsums %x\nref  %x", i, nb,
						binary.LittleEndian.Uint32(g), binary.LittleEndian.Uint32(w), g[4:260], w[4:260], g[260:], w[260:])
				}
			}
			if c.simd && kern.isa == "avx512vnni" {
				simd := make([]byte, 292*nb)
				if n := quantizeQ8_KSIMD(c.src, simd); n != nb {
					t.Fatalf("SIMD kernel did %d of %d blocks", n, nb)
				}
				if !bytes.Equal(simd, want) {
					t.Fatalf("SIMD kernel alone differs from the reference")
				}
			}
		})
	}
}

// FuzzQuantizeQ8_K: SIMD and reference agree on arbitrary finite float32
// bit patterns, 1 to 3 blocks long; short inputs repeat, which makes ties.
func FuzzQuantizeQ8_K(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 128, 191})           // 1, -1 repeated: ties
	f.Add([]byte{0, 0, 0, 0})                              // zeros
	f.Add([]byte{1, 0, 0, 128, 0, 0, 0, 0, 255, 255, 127}) // -1e-45 and a partial word
	f.Add(bytes.Repeat([]byte{0x12, 0x34, 0x56, 0x3f, 0x9a, 0xbc, 0xde, 0xc0, 0x11, 0x22, 0x33, 0x01}, 100))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		nb := 1 + len(data)/(4*qkK)%3
		src := make([]float32, qkK*nb)
		for i := range src {
			o := (4 * i) % (len(data) - 3)
			u := binary.LittleEndian.Uint32(data[o:])
			if u&0x7f800000 == 0x7f800000 {
				u &^= 0x00800000 // NaN or Inf → a finite value of the same sign and mantissa
			}
			src[i] = math.Float32frombits(u)
		}
		got := make([]byte, 292*nb)
		want := make([]byte, 292*nb)
		quantizeQ8_K(src, got)
		quantizeQ8_KRef(src, want)
		if !bytes.Equal(got, want) {
			t.Fatalf("SIMD\n%x\nreference\n%x", got, want)
		}
	})
}

// BenchmarkQuantizeQ8_K compares the reference with the dispatching
// quantizer (SIMD where the CPU has it) on a Qwen2.5-0.5B FFN-down input
// row (4864), that row for a batch of 16, and a batch of 16 Llama-3.2-1B
// hidden rows (2048). 896-wide rows have no Q8_K form (not a multiple of
// 256).
func BenchmarkQuantizeQ8_K(b *testing.B) {
	r := rand.New(rand.NewPCG(93, 94))
	for _, sh := range []struct {
		name    string
		rows, n int
	}{{"1x4864", 1, 4864}, {"16x4864", 16, 4864}, {"16x2048", 16, 2048}} {
		src := q8kRandomBlocks(r, sh.rows*sh.n/qkK, 1)
		dst := make([]byte, 292*len(src)/qkK)
		for _, v := range []struct {
			name string
			f    func([]float32, []byte)
		}{{"ref", quantizeQ8_KRef}, {"simd", quantizeQ8_K}} {
			b.Run(sh.name+"/"+v.name, func(b *testing.B) {
				b.SetBytes(int64(4 * len(src)))
				b.ReportAllocs()
				for b.Loop() {
					for row := range sh.rows {
						v.f(src[row*sh.n:(row+1)*sh.n], dst[row*sh.n/qkK*292:])
					}
				}
			})
		}
	}
}
