package cpu

import (
	"encoding/binary"
	"math"
)

// K-quant super-blocks of 256 elements, byte for byte as ggml stores them:
//
//	Q2_K (84 B):  scales[16] | qs[64] | d f16 | dmin f16
//	Q3_K (110 B): hmask[32] | qs[64] | scales[12] | d f16
//	Q4_K (144 B): d f16 | dmin f16 | scales[12] | qs[128]
//	Q5_K (176 B): d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
//	Q6_K (210 B): ql[128] | qh[64] | scales[16] int8 | d f16
//	Q8_K (292 B): d f32 | qs[256] int8 | bsums[16] int16 (sums of 16 quants)
//
// Element order inside a super-block, by format:
//   - Q2_K, Q3_K: two halves of 128; in half h, element 128h+32k+l takes
//     bits 2k..2k+1 of qs[32h+l]. Q3_K's third bit is bit 4h+k of hmask[l]
//     (clear means subtract 4). Sub-blocks of 16 share a scale: Q2_K's
//     scales[g] holds a 4-bit scale (low) and 4-bit min (high); Q3_K packs
//     16 6-bit signed scales (offset 32) in 12 bytes.
//   - Q4_K, Q5_K: four chunks of 64; in chunk c, qs[32c+l] holds element
//     64c+l (low nibble) and 64c+32+l (high nibble). Q5_K's fifth bits are
//     bits 2c and 2c+1 of qh[l]. Sub-blocks of 32 have 6-bit scales and
//     mins packed in 12 bytes (see scaleMinK4).
//   - Q6_K: two halves of 128; in half h with ql at 64h and qh at 32h,
//     element 128h+32k+l takes nibble (k>=2) of ql[l+32(k&1)] and bits
//     2k..2k+1 of qh[l], minus 32. Sub-blocks of 16 have int8 scales.

const qkK = 256 // super-block size

// groupMaxEps is ggml's threshold below which a group counts as all zero.
const groupMaxEps = 1e-15

// scaleMinK4 unpacks the 6-bit scale and min of sub-block j (0..7) of a
// Q4_K/Q5_K super-block from its 12 scale bytes.
func scaleMinK4(j int, s *[12]byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// q3Scales unpacks Q3_K's 16 signed 6-bit scales (already minus 32).
func q3Scales(s *[12]byte) (out [16]int32) {
	for j := range out {
		var lo byte
		if j < 8 {
			lo = s[j] & 15
		} else {
			lo = s[j-8] >> 4
		}
		hi := (s[8+j%4] >> (2 * (j / 4))) & 3
		out[j] = int32(lo|hi<<4) - 32
	}
	return out
}

// ---- Q8_K (activations for K-quant weights) ----

// quantizeQ8_K quantizes activations to Q8_K: a prefix of the blocks with
// SIMD where the CPU has it (quantizeQ8_KSIMD, same bits), the rest with
// quantizeQ8_KBlock.
func quantizeQ8_K(src []float32, dst []byte) {
	for i := 0; i < len(src)/qkK; i++ {
		if n := quantizeQ8_KSIMD(src[qkK*i:], dst[292*i:]); n > 0 {
			i += n - 1 // the SIMD kernel stopped before a block it leaves to Go
			continue
		}
		quantizeQ8_KBlock((*[qkK]float32)(src[qkK*i:qkK*i+qkK]), (*[292]byte)(dst[292*i:292*i+292]))
	}
}

// quantizeQ8_KRef is the pure-Go reference the SIMD kernel is held to.
func quantizeQ8_KRef(src []float32, dst []byte) {
	for i := 0; i < len(src)/qkK; i++ {
		quantizeQ8_KBlock((*[qkK]float32)(src[qkK*i:qkK*i+qkK]), (*[292]byte)(dst[292*i:292*i+292]))
	}
}

// quantizeQ8_KBlock follows ggml's quantize_row_q8_K_ref, which is also what
// the x86 backend uses (its repacked-matmul variant computes the same
// values): the signed value m of largest magnitude (the first on ties),
// iscale = -127/m, q = round-half-even(iscale·v) capped at 127, the 16 sums of
// 16 quants, and d = 1/iscale; a block of zeros is all zero bytes.
func quantizeQ8_KBlock(x *[qkK]float32, b *[292]byte) {
	q := (*[qkK]byte)(b[4 : 4+qkK])
	maxv := signedAbsMax(x[:])
	if maxv == 0 {
		clear(b[:])
		return
	}
	iscale := -127 / maxv
	for j, v := range x {
		q[j] = byte(int8(min(127, nearestInt(float32(iscale*v)))))
	}
	for g := 0; g < 16; g++ {
		var s int32
		for _, v := range q[16*g : 16*g+16] {
			s += int32(int8(v))
		}
		binary.LittleEndian.PutUint16(b[4+qkK+2*g:], uint16(int16(s)))
	}
	binary.LittleEndian.PutUint32(b[:], math.Float32bits(1/iscale))
}

func dequantizeQ8_K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/qkK; i++ {
		b := src[292*i : 292*i+292]
		d := math.Float32frombits(binary.LittleEndian.Uint32(b))
		q := (*[qkK]byte)(b[4 : 4+qkK])
		y := (*[qkK]float32)(dst[qkK*i : qkK*i+qkK])
		for j, v := range q {
			y[j] = d * float32(int8(v))
		}
	}
}

// ---- dequantization ----

func dequantizeQ2_K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/qkK; i++ {
		b := src[84*i : 84*i+84]
		sc := (*[16]byte)(b[0:16])
		d, dmin := f16At(b[80:]), f16At(b[82:])
		y := (*[qkK]float32)(dst[qkK*i : qkK*i+qkK])
		for h := range 2 {
			q := (*[32]byte)(b[16+32*h : 16+32*h+32])
			for k := range 4 {
				shift := 2 * k
				for half := range 2 {
					s := sc[8*h+2*k+half]
					dl := d * float32(s&15)
					ml := dmin * float32(s>>4)
					out := (*[16]float32)(y[128*h+32*k+16*half : 128*h+32*k+16*half+16])
					qq := (*[16]byte)(q[16*half : 16*half+16])
					for l, v := range qq {
						out[l] = float32(dl*float32(v>>shift&3)) - ml
					}
				}
			}
		}
	}
}

func dequantizeQ3_K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/qkK; i++ {
		b := src[110*i : 110*i+110]
		hm := (*[32]byte)(b[0:32])
		scales := q3Scales((*[12]byte)(b[96:108]))
		d := f16At(b[108:])
		y := (*[qkK]float32)(dst[qkK*i : qkK*i+qkK])
		for h := range 2 {
			q := (*[32]byte)(b[32+32*h : 32+32*h+32])
			for k := range 4 {
				shift := 2 * k
				m := byte(1) << (4*h + k)
				for half := range 2 {
					dl := d * float32(scales[8*h+2*k+half])
					out := (*[16]float32)(y[128*h+32*k+16*half : 128*h+32*k+16*half+16])
					for l := range out {
						j := 16*half + l
						v := int32(q[j]>>shift) & 3
						if hm[j]&m == 0 {
							v -= 4
						}
						out[l] = dl * float32(v)
					}
				}
			}
		}
	}
}

