#include "textflag.h"

// Q2_K × Q8_K, AVX2. Same bits as the pure-Go dotQ2_K: per super-block the
// integer sums isum = Σ sc_g·Σ q·y (q the 2-bit unsigned quant, sc_g the
// low nibble of scales[g]) and mins = Σ m_g·bsum_g (m_g the high nibble)
// are exact, then, with dall = yd*d and dmin = yd*dmin,
// sum += float32(dall*float32(isum)) - float32(dmin*float32(mins)):
// the difference is rounded first and then added, as the twin writes it
// (not Q4_K's add-then-subtract), without FMA.
//
// Layout: scales[16] at 0, qs[64] at 16, d f16 at 80, dmin f16 at 82.
// In half h, the 32 bytes qs[32h..32h+31] hold bits 2k..2k+1 of element
// 128h+32k+l in byte l; the low 16 bytes of such a 32-element run are
// sub-block g = 8h+2k and the high 16 are g+1, so one VPMADDUBSW gives
// sub-block g in the low 128-bit lane and g+1 in the high one.
//
// Lanes: a VPMADDUBSW pair is at most 2·3·128 = 768 (no int16
// saturation); times a scale ≤ 15 and summed in pairs by VPMADDWD, an
// int32 lane gains at most 15·1536 = 23040 per step, 8 steps a super-block
// (184320); mins: |bsum| ≤ 2048 (as int16 any value ≤ 32768), pairs of
// bsum·m ≤ 2·32768·15 in int32. The block's totals fit int32 like the
// twin's.
//
// Registers: SI weights, DI activation row 0, R8 row stride, R9 3*stride,
// R10 out, CX super-blocks left. Y15 0x03 bytes, Y14 the 16 scales as
// bytes (low lane: sub-blocks 0,2,..,14 twice; high lane: 1,3,..,15
// twice), Y13 the 16 mins as int16, Y7 the qs bytes of the current half,
// Y1 the quants of one step, Y3 its two scales as int16 (low lane g, high
// lane g+1), Y8..Y11 row accumulators.

DATA q2k03<>+0(SB)/8, $0x0303030303030303
DATA q2k03<>+8(SB)/8, $0x0303030303030303
DATA q2k03<>+16(SB)/8, $0x0303030303030303
DATA q2k03<>+24(SB)/8, $0x0303030303030303
GLOBL q2k03<>(SB), RODATA|NOPTR, $32

DATA q2k0f<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q2k0f<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL q2k0f<>(SB), RODATA|NOPTR, $16

// Even bytes to the low 8, odd bytes to the high 8.
DATA q2kdeint<>+0(SB)/8, $0x0e0c0a0806040200
DATA q2kdeint<>+8(SB)/8, $0x0f0d0b0907050301
GLOBL q2kdeint<>(SB), RODATA|NOPTR, $16

// q2ksel + 32p (p = 4h+k): VPSHUFB control picking byte p of each lane of Y14,
// zero-extended to 16 words (0x80 zeroes the high byte).
DATA q2ksel<>+0(SB)/8, $0x8000800080008000
DATA q2ksel<>+8(SB)/8, $0x8000800080008000
DATA q2ksel<>+16(SB)/8, $0x8000800080008000
DATA q2ksel<>+24(SB)/8, $0x8000800080008000
DATA q2ksel<>+32(SB)/8, $0x8001800180018001
DATA q2ksel<>+40(SB)/8, $0x8001800180018001
DATA q2ksel<>+48(SB)/8, $0x8001800180018001
DATA q2ksel<>+56(SB)/8, $0x8001800180018001
DATA q2ksel<>+64(SB)/8, $0x8002800280028002
DATA q2ksel<>+72(SB)/8, $0x8002800280028002
DATA q2ksel<>+80(SB)/8, $0x8002800280028002
DATA q2ksel<>+88(SB)/8, $0x8002800280028002
DATA q2ksel<>+96(SB)/8, $0x8003800380038003
DATA q2ksel<>+104(SB)/8, $0x8003800380038003
DATA q2ksel<>+112(SB)/8, $0x8003800380038003
DATA q2ksel<>+120(SB)/8, $0x8003800380038003
DATA q2ksel<>+128(SB)/8, $0x8004800480048004
DATA q2ksel<>+136(SB)/8, $0x8004800480048004
DATA q2ksel<>+144(SB)/8, $0x8004800480048004
DATA q2ksel<>+152(SB)/8, $0x8004800480048004
DATA q2ksel<>+160(SB)/8, $0x8005800580058005
DATA q2ksel<>+168(SB)/8, $0x8005800580058005
DATA q2ksel<>+176(SB)/8, $0x8005800580058005
DATA q2ksel<>+184(SB)/8, $0x8005800580058005
DATA q2ksel<>+192(SB)/8, $0x8006800680068006
DATA q2ksel<>+200(SB)/8, $0x8006800680068006
DATA q2ksel<>+208(SB)/8, $0x8006800680068006
DATA q2ksel<>+216(SB)/8, $0x8006800680068006
DATA q2ksel<>+224(SB)/8, $0x8007800780078007
DATA q2ksel<>+232(SB)/8, $0x8007800780078007
DATA q2ksel<>+240(SB)/8, $0x8007800780078007
DATA q2ksel<>+248(SB)/8, $0x8007800780078007
GLOBL q2ksel<>(SB), RODATA|NOPTR, $256

#define XR0 (DI)
#define XR1 (DI)(R8*1)
#define XR2 (DI)(R8*2)
#define XR3 (DI)(R9*1)

