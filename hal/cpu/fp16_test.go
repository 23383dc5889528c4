package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestFP32ToFP16Known(t *testing.T) {
	pow2 := func(e int) float32 { return float32(math.Ldexp(1, e)) }
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"zero", 0, 0x0000},
		{"neg zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"0.1", 0.1, 0x2e66},
		{"1/3", 1.0 / 3, 0x3555},
		{"max half", 65504, 0x7bff},
		{"just below overflow tie", 65519.996, 0x7bff},
		{"overflow tie rounds to inf", 65520, 0x7c00},
		{"large", 1e10, 0x7c00},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"-inf", float32(math.Inf(-1)), 0xfc00},
		{"tie to even down", 1 + pow2(-11), 0x3c00},
		{"tie to even up", 1 + 3*pow2(-11), 0x3c02},
		{"above tie", 1 + pow2(-11) + pow2(-20), 0x3c01},
		{"min normal", pow2(-14), 0x0400},
		{"max subnormal", 1023 * pow2(-24), 0x03ff},
		{"subnormal to normal carry", 1023.5 * pow2(-24), 0x0400},
		{"min subnormal", pow2(-24), 0x0001},
		{"neg min subnormal", -pow2(-24), 0x8001},
		{"half min subnormal ties to zero", pow2(-25), 0x0000},
		{"above half min subnormal", pow2(-25) * 1.0000001, 0x0001},
		{"subnormal tie to even up", 3 * pow2(-25), 0x0002},
		{"subnormal tie to even down", 5 * pow2(-25), 0x0002},
		{"tiny", pow2(-40), 0x0000},
		{"f32 subnormal", math.Float32frombits(1), 0x0000},
		{"nan", float32(math.NaN()), 0x7e00},
		{"neg nan", math.Float32frombits(0xffc00001), 0xfe00},
	}
	for _, tc := range tests {
		if got := FP32ToFP16(tc.in); got != tc.want {
			t.Errorf("%s: FP32ToFP16(%g) = %#04x, want %#04x", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestFP16ToFP32AllPatterns(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := FP16ToFP32(h)
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		exp := int(h>>10) & 0x1f
		mant := float64(h & 0x3ff)
		var want float64
		switch exp {
		case 0x1f:
			if mant != 0 {
				if !math.IsNaN(float64(got)) {
					t.Fatalf("%#04x: got %g, want NaN", h, got)
				}
				continue
			}
			want = math.Inf(int(sign))
		case 0:
			want = sign * math.Ldexp(mant, -24)
		default:
			want = sign * math.Ldexp(1+mant/1024, exp-15)
		}
		if float64(got) != want || math.Signbit(float64(got)) != (sign < 0) {
			t.Fatalf("%#04x: got %g, want %g", h, got, want)
		}
		// Every non-NaN half survives the round trip.
		if back := FP32ToFP16(got); back != h {
			t.Fatalf("%#04x: round trip gave %#04x", h, back)
		}
	}
}

// TestFP32ToFP16Nearest checks random floats against the two neighbouring
// halves: the result must be the nearest, the even one on a tie.
func TestFP32ToFP16Nearest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		// Cover the whole half range, subnormals included, plus some ties.
		f := float32(math.Ldexp(r.Float64()*2-1, r.IntN(44)-26))
		if r.IntN(8) == 0 {
			f = FP16ToFP32(uint16(r.IntN(0x7bff))) // exact half
			f += float32(math.Ldexp(1, int(math.Float32bits(f)>>23&0xff)-127-11))
		}
		h := FP32ToFP16(f)
		if (h&0x8000 != 0) != math.Signbit(float64(f)) {
			t.Fatalf("FP32ToFP16(%g) = %#04x: wrong sign", f, h)
		}
		af, ha := math.Abs(float64(f)), h&0x7fff
		if ha == 0x7c00 {
			if af < 65520 {
				t.Fatalf("FP32ToFP16(%g) overflowed to inf", f)
			}
			continue
		}
		err := math.Abs(float64(FP16ToFP32(ha)) - af)
		for _, nb := range []uint16{ha - 1, ha + 1} {
			if nb >= 0x7c00 { // ha-1 wrapped below zero, or past the largest finite
				continue
			}
			e := math.Abs(float64(FP16ToFP32(nb)) - af)
			if e < err || e == err && ha&1 != 0 {
				t.Fatalf("FP32ToFP16(%g) = %#04x, but %#04x is nearer or even", f, h, nb)
			}
		}
	}
}

func TestBF16Known(t *testing.T) {
	pow2 := func(e int) float32 { return float32(math.Ldexp(1, e)) }
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"zero", 0, 0x0000},
		{"neg zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3f80},
		{"minus 3", -3, 0xc040},
		{"tie to even down", 1 + pow2(-8), 0x3f80},
		{"tie to even up", 1 + 3*pow2(-8), 0x3f82},
		{"above tie", 1 + pow2(-8) + pow2(-20), 0x3f81},
		{"max float rounds to inf", math.MaxFloat32, 0x7f80},
		{"inf", float32(math.Inf(1)), 0x7f80},
		{"-inf", float32(math.Inf(-1)), 0xff80},
		{"subnormal tie down", math.Float32frombits(0x00008000), 0x0000},
		{"subnormal tie up", math.Float32frombits(0x00018000), 0x0002},
		{"subnormal", math.Float32frombits(0x00010001), 0x0001},
		{"quiet nan", math.Float32frombits(0x7fc00001), 0x7fc0},
		{"signalling nan quieted", math.Float32frombits(0x7f800001), 0x7fc0},
		{"neg nan payload kept", math.Float32frombits(0xff810000), 0xffc1},
	}
	for _, tc := range tests {
		if got := FP32ToBF16(tc.in); got != tc.want {
			t.Errorf("%s: FP32ToBF16(%g) = %#04x, want %#04x", tc.name, tc.in, got, tc.want)
		}
	}
	for i := range 1 << 16 {
		h := uint16(i)
		f := BF16ToFP32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToFP32(%#04x) bits %#08x", h, math.Float32bits(f))
		}
		if math.IsNaN(float64(f)) {
			continue
		}
		if back := FP32ToBF16(f); back != h {
			t.Fatalf("BF16 %#04x: round trip gave %#04x", h, back)
		}
	}
}