func dequantizeQ4_K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/qkK; i++ {
		b := src[144*i : 144*i+144]
		d, dmin := f16At(b), f16At(b[2:])
		scales := (*[12]byte)(b[4:16])
		qs := (*[128]byte)(b[16:144])
		y := (*[qkK]float32)(dst[qkK*i : qkK*i+qkK])
		for c := 0; c < 4; c++ {
			s1, m1 := scaleMinK4(2*c, scales)
			s2, m2 := scaleMinK4(2*c+1, scales)
			d1, dm1 := d*float32(s1), dmin*float32(m1)
			d2, dm2 := d*float32(s2), dmin*float32(m2)
			q := (*[32]byte)(qs[32*c : 32*c+32])
			lo := (*[32]float32)(y[64*c : 64*c+32])
			hi := (*[32]float32)(y[64*c+32 : 64*c+64])
			for l, v := range q {
				lo[l] = float32(d1*float32(v&15)) - dm1
				hi[l] = float32(d2*float32(v>>4)) - dm2
			}
		}
	}
}

func dequantizeQ5_K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/qkK; i++ {
		b := src[176*i : 176*i+176]
		d, dmin := f16At(b), f16At(b[2:])
		scales := (*[12]byte)(b[4:16])
		qh := (*[32]byte)(b[16:48])
		qs := (*[128]byte)(b[48:176])
		y := (*[qkK]float32)(dst[qkK*i : qkK*i+qkK])
		for c := 0; c < 4; c++ {
			s1, m1 := scaleMinK4(2*c, scales)
			s2, m2 := scaleMinK4(2*c+1, scales)
			d1, dm1 := d*float32(s1), dmin*float32(m1)
			d2, dm2 := d*float32(s2), dmin*float32(m2)
			u1, u2 := byte(1)<<(2*c), byte(2)<<(2*c)
			q := (*[32]byte)(qs[32*c : 32*c+32])
			lo := (*[32]float32)(y[64*c : 64*c+32])
			hi := (*[32]float32)(y[64*c+32 : 64*c+64])
			for l, v := range q {
				q1, q2 := int32(v&15), int32(v>>4)
				if qh[l]&u1 != 0 {
					q1 += 16
				}
				if qh[l]&u2 != 0 {
					q2 += 16
				}
				lo[l] = float32(d1*float32(q1)) - dm1
				hi[l] = float32(d2*float32(q2)) - dm2
			}
		}
	}
}

func dequantizeQ6_K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/qkK; i++ {
		b := src[210*i : 210*i+210]
		sc := (*[16]byte)(b[192:208])
		d := f16At(b[208:])
		y := (*[qkK]float32)(dst[qkK*i : qkK*i+qkK])
		for h := range 2 {
			ql := (*[64]byte)(b[64*h : 64*h+64])
			qh := (*[32]byte)(b[128+32*h : 128+32*h+32])
			out := (*[128]float32)(y[128*h : 128*h+128])
			var ds [8]float32
			for g := range ds {
				ds[g] = d * float32(int8(sc[8*h+g]))
			}
			for l := range 32 {
				hb, a, c := qh[l], ql[l], ql[l+32]
				g := l >> 4
				out[l] = ds[g] * float32(int32(a&15|(hb&3)<<4)-32)
				out[l+32] = ds[2+g] * float32(int32(c&15|(hb>>2&3)<<4)-32)
				out[l+64] = ds[4+g] * float32(int32(a>>4|(hb>>4&3)<<4)-32)
				out[l+96] = ds[6+g] * float32(int32(c>>4|(hb>>6&3)<<4)-32)
			}
		}
	}
}

// ---- quantization (ggml's reference quantizers, no importance matrix) ----

// makeQKX2 fits x ≈ scale·L - min with 0 ≤ L ≤ nmax, min ≥ 0 returned as
// theMin, minimising the weighted error over a small search of scales
// (ggml's make_qkx2_quants).
func makeQKX2(nmax int32, x, weights []float32, L, laux []uint8, rmin, rdelta float32, nstep int, useMad bool) (scale, theMin float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := weights[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		lo = min(lo, x[i])
		hi = max(hi, x[i])
		w := weights[i]
		sumW += w
		sumX += w * x[i]
	}
	lo = min(lo, 0)
	if hi == lo {
		clear(L[:n])
		return 0, -lo
	}
	errOf := func(diff float32) float32 {
		if useMad {
			return absF32(diff)
		}
		return diff * diff
	}
	iscale := float32(nmax) / (hi - lo)
	scale = 1 / iscale
	var bestErr float32
	for i := range n {
		l := max(0, min(nmax, nearestInt(iscale*(x[i]-lo))))
		L[i] = uint8(l)
		bestErr += weights[i] * errOf(scale*float32(l)+lo-x[i])
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + rdelta*float32(is) + float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := max(0, min(nmax, nearestInt(iscale*(x[i]-lo))))
			laux[i] = uint8(l)
			w, fl := weights[i], float32(l)
			sumL += w * fl
			sumL2 += w * fl * fl
			sumXL += w * fl * x[i]
		}
		det := sumW*sumL2 - sumL*sumL
		if det <= 0 {
			continue
		}
		thisScale := (sumW*sumXL - sumX*sumL) / det
		thisMin := (sumL2*sumX - sumL*sumXL) / det
		if thisMin > 0 {
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var curErr float32
		for i := range n {
			curErr += weights[i] * errOf(thisScale*float32(laux[i])+thisMin-x[i])
		}
		if curErr < bestErr {
			copy(L[:n], laux[:n])
			bestErr, scale, lo = curErr, thisScale, thisMin
		}
	}
	return scale, -lo
}

