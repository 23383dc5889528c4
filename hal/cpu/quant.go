package cpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"tandem/hal"
)

// Quantized block formats, byte for byte as ggml stores them (little-endian,
// no padding). Each block of 32 elements holds:
//
//	Q4_0 (18 B): d f16 | qs[16]            x = (q-8)·d, q a nibble
//	Q4_1 (20 B): d f16 | m f16 | qs[16]    x = q·d + m
//	Q5_0 (22 B): d f16 | qh u32 | qs[16]   x = (q-16)·d, q = nibble | bit<<4
//	Q5_1 (24 B): d f16 | m f16 | qh u32 | qs[16]
//	Q8_0 (34 B): d f16 | qs[32] int8
//	Q8_1 (36 B): d f16 | s f16 | qs[32]    s = d·Σqs
//
// In the 4- and 5-bit formats byte j holds element j in its low nibble and
// element j+16 in its high nibble; bit j of qh is the fifth bit of element j.
// The K-quant super-blocks of 256 elements are described in quant_k.go.

// VecDotType returns the type activations are converted to before a dot
// product with weights of type t, as ggml's CPU backend does.
func VecDotType(t hal.DType) hal.DType {
	switch t {
	case hal.Q4_0, hal.Q5_0, hal.Q8_0:
		return hal.Q8_0
	case hal.Q4_1, hal.Q5_1:
		return hal.Q8_1
	case hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K:
		return hal.Q8_K
	}
	return t // F32, F16, BF16 multiply in their own type
}

// SupportedWeight reports whether t can be used as a weight type in VecDot
// and DequantizeRow.
func SupportedWeight(t hal.DType) bool {
	switch t {
	case hal.F32, hal.F16, hal.BF16,
		hal.Q4_0, hal.Q4_1, hal.Q5_0, hal.Q5_1, hal.Q8_0,
		hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K:
		return true
	}
	return false
}

// QuantizeRow converts the len(src) floats of src into dst in type t; dst
// must be exactly t.RowBytes(len(src)) long.
//
// For the activation types (F32, F16, BF16, Q8_0, Q8_1, Q8_K) the result is
// bit-identical to what ggml's x86 CPU backend feeds its dot products. Q8_0
// and Q8_1 follow the AVX path, which llama.cpp runs on any x86 with AVX:
// id = 127/amax and round half to even. (ggml's portable reference,
// quantize_row_q8_0_ref, uses id = 1/d and rounds half away from zero; the
// two differ only at exact ties and ulp-level scale differences.) Weight
// types use ggml's reference quantizers (what llama-quantize does without an
// importance matrix).
func QuantizeRow(t hal.DType, src []float32, dst []byte) {
	checkQuantRow(t, len(src), len(dst))
	switch t {
	case hal.F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case hal.F16:
		for i := 0; i < len(src); i++ {
			i += f32ToF16SIMD(src[i:], dst[2*i:])
			if i < len(src) {
				binary.LittleEndian.PutUint16(dst[2*i:], FP32ToFP16(src[i]))
			}
		}
	case hal.BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToBF16(v))
		}
	case hal.Q8_0:
		quantizeQ8_0(src, dst)
	case hal.Q8_1:
		quantizeQ8_1(src, dst)
	case hal.Q8_K:
		quantizeQ8_K(src, dst)
	case hal.Q4_0:
		quantizeQ4_0(src, dst)
	case hal.Q4_1:
		quantizeQ4_1(src, dst)
	case hal.Q5_0:
		quantizeQ5_0(src, dst)
	case hal.Q5_1:
		quantizeQ5_1(src, dst)
	case hal.Q2_K:
		quantizeQ2_K(src, dst)
	case hal.Q3_K:
		quantizeQ3_K(src, dst)
	case hal.Q4_K:
		quantizeQ4_K(src, dst)
	case hal.Q5_K:
		quantizeQ5_K(src, dst)
	case hal.Q6_K:
		quantizeQ6_K(src, dst)
	default:
		panic(fmt.Sprintf("cpu: QuantizeRow: unsupported type %v", t))
	}
}