// Scales (low nibbles) into Y14 as laid out above; mins (high nibbles)
// into Y13 as int16.
#define Q2K_SCALES \
	VMOVDQU 0(SI), X0; \
	VPAND q2k0f<>(SB), X0, X1; \
	VPSHUFB q2kdeint<>(SB), X1, X1; \
	VPERMQ $0x50, Y1, Y14; \
	VPSRLW $4, X0, X2; \
	VPAND q2k0f<>(SB), X2, X2; \
	VPMOVZXBW X2, Y13

// Step k of half h (the qs bytes already in Y7): quants into Y1, the
// scales of sub-blocks 8h+2k and 8h+2k+1 into Y3.
#define Q2K_STEP(k, sel) \
	VPSRLW $(2*k), Y7, Y1; \
	VPAND Y15, Y1, Y1; \
	VPSHUFB q2ksel<>+sel(SB), Y14, Y3

#define Q2K_ROW(h, k, XR, acc) \
	VPMADDUBSW (4+128*h+32*k)XR, Y1, Y5; \
	VPMADDWD Y3, Y5, Y5; \
	VPADDD Y5, acc, acc

// Row epilogue: X1 = d, X2 = dmin (float32), out element at o(R10).
#define Q2K_EPI(XR, acc, accx, o) \
	VEXTRACTI128 $1, acc, X5; \
	VPADDD X5, accx, X5; \
	VPSHUFD $0x4e, X5, X6; \
	VPADDD X6, X5, X5; \
	VPSHUFD $0xb1, X5, X6; \
	VPADDD X6, X5, X5; \
	VPMADDWD 260 XR, Y13, Y6; \
	VEXTRACTI128 $1, Y6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0x4e, X6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0xb1, X6, X7; \
	VPADDD X7, X6, X6; \
	VCVTDQ2PS X5, X5; \
	VCVTDQ2PS X6, X6; \
	VMOVSS 0 XR, X7; \
	VMULSS X7, X1, X3; \
	VMULSS X7, X2, X4; \
	VMULSS X5, X3, X3; \
	VMULSS X6, X4, X4; \
	VSUBSS X4, X3, X3; \
	VMOVSS o(R10), X5; \
	VADDSS X3, X5, X5; \
	VMOVSS X5, o(R10)

#define Q2K_DSCALES \
	MOVWLZX 80(SI), AX; \
	VMOVD AX, X1; \
	VCVTPH2PS X1, X1; \
	MOVWLZX 82(SI), AX; \
	VMOVD AX, X2; \
	VCVTPH2PS X2, X2

#define Q2K_STEP1(h, k, sel) \
	Q2K_STEP(k, sel); \
	Q2K_ROW(h, k, XR0, Y8)

#define Q2K_STEP4(h, k, sel) \
	Q2K_STEP(k, sel); \
	Q2K_ROW(h, k, XR0, Y8); \
	Q2K_ROW(h, k, XR1, Y9); \
	Q2K_ROW(h, k, XR2, Y10); \
	Q2K_ROW(h, k, XR3, Y11)

// func dotQ2_KAVX2(nb int, w, x *byte, xstride int, out *float32)
TEXT ·dotQ2_KAVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ out+32(FP), R10
	MOVL $0, 0(R10)
	VMOVDQU q2k03<>(SB), Y15
	TESTQ CX, CX
	JEQ done
loop:
	Q2K_SCALES
	VPXOR Y8, Y8, Y8
	VMOVDQU 16(SI), Y7
	Q2K_STEP1(0, 0, 0)
	Q2K_STEP1(0, 1, 32)
	Q2K_STEP1(0, 2, 64)
	Q2K_STEP1(0, 3, 96)
	VMOVDQU 48(SI), Y7
	Q2K_STEP1(1, 0, 128)
	Q2K_STEP1(1, 1, 160)
	Q2K_STEP1(1, 2, 192)
	Q2K_STEP1(1, 3, 224)
	Q2K_DSCALES
	Q2K_EPI(XR0, Y8, X8, 0)
	ADDQ $84, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET

// func dotQ2_Kx4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
TEXT ·dotQ2_Kx4AVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	MOVQ out+32(FP), R10
	MOVQ $0, 0(R10)
	MOVQ $0, 8(R10)
	VMOVDQU q2k03<>(SB), Y15
	TESTQ CX, CX
	JEQ done
loop:
	Q2K_SCALES
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9
	VPXOR Y10, Y10, Y10
	VPXOR Y11, Y11, Y11
	VMOVDQU 16(SI), Y7
	Q2K_STEP4(0, 0, 0)
	Q2K_STEP4(0, 1, 32)
	Q2K_STEP4(0, 2, 64)
	Q2K_STEP4(0, 3, 96)
	VMOVDQU 48(SI), Y7
	Q2K_STEP4(1, 0, 128)
	Q2K_STEP4(1, 1, 160)
	Q2K_STEP4(1, 2, 192)
	Q2K_STEP4(1, 3, 224)
	Q2K_DSCALES
	Q2K_EPI(XR0, Y8, X8, 0)
	Q2K_EPI(XR1, Y9, X9, 4)
	Q2K_EPI(XR2, Y10, X10, 8)
	Q2K_EPI(XR3, Y11, X11, 12)
	ADDQ $84, SI
	ADDQ $292, DI
	DECQ CX
	JNE loop
done:
	VZEROUPPER
	RET
