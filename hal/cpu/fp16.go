package cpu

import "math"

// Half-precision conversions. Both directions follow ggml: FP32→FP16 and
// FP32→BF16 round to nearest, ties to even; overflow goes to infinity;
// subnormals are kept, not flushed. A NaN becomes a quiet NaN: FP16 keeps the
// sign and uses 0x7e00 (ggml's reference conversion), BF16 keeps the top
// payload bits and sets the quiet bit.

// fp16Table holds the float32 value of every FP16 bit pattern. Rows of F16
// weights are widened through it in the dot-product and dequantize loops.
var fp16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = fp16ToFP32Slow(uint16(i))
	}
	return &t
}()

// FP16ToFP32 widens an IEEE binary16 value. The conversion is exact.
func FP16ToFP32(h uint16) float32 { return fp16Table[h] }

func fp16ToFP32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN; the payload moves to the top of the float32 mantissa
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: mant·2^-24. Normalise so the leading one becomes implicit.
	e := uint32(113) // biased float32 exponent of 2^-14
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

// FP32ToFP16 narrows f to IEEE binary16, rounding to nearest even.
func FP32ToFP16(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	abs := bits & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00
	case abs >= 0x47800000: // ≥ 65536 (or inf): past the largest finite half after rounding
		return sign | 0x7c00
	case abs >= 0x38800000: // normal half range, ≥ 2^-14
		// Rebias the exponent (127 → 15) and drop 13 mantissa bits. A carry
		// out of the mantissa correctly bumps the exponent, up to infinity.
		h := (abs - 0x38000000) >> 13
		rest := abs & 0x1fff
		if rest > 0x1000 || rest == 0x1000 && h&1 != 0 {
			h++
		}
		return sign | uint16(h)
	}
	// Subnormal half (or zero): the result counts units of 2^-24.
	exp := abs >> 23
	if exp < 102 { // |f| < 2^-25: rounds to zero (2^-25 itself is a tie to even 0)
		return sign
	}
	mant := abs&0x7fffff | 0x800000 // value = mant·2^(exp-150)
	shift := 126 - exp              // value/2^-24 = mant >> shift, 14 ≤ shift ≤ 24
	h := mant >> shift
	rest := mant & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rest > half || rest == half && h&1 != 0 {
		h++ // may carry into the smallest normal, 0x0400, which is right
	}
	return sign | uint16(h)
}

// BF16ToFP32 widens a bfloat16 value. The conversion is exact.
func BF16ToFP32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// FP32ToBF16 narrows f to bfloat16, rounding to nearest even.
func FP32ToBF16(f float32) uint16 {
	bits := math.Float32bits(f)
	if bits&0x7fffffff > 0x7f800000 { // NaN: truncate and force quiet
		return uint16(bits>>16) | 0x40
	}
	return uint16((bits + 0x7fff + (bits>>16)&1) >> 16)
}