// DequantizeRow converts a row of len(dst) elements of type t into floats,
// with the same float32 operations as ggml's dequantize_row_* (each product
// and sum rounded separately; no fused multiply-add).
func DequantizeRow(t hal.DType, src []byte, dst []float32) {
	checkQuantRow(t, len(dst), len(src))
	switch t {
	case hal.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case hal.F16:
		for i := range dst {
			dst[i] = FP16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case hal.BF16:
		for i := range dst {
			dst[i] = BF16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case hal.Q4_0:
		dequantizeQ4_0(src, dst)
	case hal.Q4_1:
		dequantizeQ4_1(src, dst)
	case hal.Q5_0:
		dequantizeQ5_0(src, dst)
	case hal.Q5_1:
		dequantizeQ5_1(src, dst)
	case hal.Q8_0:
		dequantizeQ8_0(src, dst)
	case hal.Q8_1:
		dequantizeQ8_1(src, dst)
	case hal.Q8_K:
		dequantizeQ8_K(src, dst)
	case hal.Q2_K:
		dequantizeQ2_K(src, dst)
	case hal.Q3_K:
		dequantizeQ3_K(src, dst)
	case hal.Q4_K:
		dequantizeQ4_K(src, dst)
	case hal.Q5_K:
		dequantizeQ5_K(src, dst)
	case hal.Q6_K:
		dequantizeQ6_K(src, dst)
	default:
		panic(fmt.Sprintf("cpu: DequantizeRow: unsupported type %v", t))
	}
}

// checkQuantRow panics unless a row of n elements of type t takes exactly nb bytes.
func checkQuantRow(t hal.DType, n, nb int) {
	want, err := t.RowBytes(n)
	if err != nil {
		panic("cpu: " + err.Error())
	}
	if nb != want {
		panic(fmt.Sprintf("cpu: %d %v elements take %d bytes, got %d", n, t, want, nb))
	}
}

// f16At reads the little-endian FP16 value at b[0:2] as float32.
func f16At(b []byte) float32 { return fp16Table[binary.LittleEndian.Uint16(b)] }

// putF16 stores f as FP16 at b[0:2].
func putF16(b []byte, f float32) { binary.LittleEndian.PutUint16(b, FP32ToFP16(f)) }

// roundF16 returns f after a round trip through FP16, the value a reader of
// a stored scale sees.
func roundF16(f float32) float32 { return FP16ToFP32(FP32ToFP16(f)) }

// magicRound is 1.5·2^23: adding it to a float32 of magnitude < 2^22 leaves
// the value rounded half to even in the low mantissa bits.
const magicRound = 12582912

// nearestInt rounds f half to even, exactly as ggml's nearest_int (valid
// for |f| < 2^22).
func nearestInt(f float32) int32 {
	v := f + magicRound
	return int32(math.Float32bits(v)&0x7fffff) - 0x400000
}

// truncInt8 converts like C's (int8_t) cast of a float in range: toward zero.
func truncInt8(f float32) int32 { return int32(int8(int32(f))) }

// absF32 returns |v| by clearing the sign bit.
func absF32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// absMaxF32 returns max |x| over xs (NaNs ignored).
func absMaxF32(xs []float32) float32 {
	var m float32
	for _, v := range xs {
		if a := absF32(v); a > m {
			m = a
		}
	}
	return m
}

// ---- Q8_0 / Q8_1: activation formats (also a weight format for Q8_0) ----

// quantizeQ8Block fills q with the rounded quants of x and returns the scale
// d (before its FP16 rounding), following ggml's AVX quantize_row_q8_0.
func quantizeQ8Block(x []float32, q *[32]byte) (d float32, sum int32) {
	x = x[:32]
	amax := absMaxF32(x)
	d = amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	for j, v := range x {
		// float32(...) keeps the product rounded to float32 (no FMA).
		r := nearestInt(float32(v * id))
		r = max(-128, min(127, r)) // the packs' saturation; never hit for finite input
		q[j] = byte(int8(r))
		sum += r
	}
	return d, sum
}

func quantizeQ8_0(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		if n := quantizeQ8_0SIMD(src[32*i:], dst[34*i:]); n > 0 {
			i += n - 1 // the SIMD kernel stopped before a block with NaN or Inf
			continue
		}
		b := dst[34*i : 34*i+34]
		d, _ := quantizeQ8Block(src[32*i:], (*[32]byte)(b[2:34]))
		putF16(b, d)
	}
}

// quantizeQ8_0Ref is ggml's portable reference Q8_0 quantizer
// (quantize_row_q8_0_ref), which llama-quantize uses for Q8_0 weights:
// id = 1/d and round half away from zero. QuantizeRow(Q8_0) instead follows
// the x86 activation path; the two differ only in rare last-bit cases.
func quantizeQ8_0Ref(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[32*i : 32*i+32]
		b := dst[34*i : 34*i+34]
		d := absMaxF32(x) / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, d)
		for j, v := range x {
			b[2+j] = byte(int8(math.Round(float64(float32(v * id)))))
		}
	}
}

func quantizeQ8_1(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		b := dst[36*i : 36*i+36]
		d, sum := quantizeQ8Block(src[32*i:], (*[32]byte)(b[4:36]))
		putF16(b, d)
		putF16(b[2:], float32(sum)*d)
	}
}

func dequantizeQ8_0(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[34*i : 34*i+34]
		d := f16At(b)
		q := (*[32]byte)(b[2:34])
		y := (*[32]float32)(dst[32*i : 32*i+32])
		for j := range y {
			y[j] = float32(int8(q[j])) * d
		}
	}
}

