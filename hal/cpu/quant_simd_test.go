package cpu

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// TestQuantizeQ8_0SIMDBitEqual: the Q8_0 activation quantizer gives the
// block-by-block scalar quantizer's bytes, for ordinary rows, zero blocks,
// blocks with NaN or ±Inf (left to the scalar code), huge and subnormal
// values, and rows of 0 to 9 blocks.
func TestQuantizeQ8_0SIMDBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	special := []float32{0, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32, 1e-42, -1e-45, 1e30}
	for trial := range 400 {
		nb := trial % 10
		src := make([]float32, 32*nb)
		for i := range src {
			src[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-3)))
		}
		switch trial % 5 {
		case 1:
			for i := range min(32, len(src)) {
				src[i] = 0
			}
		case 2, 3:
			for range 3 {
				if len(src) > 0 {
					src[r.IntN(len(src))] = special[r.IntN(len(special))]
				}
			}
		case 4:
			for i := range src {
				src[i] = math.Float32frombits(r.Uint32())
			}
		}
		if trial%7 == 6 && nb > 0 {
			for i := range 32 {
				src[i] = 0
			}
			src[5] = -1e-44 // 127/amax overflows
		}
		got := make([]byte, 34*nb)
		want := make([]byte, 34*nb)
		quantizeQ8_0(src, got)
		for i := range nb {
			b := want[34*i : 34*i+34]
			d, _ := quantizeQ8Block(src[32*i:], (*[32]byte)(b[2:34]))
			putF16(b, d)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("trial %d (%d blocks): SIMD\n%x\nscalar\n%x", trial, nb, got, want)
		}
	}
}

// TestQuantizeF16SIMDBitEqual: converting activations to F16 gives
// FP32ToFP16's bits for random bit patterns (every exponent: subnormal
// halves, overflow, infinities, NaNs left to the scalar code), values near
// rounding ties, and lengths off the vector width.
func TestQuantizeF16SIMDBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(83, 84))
	for trial := range 300 {
		n := trial % 53
		src := make([]float32, n)
		for i := range src {
			switch r.IntN(3) {
			case 0:
				src[i] = math.Float32frombits(r.Uint32())
			case 1:
				src[i] = math.Float32frombits(uint32(r.IntN(1<<16))<<13 | 0x1000) // ties
			default:
				src[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-25)))
			}
		}
		got := make([]byte, 2*n)
		QuantizeRow(hal.F16, src, got)
		for i, v := range src {
			want := FP32ToFP16(v)
			if g := uint16(got[2*i]) | uint16(got[2*i+1])<<8; g != want {
				t.Fatalf("trial %d: %g (%#x) → %#x, FP32ToFP16 %#x", trial, v, math.Float32bits(v), g, want)
			}
		}
	}
}
