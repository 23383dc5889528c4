#include "textflag.h"
#include "simd_kquant_amd64.h"

// Q4_K × Q8_K, AVX2. Same bits as the pure-Go dotQ4_K: per super-block the
// integer sums isum = Σ sc_j·Σ q·y and mins = Σ m_j·bsum_j are exact, then
// sum += float32(d*float32(isum)); sum -= float32(dmin*float32(mins)),
// with d = dw*yd and dmin = dminw*yd, in that order, without FMA.
//
// Registers: SI weights, DI activation row 0, R8 row stride, R9 3*stride,
// R10 out, CX super-blocks left. Y15 0x0F bytes, X14 the 8 scales and X13
// the 8 mins of the current super-block as int16, Y8..Y11 row accumulators.

DATA k0f<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA k0f<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA k0f<>+16(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA k0f<>+24(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL k0f<>(SB), RODATA|NOPTR, $32

// Chunk c: 32 bytes of nibbles = sub-blocks 2c (low) and 2c+1 (high).
#define Q4K_CHUNK(c) \
	VMOVDQU (16+32*c)(SI), Y1; \
	VPSRLW $4, Y1, Y2; \
	VPAND Y15, Y1, Y1; \
	VPAND Y15, Y2, Y2; \
	VPSRLDQ $(4*c), X14, X3; \
	VPBROADCASTW X3, Y3; \
	VPSRLDQ $(4*c+2), X14, X4; \
	VPBROADCASTW X4, Y4

// func dotQ4_KAVX2(nb int, w, x *byte, xstride int, out *float32)
TEXT ·dotQ4_KAVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ out+32(FP), R10
	MOVL $0, 0(R10)
	VMOVDQU k0f<>(SB), Y15
	TESTQ CX, CX
	JEQ done
loop:
	KQ_SCALES
	VPXOR Y8, Y8, Y8
	Q4K_CHUNK(0)
	KQ_ROW(0, XR0, Y8)
	Q4K_CHUNK(1)
	KQ_ROW(1, XR0, Y8)
	Q4K_CHUNK(2)
	KQ_ROW(2, XR0, Y8)
	Q4K_CHUNK(3)
	KQ_ROW(3, XR0, Y8)
	KQ_DSCALES
	KQ_EPI(XR0, Y8, X8, 0)
	ADDQ $144, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET

// func dotQ4_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
TEXT ·dotQ4_Kx4AVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	MOVQ out+32(FP), R10
	MOVQ $0, 0(R10)
	MOVQ $0, 8(R10)
	VMOVDQU k0f<>(SB), Y15
	TESTQ CX, CX
	JEQ done
loop:
	KQ_SCALES
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9
	VPXOR Y10, Y10, Y10
	VPXOR Y11, Y11, Y11
	Q4K_CHUNK(0)
	KQ_ROW(0, XR0, Y8)
	KQ_ROW(0, XR1, Y9)
	KQ_ROW(0, XR2, Y10)
	KQ_ROW(0, XR3, Y11)
	Q4K_CHUNK(1)
	KQ_ROW(1, XR0, Y8)
	KQ_ROW(1, XR1, Y9)
	KQ_ROW(1, XR2, Y10)
	KQ_ROW(1, XR3, Y11)
	Q4K_CHUNK(2)
	KQ_ROW(2, XR0, Y8)
	KQ_ROW(2, XR1, Y9)
	KQ_ROW(2, XR2, Y10)
	KQ_ROW(2, XR3, Y11)
	Q4K_CHUNK(3)
	KQ_ROW(3, XR0, Y8)
	KQ_ROW(3, XR1, Y9)
	KQ_ROW(3, XR2, Y10)
	KQ_ROW(3, XR3, Y11)
	KQ_DSCALES
	KQ_EPI(XR0, Y8, X8, 0)
	KQ_EPI(XR1, Y9, X9, 4)
	KQ_EPI(XR2, Y10, X10, 8)
	KQ_EPI(XR3, Y11, X11, 12)
	ADDQ $144, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET

// Q6_K × Q8_K, AVX2. Same bits as the pure-Go dotQ6_K: with u = q+32 the
// 6-bit unsigned quant, isum = Σ_G sc_G·(Σ u·y − 32·bsum_G) is exact; then
// sum += float32((dw*yd)*float32(isum)). (Relies, like ggml, on the Q8_K
// bsums being the sums of its quants, which QuantizeRow guarantees.)
//
// Y1, Y2 = ql halves, Y7 = qh, Y15 0x0F bytes, Y13 0x03 bytes, X14 the 8
// scales of the current half as int16, Y8..Y11 row accumulators.

DATA k03<>+0(SB)/8, $0x0303030303030303
DATA k03<>+8(SB)/8, $0x0303030303030303
DATA k03<>+16(SB)/8, $0x0303030303030303
DATA k03<>+24(SB)/8, $0x0303030303030303
GLOBL k03<>(SB), RODATA|NOPTR, $32

#define Q6K_HALF(h) \
	VMOVDQU (64*h)(SI), Y1; \
	VMOVDQU (64*h+32)(SI), Y2; \
	VMOVDQU (128+32*h)(SI), Y7; \
	VPMOVSXBW (192+8*h)(SI), X14

// u_k into Y5, its two scales (words 0-7, 8-15) into Y6.
#define Q6K_U(src, lsh, hsh, k) \
	VPSRLW $lsh, src, Y5; \
	VPAND Y15, Y5, Y5; \
	VPSRLW $hsh, Y7, Y4; \
	VPAND Y13, Y4, Y4; \
	VPSLLW $4, Y4, Y4; \
	VPOR Y4, Y5, Y5; \
	VPSRLDQ $(4*k), X14, X6; \
	VPBROADCASTW X6, X6; \
	VPSRLDQ $(4*k+2), X14, X12; \
	VPBROADCASTW X12, X12; \
	VINSERTI128 $1, X12, Y6, Y6

#define Q6K_ROW(h, k, XR, acc) \
	VPMADDUBSW (4+128*h+32*k)XR, Y5, Y3; \
	VPMADDWD Y6, Y3, Y3; \
	VPADDD Y3, acc, acc

// Row epilogue: Y0 = the 16 scales as int16, X1 = dw.
#define Q6K_EPI(XR, acc, accx, o) \
	VEXTRACTI128 $1, acc, X5; \
	VPADDD X5, accx, X5; \
	VPSHUFD $0x4e, X5, X6; \
	VPADDD X6, X5, X5; \
	VPSHUFD $0xb1, X5, X6; \
	VPADDD X6, X5, X5; \
	VPMADDWD 260 XR, Y0, Y6; \
	VEXTRACTI128 $1, Y6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0x4e, X6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0xb1, X6, X7; \
	VPADDD X7, X6, X6; \
	VPSLLD $5, X6, X6; \
	VPSUBD X6, X5, X5; \
	VCVTDQ2PS X5, X5; \
	VMOVSS 0 XR, X7; \
	VMULSS X7, X1, X3; \
	VMULSS X5, X3, X3; \
	VMOVSS o(R10), X5; \
	VADDSS X3, X5, X5; \
	VMOVSS X5, o(R10)

#define Q6K_DSCALE \
	VPMOVSXBW 192(SI), Y0; \
	MOVWLZX 208(SI), AX; \
	VMOVD AX, X1; \
	VCVTPH2PS X1, X1

#define Q6K_ROWS1(h, k) Q6K_ROW(h, k, XR0, Y8)
#define Q6K_ROWS4(h, k) Q6K_ROW(h, k, XR0, Y8); Q6K_ROW(h, k, XR1, Y9); Q6K_ROW(h, k, XR2, Y10); Q6K_ROW(h, k, XR3, Y11)

#define Q6K_SUPER(ROWS) \
	Q6K_HALF(0); \
	Q6K_U(Y1, 0, 0, 0); ROWS(0, 0); \
	Q6K_U(Y2, 0, 2, 1); ROWS(0, 1); \
	Q6K_U(Y1, 4, 4, 2); ROWS(0, 2); \
	Q6K_U(Y2, 4, 6, 3); ROWS(0, 3); \
	Q6K_HALF(1); \
	Q6K_U(Y1, 0, 0, 0); ROWS(1, 0); \
	Q6K_U(Y2, 0, 2, 1); ROWS(1, 1); \
	Q6K_U(Y1, 4, 4, 2); ROWS(1, 2); \
	Q6K_U(Y2, 4, 6, 3); ROWS(1, 3)

// func dotQ6_KAVX2(nb int, w, x *byte, xstride int, out *float32)
TEXT ·dotQ6_KAVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ out+32(FP), R10
	MOVL $0, 0(R10)
	VMOVDQU k0f<>(SB), Y15
	VMOVDQU k03<>(SB), Y13
	TESTQ CX, CX
	JEQ done
loop:
	VPXOR Y8, Y8, Y8
	Q6K_SUPER(Q6K_ROWS1)
	Q6K_DSCALE
	Q6K_EPI(XR0, Y8, X8, 0)
	ADDQ $210, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET

// func dotQ6_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
TEXT ·dotQ6_Kx4AVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	MOVQ out+32(FP), R10
	MOVQ $0, 0(R10)
	MOVQ $0, 8(R10)
	VMOVDQU k0f<>(SB), Y15
	VMOVDQU k03<>(SB), Y13
	TESTQ CX, CX
	JEQ done
loop:
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9
	VPXOR Y10, Y10, Y10
	VPXOR Y11, Y11, Y11
	Q6K_SUPER(Q6K_ROWS4)
	Q6K_DSCALE
	Q6K_EPI(XR0, Y8, X8, 0)
	Q6K_EPI(XR1, Y9, X9, 4)
	Q6K_EPI(XR2, Y10, X10, 8)
	Q6K_EPI(XR3, Y11, X11, 12)
	ADDQ $210, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET
