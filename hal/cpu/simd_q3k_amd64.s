#include "textflag.h"

// Q3_K × Q8_K, AVX2. Same bits as the pure-Go dotQ3_K: with u = q2 | hbit<<2
// the unsigned 3-bit quant (u-4 is the signed one), per super-block
// isum = Σ_G sc_G·(Σ u·y − 4·bsum_G) over the sixteen 16-element groups is
// exact, then sum += float32((dw*yd)*float32(isum)), without FMA. (Like
// the Q6_K kernel, this relies on the Q8_K bsums being the sums of its
// quants, which QuantizeRow guarantees.)
//
// Block (110 B): hmask[32] | qs[64] | scales[12] | d f16. Chunk c = 4h+k
// (32 elements, groups 2c and 2c+1) takes bits 2k..2k+1 of qs[32h+l] and
// bit c of hmask[l], l = 0..31, against activations 128h+32k+l.
// Bounds: VPMADDUBSW pairs 2·7·128 fit int16; VPMADDWD by scales in
// [-32, 31] and the 8 chunks summed stay far inside int32 (|isum| ≤
// 256·7·128·32 + 4·32·16·2048 < 2^24).
//
// Registers: SI weights, DI activation row 0, R8 row stride, R9 3*stride,
// R10 out, CX super-blocks left. Y15 0x03 bytes, Y1 0x04 bytes, Y14 the
// hmask, Y13 the qs half of the current chunk, Y12 the 16 scales as int16,
// Y7 the current chunk's scales (words 0-7 sc_2c, 8-15 sc_2c+1), Y6 its
// u, Y8..Y11 row accumulators, Y0, Y4, Y5 scratch.

DATA q3k03<>+0(SB)/8, $0x0303030303030303
DATA q3k03<>+8(SB)/8, $0x0303030303030303
DATA q3k03<>+16(SB)/8, $0x0303030303030303
DATA q3k03<>+24(SB)/8, $0x0303030303030303
GLOBL q3k03<>(SB), RODATA|NOPTR, $32

DATA q3k04<>+0(SB)/8, $0x0404040404040404
DATA q3k04<>+8(SB)/8, $0x0404040404040404
DATA q3k04<>+16(SB)/8, $0x0404040404040404
DATA q3k04<>+24(SB)/8, $0x0404040404040404
GLOBL q3k04<>(SB), RODATA|NOPTR, $32

// 32 as int16, the scales' offset.
DATA q3k32w<>+0(SB)/8, $0x0020002000200020
DATA q3k32w<>+8(SB)/8, $0x0020002000200020
DATA q3k32w<>+16(SB)/8, $0x0020002000200020
DATA q3k32w<>+24(SB)/8, $0x0020002000200020
GLOBL q3k32w<>(SB), RODATA|NOPTR, $32

// Dword indices 0..7 for VPBROADCASTD: chunk c's two scales are dword c
// of Y12.
DATA q3kidx<>+0(SB)/8, $0x0000000100000000
DATA q3kidx<>+8(SB)/8, $0x0000000300000002
DATA q3kidx<>+16(SB)/8, $0x0000000500000004
DATA q3kidx<>+24(SB)/8, $0x0000000700000006
GLOBL q3kidx<>(SB), RODATA|NOPTR, $32

// In-lane shuffle: low lane word 0 everywhere, high lane word 1.
DATA q3kshuf<>+0(SB)/8, $0x0100010001000100
DATA q3kshuf<>+8(SB)/8, $0x0100010001000100
DATA q3kshuf<>+16(SB)/8, $0x0302030203020302
DATA q3kshuf<>+24(SB)/8, $0x0302030203020302
GLOBL q3kshuf<>(SB), RODATA|NOPTR, $32

#define XR0 (DI)
#define XR1 (DI)(R8*1)
#define XR2 (DI)(R8*2)
#define XR3 (DI)(R9*1)

// Unpack the 16 6-bit scales (ggml's kmask trick: low nibbles from bytes
// 0-7, their high bits from bytes 8-11) into Y12 as int16, minus 32, and
// load the hmask into Y14.
#define Q3K_SCALES \
	MOVL 96(SI), AX; \
	MOVL 100(SI), BX; \
	MOVL 104(SI), DX; \
	MOVL AX, R11; \
	ANDL $0x0f0f0f0f, R11; \
	MOVL DX, R12; \
	ANDL $0x03030303, R12; \
	SHLL $4, R12; \
	ORL R12, R11; \
	VMOVD R11, X12; \
	MOVL BX, R11; \
	ANDL $0x0f0f0f0f, R11; \
	MOVL DX, R12; \
	SHRL $2, R12; \
	ANDL $0x03030303, R12; \
	SHLL $4, R12; \
	ORL R12, R11; \
	VPINSRD $1, R11, X12, X12; \
	MOVL AX, R11; \
	SHRL $4, R11; \
	ANDL $0x0f0f0f0f, R11; \
	MOVL DX, R12; \
	SHRL $4, R12; \
	ANDL $0x03030303, R12; \
	SHLL $4, R12; \
	ORL R12, R11; \
	VPINSRD $2, R11, X12, X12; \
	MOVL BX, R11; \
	SHRL $4, R11; \
	ANDL $0x0f0f0f0f, R11; \
	SHRL $6, DX; \
	ANDL $0x03030303, DX; \
	SHLL $4, DX; \
	ORL DX, R11; \
	VPINSRD $3, R11, X12, X12; \
	VPMOVZXBW X12, Y12; \
	VPSUBW q3k32w<>(SB), Y12, Y12; \
	VMOVDQU 0(SI), Y14

// Chunk c = 4h+k: u into Y6, the scales into Y7. hop $hn moves hmask bit c
// to bit 2 (a 16-bit shift by at most 5 keeps it inside its byte).
#define Q3K_U(h, k, hop, hn) \
	VPSRLW $(2*k), Y13, Y6; \
	VPAND Y15, Y6, Y6; \
	hop $hn, Y14, Y5; \
	VPAND Y1, Y5, Y5; \
	VPOR Y5, Y6, Y6; \
	VPBROADCASTD q3kidx<>+(4*(4*h+k))(SB), Y0; \
	VPERMD Y12, Y0, Y7; \
	VPSHUFB q3kshuf<>(SB), Y7, Y7

#define Q3K_HALF(h) VMOVDQU (32+32*h)(SI), Y13

#define Q3K_ROW(h, k, XR, acc) \
	VPMADDUBSW (4+128*h+32*k)XR, Y6, Y4; \
	VPMADDWD Y7, Y4, Y4; \
	VPADDD Y4, acc, acc

// Row epilogue: Y12 = the 16 scales as int16, X2 = dw.
#define Q3K_EPI(XR, acc, accx, o) \
	VEXTRACTI128 $1, acc, X5; \
	VPADDD X5, accx, X5; \
	VPSHUFD $0x4e, X5, X6; \
	VPADDD X6, X5, X5; \
	VPSHUFD $0xb1, X5, X6; \
	VPADDD X6, X5, X5; \
	VPMADDWD 260 XR, Y12, Y6; \
	VEXTRACTI128 $1, Y6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0x4e, X6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0xb1, X6, X7; \
	VPADDD X7, X6, X6; \
	VPSLLD $2, X6, X6; \
	VPSUBD X6, X5, X5; \
	VCVTDQ2PS X5, X5; \
	VMOVSS 0 XR, X7; \
	VMULSS X7, X2, X3; \
	VMULSS X5, X3, X3; \
	VMOVSS o(R10), X5; \
	VADDSS X3, X5, X5; \
	VMOVSS X5, o(R10)

#define Q3K_DSCALE \
	MOVWLZX 108(SI), AX; \
	VMOVD AX, X2; \
	VCVTPH2PS X2, X2

#define Q3K_ROWS1(h, k) Q3K_ROW(h, k, XR0, Y8)
#define Q3K_ROWS4(h, k) Q3K_ROW(h, k, XR0, Y8); Q3K_ROW(h, k, XR1, Y9); Q3K_ROW(h, k, XR2, Y10); Q3K_ROW(h, k, XR3, Y11)

#define Q3K_SUPER(ROWS) \
	Q3K_SCALES; \
	Q3K_HALF(0); \
	Q3K_U(0, 0, VPSLLW, 2); ROWS(0, 0); \
	Q3K_U(0, 1, VPSLLW, 1); ROWS(0, 1); \
	Q3K_U(0, 2, VPSRLW, 0); ROWS(0, 2); \
	Q3K_U(0, 3, VPSRLW, 1); ROWS(0, 3); \
	Q3K_HALF(1); \
	Q3K_U(1, 0, VPSRLW, 2); ROWS(1, 0); \
	Q3K_U(1, 1, VPSRLW, 3); ROWS(1, 1); \
	Q3K_U(1, 2, VPSRLW, 4); ROWS(1, 2); \
	Q3K_U(1, 3, VPSRLW, 5); ROWS(1, 3)

// func dotQ3_KAVX2(nb int, w, x *byte, xstride int, out *float32)
TEXT ·dotQ3_KAVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ out+32(FP), R10
	MOVL $0, 0(R10)
	VMOVDQU q3k03<>(SB), Y15
	VMOVDQU q3k04<>(SB), Y1
	TESTQ CX, CX
	JEQ done
loop:
	VPXOR Y8, Y8, Y8
	Q3K_SUPER(Q3K_ROWS1)
	Q3K_DSCALE
	Q3K_EPI(XR0, Y8, X8, 0)
	ADDQ $110, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET

// func dotQ3_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
TEXT ·dotQ3_Kx4AVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	MOVQ out+32(FP), R10
	MOVQ $0, 0(R10)
	MOVQ $0, 8(R10)
	VMOVDQU q3k03<>(SB), Y15
	VMOVDQU q3k04<>(SB), Y1
	TESTQ CX, CX
	JEQ done
loop:
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9
	VPXOR Y10, Y10, Y10
	VPXOR Y11, Y11, Y11
	Q3K_SUPER(Q3K_ROWS4)
	Q3K_DSCALE
	Q3K_EPI(XR0, Y8, X8, 0)
	Q3K_EPI(XR1, Y9, X9, 4)
	Q3K_EPI(XR2, Y10, X10, 8)
	Q3K_EPI(XR3, Y11, X11, 12)
	ADDQ $110, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET
