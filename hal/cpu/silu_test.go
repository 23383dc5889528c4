package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// TestSiLUMulBitEqual holds Backend.SiLUMul (SIMD where the CPU has it) to
// the scalar formula bit for bit: ordinary values, a sweep over the whole
// range where exp is finite, extremes that take the scalar fallback (±Inf,
// NaN, huge, tiny, ±0), lengths that are not multiples of the vector, and
// lengths the workers split into chunks (on one worker and on two).
func TestSiLUMulBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	var in []float32
	for range 5000 {
		in = append(in, float32(r.NormFloat64()*4))
	}
	for x := float32(-120); x < 120; x += 0.0137 {
		in = append(in, x, math.Nextafter32(x, 1e9))
	}
	for range 20000 {
		in = append(in, math.Float32frombits(r.Uint32())) // every exponent, NaNs
	}
	in = append(in, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		700, -700, 700.1, -700.1, 1e-40, -1e-40, math.MaxFloat32, -math.MaxFloat32)
	up := make([]float32, len(in))
	for i := range up {
		up[i] = float32(r.NormFloat64())
	}
	for _, threads := range []int{1, 2} {
		be := New(threads)
		testSiLUMul(t, be, in, up)
		be.Close()
	}
}

func testSiLUMul(t *testing.T, be *Backend, in, up []float32) {
	t.Helper()
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 2*elementwiseChunk - 1, 2 * elementwiseChunk, 3*elementwiseChunk + 5, len(in) - 2} {
		for off := range 3 {
			if off+n > len(in) {
				continue
			}
			got := append([]float32(nil), in[off:off+n]...)
			want := append([]float32(nil), in[off:off+n]...)
			be.SiLUMul(hal.HostBuf(got), hal.HostBuf(up[off:off+n]))
			siluMulRef(want, up[off:off+n])
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
					t.Fatalf("%d threads n=%d off=%d: silu(%g)·%g = %g, scalar %g", be.Threads(), n, off, in[off+i], up[off+i], got[i], want[i])
				}
			}
		}
	}
}

// TestAddBitEqual: Add and AddBias (SIMD where the CPU has it) give the
// scalar loop's bits, NaNs and infinities included, at lengths around the
// vector width.
func TestAddBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(75, 76))
	be := New(1)
	defer be.Close()
	for _, n := range []int{0, 1, 15, 16, 17, 31, 33, 896, 16*896 + 3} {
		dst, src := make([]float32, n), make([]float32, n)
		for i := range dst {
			dst[i], src[i] = math.Float32frombits(r.Uint32()), math.Float32frombits(r.Uint32())
			if i%3 == 0 {
				dst[i], src[i] = float32(r.NormFloat64()), float32(r.NormFloat64()*1e-3)
			}
		}
		want := append([]float32(nil), dst...)
		for i := range want {
			want[i] += src[i]
		}
		got := append([]float32(nil), dst...)
		be.Add(hal.HostBuf(got), hal.HostBuf(src))
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
				t.Fatalf("Add n=%d: %g + %g = %g, scalar %g", n, dst[i], src[i], got[i], want[i])
			}
		}
		if n < 17 {
			continue
		}
		bias := src[:17]
		got = append(got[:0], dst...)
		be.AddBias(hal.HostBuf(got), bias)
		for i := range got[:n/17*17] {
			if w := dst[i] + bias[i%17]; math.Float32bits(got[i]) != math.Float32bits(w) && !math.IsNaN(float64(w)) {
				t.Fatalf("AddBias n=%d at %d: %g, scalar %g", n, i, got[i], w)
			}
		}
	}
}

// TestExpShiftedBitEqual: the softmax's exp(v − max) is the scalar
// float32(math.Exp(float64(v−m))) bit for bit, including differences
// beyond the SIMD range (−700), −Inf, NaN and lengths off the vector width.
func TestExpShiftedBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(73, 74))
	for trial := range 200 {
		n := trial % 41
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * 30)
			switch r.IntN(40) {
			case 0:
				v[i] = -800
			case 1:
				v[i] = float32(math.Inf(-1))
			case 2:
				v[i] = float32(math.NaN())
			}
		}
		m := float32(r.NormFloat64() * 10)
		got := append([]float32(nil), v...)
		expShifted(got, m)
		for i, x := range v {
			want := float32(math.Exp(float64(x - m)))
			if math.Float32bits(got[i]) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(got[i]))) {
				t.Fatalf("trial %d: exp(%g - %g) = %g, scalar %g", trial, x, m, got[i], want)
			}
		}
	}
}