// makeQX fits symmetric quants -nmax ≤ L-nmax < nmax, weighting errors by
// x² (ggml's make_qx_quants with rmse_type 1 and no importance weights).
func makeQX(nmax int32, x []float32, L []int8) float32 {
	maxv := signedAbsMax(x)
	if absF32(maxv) < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	fit := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			l := max(-nmax, min(nmax-1, nearestInt(iscale*v)))
			w, fl := v*v, float32(l)
			sumLX += w * v * fl
			sumL2 += w * fl * fl
		}
		return
	}
	store := func(iscale float32) {
		for i, v := range x {
			L[i] = int8(nmax + max(-nmax, min(nmax-1, nearestInt(iscale*v))))
		}
	}
	iscale := -float32(nmax) / maxv
	sumLX, sumL2 := fit(iscale)
	store(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + 0.1*float32(is)) / maxv
		sumLX, sumL2 = fit(iscale)
		if sumL2 > 0 && sumLX*sumLX > best*sumL2 {
			store(iscale)
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// makeQ3 fits symmetric quants in [-nmax, nmax) with a few rounds of
// coordinate descent on the x²-weighted error (ggml's make_q3_quants with
// do_rmse). L receives the quants offset by nmax.
func makeQ3(nmax int32, x []float32, L []int8) float32 {
	maxv := signedAbsMax(x)
	if absF32(maxv) < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	iscale := -float32(nmax) / maxv
	var sumLX, sumL2 float32
	for i, v := range x {
		l := max(-nmax, min(nmax-1, nearestInt(iscale*v)))
		L[i] = int8(l)
		w, fl := v*v, float32(l)
		sumLX += w * v * fl
		sumL2 += w * fl * fl
	}
	for range 5 {
		changed := false
		for i, v := range x {
			w := v * v
			li := float32(L[i])
			slx := sumLX - w*v*li
			if slx <= 0 {
				continue
			}
			sl2 := sumL2 - w*li*li
			nl := max(-nmax, min(nmax-1, nearestInt(v*sl2/slx)))
			if nl == int32(L[i]) {
				continue
			}
			fl := float32(nl)
			slx += w * v * fl
			sl2 += w * fl * fl
			if sl2 > 0 && slx*slx*sumL2 > sumLX*sumLX*sl2 {
				L[i], sumLX, sumL2 = int8(nl), slx, sl2
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	for i := range x {
		L[i] += int8(nmax)
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

func quantizeQ2_K(src []float32, dst []byte) {
	var (
		L       [qkK]uint8
		laux    [16]uint8
		weights [16]float32
		scales  [16]float32
		mins    [16]float32
	)
	const q4scale = 15
	for i := 0; i < len(src)/qkK; i++ {
		x := src[qkK*i : qkK*i+qkK]
		b := dst[84*i : 84*i+84]
		clear(b)
		var maxScale, maxMin float32
		for j := range 16 {
			xs := x[16*j : 16*j+16]
			for l, v := range xs {
				weights[l] = absF32(v)
			}
			scales[j], mins[j] = makeQKX2(3, xs, weights[:], L[16*j:16*j+16], laux[:], -0.5, 0.1, 15, true)
			maxScale = max(maxScale, scales[j])
			maxMin = max(maxMin, mins[j])
		}
		if maxScale > 0 {
			iscale := q4scale / maxScale
			for j := range 16 {
				b[j] = byte(nearestInt(iscale * scales[j]))
			}
			putF16(b[80:], maxScale/q4scale)
		}
		if maxMin > 0 {
			iscale := q4scale / maxMin
			for j := range 16 {
				b[j] |= byte(nearestInt(iscale*mins[j])) << 4
			}
			putF16(b[82:], maxMin/q4scale)
		}
		d, dmin := f16At(b[80:]), f16At(b[82:])
		for j := range 16 {
			dl := d * float32(b[j]&15)
			if dl == 0 {
				continue
			}
			dm := dmin * float32(b[j]>>4)
			for l := range 16 {
				L[16*j+l] = uint8(max(0, min(3, nearestInt((x[16*j+l]+dm)/dl))))
			}
		}
		for h := range 2 {
			for l := range 32 {
				e := 128*h + l
				b[16+32*h+l] = L[e] | L[e+32]<<2 | L[e+64]<<4 | L[e+96]<<6
			}
		}
	}
}

func quantizeQ3_K(src []float32, dst []byte) {
	var (
		L      [qkK]int8
		scales [16]float32
	)
	for i := 0; i < len(src)/qkK; i++ {
		x := src[qkK*i : qkK*i+qkK]
		b := dst[110*i : 110*i+110]
		clear(b)
		var maxScale, amax float32
		for j := range 16 {
			scales[j] = makeQ3(4, x[16*j:16*j+16], L[16*j:16*j+16])
			if a := absF32(scales[j]); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		sb := b[96:108]
		if maxScale != 0 {
			iscale := -32 / maxScale
			for j := range 16 {
				l := byte(max(-32, min(31, int32(int8(nearestInt(iscale*scales[j]))))) + 32)
				if j < 8 {
					sb[j] = l & 15
				} else {
					sb[j-8] |= (l & 15) << 4
				}
				sb[8+j%4] |= (l >> 4) << (2 * (j / 4))
			}
			putF16(b[108:], 1/iscale)
		}
		d := f16At(b[108:])
		sc := q3Scales((*[12]byte)(sb))
		for j := range 16 {
			dl := d * float32(sc[j])
			if dl == 0 {
				continue
			}
			for l := range 16 {
				L[16*j+l] = int8(max(-4, min(3, nearestInt(x[16*j+l]/dl))) + 4)
			}
		}
		hm := b[0:32]
		for e := range qkK {
			if L[e] > 3 {
				hm[e%32] |= 1 << (e / 32)
				L[e] -= 4
			}
		}
		for h := range 2 {
			for l := range 32 {
				e := 128*h + l
				b[32+32*h+l] = byte(L[e]) | byte(L[e+32])<<2 | byte(L[e+64])<<4 | byte(L[e+96])<<6
			}
		}
	}
}

// quantizeQ45K quantizes one Q4_K (nmax 15) or Q5_K (nmax 31) super-block:
// it fills L with the quants and writes d, dmin and the packed scales into
// hdr (the first 16 bytes of the block).
func quantizeQ45K(x []float32, nmax int32, rmin float32, nstep int, L *[qkK]uint8, hdr []byte) {
	var (
		laux    [32]uint8
		weights [32]float32
		scales  [8]float32
		mins    [8]float32
	)
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += v * v
		}
		av := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			weights[l] = av + absF32(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, 0.1, nstep, false)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	s := (*[12]byte)(hdr[4:16])
	clear(s[:])
	for j := range 8 {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			s[j] = ls
			s[j+4] = lm
		} else {
			s[j+4] = ls&15 | (lm&15)<<4
			s[j-4] |= (ls >> 4) << 6
			s[j] |= (lm >> 4) << 6
		}
	}
	putF16(hdr, maxScale/63)
	putF16(hdr[2:], maxMin/63)
	d, dmin := f16At(hdr), f16At(hdr[2:])
	for j := range 8 {
		sc, m := scaleMinK4(j, s)
		dl := d * float32(sc)
		if dl == 0 {
			continue
		}
		dm := dmin * float32(m)
		for l := range 32 {
			L[32*j+l] = uint8(max(0, min(nmax, nearestInt((x[32*j+l]+dm)/dl))))
		}
	}
}

func quantizeQ4_K(src []float32, dst []byte) {
	var L [qkK]uint8
	for i := 0; i < len(src)/qkK; i++ {
		b := dst[144*i : 144*i+144]
		quantizeQ45K(src[qkK*i:qkK*i+qkK], 15, -1, 20, &L, b)
		for c := range 4 {
			for l := range 32 {
				b[16+32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
			}
		}
	}
}

func quantizeQ5_K(src []float32, dst []byte) {
	var L [qkK]uint8
	for i := 0; i < len(src)/qkK; i++ {
		b := dst[176*i : 176*i+176]
		quantizeQ45K(src[qkK*i:qkK*i+qkK], 31, -0.5, 15, &L, b)
		qh := b[16:48]
		clear(qh)
		for c := range 4 {
			for l := range 32 {
				l1, l2 := L[64*c+l], L[64*c+32+l]
				if l1 > 15 {
					l1 -= 16
					qh[l] |= 1 << (2 * c)
				}
				if l2 > 15 {
					l2 -= 16
					qh[l] |= 2 << (2 * c)
				}
				b[48+32*c+l] = l1 | l2<<4
			}
		}
	}
}

func quantizeQ6_K(src []float32, dst []byte) {
	var (
		L      [qkK]int8
		scales [16]float32
	)
	for i := 0; i < len(src)/qkK; i++ {
		x := src[qkK*i : qkK*i+qkK]
		b := dst[210*i : 210*i+210]
		clear(b)
		var maxScale, maxAbs float32
		for j := range 16 {
			scales[j] = makeQX(32, x[16*j:16*j+16], L[16*j:16*j+16])
			if a := absF32(scales[j]); a > maxAbs {
				maxAbs, maxScale = a, scales[j]
			}
		}
		if maxAbs < groupMaxEps {
			continue // all-zero block
		}
		iscale := -128 / maxScale
		putF16(b[208:], 1/iscale)
		sc := b[192:208]
		for j := range 16 {
			sc[j] = byte(int8(min(127, nearestInt(iscale*scales[j]))))
		}
		d := f16At(b[208:])
		for j := range 16 {
			dl := d * float32(int8(sc[j]))
			if dl == 0 {
				continue
			}
			for l := range 16 {
				L[16*j+l] = int8(max(-32, min(31, nearestInt(x[16*j+l]/dl))) + 32)
			}
		}
		for h := range 2 {
			ql := b[64*h : 64*h+64]
			qh := b[128+32*h : 128+32*h+32]
			for l := range 32 {
				e := 128*h + l
				q1, q2, q3, q4 := byte(L[e]), byte(L[e+32]), byte(L[e+64]), byte(L[e+96])
				ql[l] = q1&15 | (q3&15)<<4
				ql[l+32] = q2&15 | (q4&15)<<4
				qh[l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
			}
		}
	}
}