func dequantizeQ8_1(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[36*i : 36*i+36]
		d := f16At(b)
		q := (*[32]byte)(b[4:36])
		y := (*[32]float32)(dst[32*i : 32*i+32])
		for j := range y {
			y[j] = float32(int8(q[j])) * d
		}
	}
}

// ---- Q4_0, Q4_1, Q5_0, Q5_1: weight formats, ggml reference quantizers ----

// signedAbsMax returns the element of largest magnitude, first one on ties.
func signedAbsMax(x []float32) float32 {
	var amax, m float32
	for _, v := range x {
		if a := absF32(v); a > amax {
			amax, m = a, v
		}
	}
	return m
}

func quantMinMax(x []float32) (lo, hi float32) {
	lo, hi = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		lo = min(lo, v)
		hi = max(hi, v)
	}
	return lo, hi
}

func quantizeQ4_0(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[32*i : 32*i+32]
		b := dst[18*i : 18*i+18]
		d := signedAbsMax(x) / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, d)
		for j := 0; j < 16; j++ {
			q0 := min(15, truncInt8(float32(x[j]*id)+8.5))
			q1 := min(15, truncInt8(float32(x[j+16]*id)+8.5))
			b[2+j] = byte(q0) | byte(q1)<<4
		}
	}
}

func quantizeQ4_1(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[32*i : 32*i+32]
		b := dst[20*i : 20*i+20]
		lo, hi := quantMinMax(x)
		d := (hi - lo) / 15
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, d)
		putF16(b[2:], lo)
		for j := 0; j < 16; j++ {
			q0 := min(15, truncInt8(float32((x[j]-lo)*id)+0.5))
			q1 := min(15, truncInt8(float32((x[j+16]-lo)*id)+0.5))
			b[4+j] = byte(q0) | byte(q1)<<4
		}
	}
}

func quantizeQ5_0(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[32*i : 32*i+32]
		b := dst[22*i : 22*i+22]
		d := signedAbsMax(x) / -16
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, d)
		var qh uint32
		for j := 0; j < 16; j++ {
			q0 := uint32(min(31, truncInt8(float32(x[j]*id)+16.5)))
			q1 := uint32(min(31, truncInt8(float32(x[j+16]*id)+16.5)))
			b[6+j] = byte(q0&15) | byte(q1&15)<<4
			qh |= (q0 >> 4) << j
			qh |= (q1 >> 4) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[2:], qh)
	}
}

func quantizeQ5_1(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[32*i : 32*i+32]
		b := dst[24*i : 24*i+24]
		lo, hi := quantMinMax(x)
		d := (hi - lo) / 31
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, d)
		putF16(b[2:], lo)
		var qh uint32
		for j := 0; j < 16; j++ {
			q0 := uint32(uint8(int32(float32((x[j]-lo)*id) + 0.5)))
			q1 := uint32(uint8(int32(float32((x[j+16]-lo)*id) + 0.5)))
			b[8+j] = byte(q0&15) | byte(q1&15)<<4
			qh |= (q0 >> 4 & 1) << j
			qh |= (q1 >> 4 & 1) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[4:], qh)
	}
}

func dequantizeQ4_0(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[18*i : 18*i+18]
		d := f16At(b)
		q := (*[16]byte)(b[2:18])
		y := (*[32]float32)(dst[32*i : 32*i+32])
		for j, v := range q {
			y[j] = float32(int32(v&15)-8) * d
			y[j+16] = float32(int32(v>>4)-8) * d
		}
	}
}

func dequantizeQ4_1(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[20*i : 20*i+20]
		d, m := f16At(b), f16At(b[2:])
		q := (*[16]byte)(b[4:20])
		y := (*[32]float32)(dst[32*i : 32*i+32])
		for j, v := range q {
			y[j] = float32(float32(v&15)*d) + m
			y[j+16] = float32(float32(v>>4)*d) + m
		}
	}
}

func dequantizeQ5_0(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[22*i : 22*i+22]
		d := f16At(b)
		qh := binary.LittleEndian.Uint32(b[2:])
		q := (*[16]byte)(b[6:22])
		y := (*[32]float32)(dst[32*i : 32*i+32])
		for j, v := range q {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			y[j] = float32(int32(v&15|h0)-16) * d
			y[j+16] = float32(int32(v>>4|h1)-16) * d
		}
	}
}

func dequantizeQ5_1(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[24*i : 24*i+24]
		d, m := f16At(b), f16At(b[2:])
		qh := binary.LittleEndian.Uint32(b[4:])
		q := (*[16]byte)(b[8:24])
		y := (*[32]float32)(dst[32*i : 32*i+32])
		for j, v := range q {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			y[j] = float32(float32(v&15|h0)*d) + m
			y[j+16] = float32(float32(v>>4|h1)*d) + m
		}
	}
}
