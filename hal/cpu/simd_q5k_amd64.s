#include "textflag.h"
#include "simd_kquant_amd64.h"

// Q5_K × Q8_K, AVX2. Same bits as the pure-Go dotQ5_K: per super-block the
// integer sums isum = Σ sc_j·Σ q·y (q the 5-bit unsigned quant, nibble |
// fifth bit << 4) and mins = Σ m_j·bsum_j are exact, then
// sum += float32(d*float32(isum)); sum -= float32(dmin*float32(mins)),
// with d = dw*yd and dmin = dminw*yd, in that order, without FMA.
// The layout is Q4_K's (d, dmin, scales at the same offsets) with the
// 32-byte qh at 16 and the nibbles moved to 48; byte l of qh holds the
// fifth bits of element l of the eight 32-element sub-blocks, bit j for
// sub-block j. q·y pairs stay within int16 in VPMADDUBSW (2·31·128).
//
// Registers: SI weights, DI activation row 0, R8 row stride, R9 3*stride,
// R10 out, CX super-blocks left. Y15 0x0F bytes, Y12 0x10 bytes, Y7 the
// qh bytes of the current super-block, X14 its 8 scales and X13 its 8
// mins as int16, Y8..Y11 row accumulators, Y0 scratch.

DATA q5k0f<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q5k0f<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q5k0f<>+16(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q5k0f<>+24(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL q5k0f<>(SB), RODATA|NOPTR, $32

DATA q5k10<>+0(SB)/8, $0x1010101010101010
DATA q5k10<>+8(SB)/8, $0x1010101010101010
DATA q5k10<>+16(SB)/8, $0x1010101010101010
DATA q5k10<>+24(SB)/8, $0x1010101010101010
GLOBL q5k10<>(SB), RODATA|NOPTR, $32

// Chunk c: 32 bytes of nibbles = sub-blocks 2c (low, into Y1) and 2c+1
// (high, into Y2); the scales of both broadcast into Y3, Y4.
#define Q5K_NIB(c) \
	VMOVDQU (48+32*c)(SI), Y1; \
	VPSRLW $4, Y1, Y2; \
	VPAND Y15, Y1, Y1; \
	VPAND Y15, Y2, Y2; \
	VPSRLDQ $(4*c), X14, X3; \
	VPBROADCASTW X3, Y3; \
	VPSRLDQ $(4*c+2), X14, X4; \
	VPBROADCASTW X4, Y4

// Move one qh bit of each byte to bit 4 (a 16-bit shift by n ≤ 4 keeps
// bit 4 inside its byte) and OR it into the nibbles in dst.
#define Q5K_HB(op, n, dst) \
	op $n, Y7, Y0; \
	VPAND Y12, Y0, Y0; \
	VPOR Y0, dst, dst

#define Q5K_CHUNK0 Q5K_NIB(0); Q5K_HB(VPSLLW, 4, Y1); Q5K_HB(VPSLLW, 3, Y2)
#define Q5K_CHUNK1 Q5K_NIB(1); Q5K_HB(VPSLLW, 2, Y1); Q5K_HB(VPSLLW, 1, Y2)
#define Q5K_CHUNK2 Q5K_NIB(2); VPAND Y12, Y7, Y0; VPOR Y0, Y1, Y1; Q5K_HB(VPSRLW, 1, Y2)
#define Q5K_CHUNK3 Q5K_NIB(3); Q5K_HB(VPSRLW, 2, Y1); Q5K_HB(VPSRLW, 3, Y2)

// func dotQ5_KAVX2(nb int, w, x *byte, xstride int, out *float32)
TEXT ·dotQ5_KAVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ out+32(FP), R10
	MOVL $0, 0(R10)
	VMOVDQU q5k0f<>(SB), Y15
	VMOVDQU q5k10<>(SB), Y12
	TESTQ CX, CX
	JEQ done
loop:
	KQ_SCALES
	VMOVDQU 16(SI), Y7 // the qh bytes
	VPXOR Y8, Y8, Y8
	Q5K_CHUNK0
	KQ_ROW(0, XR0, Y8)
	Q5K_CHUNK1
	KQ_ROW(1, XR0, Y8)
	Q5K_CHUNK2
	KQ_ROW(2, XR0, Y8)
	Q5K_CHUNK3
	KQ_ROW(3, XR0, Y8)
	KQ_DSCALES
	KQ_EPI(XR0, Y8, X8, 0)
	ADDQ $176, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET

// func dotQ5_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
TEXT ·dotQ5_Kx4AVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	MOVQ out+32(FP), R10
	MOVQ $0, 0(R10)
	MOVQ $0, 8(R10)
	VMOVDQU q5k0f<>(SB), Y15
	VMOVDQU q5k10<>(SB), Y12
	TESTQ CX, CX
	JEQ done
loop:
	KQ_SCALES
	VMOVDQU 16(SI), Y7 // the qh bytes
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9
	VPXOR Y10, Y10, Y10
	VPXOR Y11, Y11, Y11
	Q5K_CHUNK0
	KQ_ROW(0, XR0, Y8)
	KQ_ROW(0, XR1, Y9)
	KQ_ROW(0, XR2, Y10)
	KQ_ROW(0, XR3, Y11)
	Q5K_CHUNK1
	KQ_ROW(1, XR0, Y8)
	KQ_ROW(1, XR1, Y9)
	KQ_ROW(1, XR2, Y10)
	KQ_ROW(1, XR3, Y11)
	Q5K_CHUNK2
	KQ_ROW(2, XR0, Y8)
	KQ_ROW(2, XR1, Y9)
	KQ_ROW(2, XR2, Y10)
	KQ_ROW(2, XR3, Y11)
	Q5K_CHUNK3
	KQ_ROW(3, XR0, Y8)
	KQ_ROW(3, XR1, Y9)
	KQ_ROW(3, XR2, Y10)
	KQ_ROW(3, XR3, Y11)
	KQ_DSCALES
	KQ_EPI(XR0, Y8, X8, 0)
	KQ_EPI(XR1, Y9, X9, 4)
	KQ_EPI(XR2, Y10, X10, 8)
	KQ_EPI(XR3, Y11, X11, 12)
	ADDQ $176, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET
