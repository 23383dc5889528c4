#include "textflag.h"

// func quantizeQ8_0AVX512(src *float32, dst *byte, nb int, d *float32) int
// Quantizes nb blocks of 32 floats as quantizeQ8Block does (amax, d =
// amax/127, id = 127/amax, round half to even, saturate), writing the 32
// quants of block i at dst + 34i + 2 and its unrounded scale at d[i]. It
// stops before the first block holding a NaN or an infinity, or whose
// 127/amax overflows, and returns
// the number of blocks done.
TEXT ·quantizeQ8_0AVX512(SB), NOSPLIT, $0-40
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ nb+16(FP), CX
	MOVQ d+24(FP), R8
	XORQ DX, DX
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z31
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z30
	MOVL $0x42fe0000, AX // 127.0
	VMOVD AX, X29
	VXORPS X28, X28, X28
	TESTQ CX, CX
	JEQ q8q_done
q8q_loop:
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VANDPS Z31, Z0, Z2
	VANDPS Z31, Z1, Z3
	VCMPPS $0x11, Z30, Z2, K1 // |v| < +Inf, false for NaN
	VCMPPS $0x11, Z30, Z3, K2
	KANDW K1, K2, K1
	KORTESTW K1, K1
	JCC q8q_done
	VMAXPS Z3, Z2, Z2
	VEXTRACTF64X4 $1, Z2, Y3
	VMAXPS Y3, Y2, Y2
	VEXTRACTF128 $1, Y2, X3
	VMAXPS X3, X2, X2
	VPERMILPS $0x4e, X2, X3
	VMAXPS X3, X2, X2
	VPERMILPS $0xb1, X2, X3
	VMAXPS X3, X2, X2
	VDIVSS X29, X2, X4 // d = amax/127
	VMOVSS X4, (R8)
	VXORPS X5, X5, X5
	VUCOMISS X28, X2
	JEQ q8q_zero
	VDIVSS X2, X29, X5 // id = 127/amax
	VUCOMISS X30, X5
	JEQ q8q_done // id overflowed (tiny amax): 0·Inf cases, left to Go
q8q_zero:
	VBROADCASTSS X5, Z5
	VMULPS Z5, Z0, Z0
	VMULPS Z5, Z1, Z1
	VCVTPS2DQ Z0, Z0
	VCVTPS2DQ Z1, Z1
	VPMOVSDB Z0, X0
	VPMOVSDB Z1, X1
	VMOVDQU X0, 2(DI)
	VMOVDQU X1, 18(DI)
	ADDQ $128, SI
	ADDQ $34, DI
	ADDQ $4, R8
	INCQ DX
	CMPQ DX, CX
	JLT q8q_loop
q8q_done:
	MOVQ DX, ret+32(FP)
	VZEROUPPER
	RET

// func f32ToF16AVX512(src *float32, dst *byte, n int) int
// Converts 16 floats at a time with VCVTPS2PH (round to nearest even, as
// FP32ToFP16), stopping before a chunk holding a NaN (whose payload
// FP32ToFP16 canonicalises); returns the count done.
TEXT ·f32ToF16AVX512(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	XORQ DX, DX
	TESTQ CX, CX
	JEQ f16c_done
f16c_loop:
	VMOVUPS (SI)(DX*4), Z0
	VCMPPS $3, Z0, Z0, K1 // unordered: NaN
	KORTESTW K1, K1
	JNE f16c_done
	VCVTPS2PH $0, Z0, Y1
	VMOVDQU Y1, (DI)(DX*2)
	ADDQ $16, DX
	DECQ CX
	JNE f16c_loop
f16c_done:
	MOVQ DX, ret+24(FP)
	VZEROUPPER
	RET

// Dword order that turns VPACKSSWB's lane-interleaved bytes (128-bit lane l
// holds 4 quants of each of 4 groups) back into 4 runs of 16: a 4×4 transpose.
DATA q8kperm<>+0(SB)/4, $0
DATA q8kperm<>+4(SB)/4, $4
DATA q8kperm<>+8(SB)/4, $8
DATA q8kperm<>+12(SB)/4, $12
DATA q8kperm<>+16(SB)/4, $1
DATA q8kperm<>+20(SB)/4, $5
DATA q8kperm<>+24(SB)/4, $9
DATA q8kperm<>+28(SB)/4, $13
DATA q8kperm<>+32(SB)/4, $2
DATA q8kperm<>+36(SB)/4, $6
DATA q8kperm<>+40(SB)/4, $10
DATA q8kperm<>+44(SB)/4, $14
DATA q8kperm<>+48(SB)/4, $3
DATA q8kperm<>+52(SB)/4, $7
DATA q8kperm<>+56(SB)/4, $11
DATA q8kperm<>+60(SB)/4, $15
GLOBL q8kperm<>(SB), RODATA|NOPTR, $64

// func quantizeQ8_KAVX512(src *float32, dst *byte, nb int) int
// Quantizes nb blocks of 256 floats to Q8_K (292 bytes each) as
// quantizeQ8_KBlock does, and returns the number of blocks done. It stops
// before the first block holding a NaN or an infinity, or whose -127/m
// overflows (|m| below about 3.7e-37); Go does those.
//
// The signed value of largest magnitude comes from two integer reductions
// of the raw bits: the signed max is the largest positive value (if any),
// the unsigned max the negative value of largest magnitude (if any); NaN
// and Inf compare above every finite value in both, so one test finds
// them. Only when both signs reach the largest magnitude is the block
// scanned for the first such value.
//
// The cap at 127 of the reference is never reached: |iscale| ≤
// (127/|m|)(1+2⁻²⁴) and |v| ≤ |m|, so |iscale·v| rounds to at most 127;
// VCVTPS2DQ rounds half to even as nearestInt does in that range.
TEXT ·quantizeQ8_KAVX512(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ nb+16(FP), CX
	XORQ DX, DX
	XORL R9, R9
	MOVL $0x00010001, AX
	VPBROADCASTD AX, Z29 // int16 ones
	VMOVDQU32 q8kperm<>(SB), Z30
	MOVL $0xc2fe0000, AX // -127.0
	VMOVD AX, X31
	MOVL $0x3f800000, AX // 1.0
	VMOVD AX, X28
	TESTQ CX, CX
	JEQ q8k_done

q8k_loop:
	VMOVDQU32 0(SI), Z0
	VMOVDQU32 64(SI), Z1
	VMOVDQU32 128(SI), Z2
	VMOVDQU32 192(SI), Z3
	VMOVDQU32 256(SI), Z4
	VMOVDQU32 320(SI), Z5
	VMOVDQU32 384(SI), Z6
	VMOVDQU32 448(SI), Z7
	VMOVDQU32 512(SI), Z8
	VMOVDQU32 576(SI), Z9
	VMOVDQU32 640(SI), Z10
	VMOVDQU32 704(SI), Z11
	VMOVDQU32 768(SI), Z12
	VMOVDQU32 832(SI), Z13
	VMOVDQU32 896(SI), Z14
	VMOVDQU32 960(SI), Z15

	// Signed max of the bits: the largest positive value.
	VPMAXSD Z1, Z0, Z16
	VPMAXSD Z3, Z2, Z17
	VPMAXSD Z5, Z4, Z18
	VPMAXSD Z7, Z6, Z19
	VPMAXSD Z9, Z8, Z20
	VPMAXSD Z11, Z10, Z21
	VPMAXSD Z13, Z12, Z22
	VPMAXSD Z15, Z14, Z23
	VPMAXSD Z17, Z16, Z16
	VPMAXSD Z19, Z18, Z18
	VPMAXSD Z21, Z20, Z20
	VPMAXSD Z23, Z22, Z22
	VPMAXSD Z18, Z16, Z16
	VPMAXSD Z22, Z20, Z20
	VPMAXSD Z20, Z16, Z16
	// Unsigned max: the negative value of largest magnitude.
	VPMAXUD Z1, Z0, Z20
	VPMAXUD Z3, Z2, Z21
	VPMAXUD Z5, Z4, Z22
	VPMAXUD Z7, Z6, Z23
	VPMAXUD Z9, Z8, Z24
	VPMAXUD Z11, Z10, Z25
	VPMAXUD Z13, Z12, Z26
	VPMAXUD Z15, Z14, Z27
	VPMAXUD Z21, Z20, Z20
	VPMAXUD Z23, Z22, Z22
	VPMAXUD Z25, Z24, Z24
	VPMAXUD Z27, Z26, Z26
	VPMAXUD Z22, Z20, Z20
	VPMAXUD Z26, Z24, Z24
	VPMAXUD Z24, Z20, Z20

	VEXTRACTI64X4 $1, Z16, Y17
	VEXTRACTI64X4 $1, Z20, Y21
	VPMAXSD Y17, Y16, Y16
	VPMAXUD Y21, Y20, Y20
	VEXTRACTI32X4 $1, Y16, X17
	VEXTRACTI32X4 $1, Y20, X21
	VPMAXSD X17, X16, X16
	VPMAXUD X21, X20, X20
	VPSHUFD $0x4e, X16, X17
	VPSHUFD $0x4e, X20, X21
	VPMAXSD X17, X16, X16
	VPMAXUD X21, X20, X20
	VPSHUFD $0xb1, X16, X17
	VPSHUFD $0xb1, X20, X21
	VPMAXSD X17, X16, X16
	VPMAXUD X21, X20, X20
	VMOVD X16, AX
	VMOVD X20, BX

	// AX = |largest positive| or 0, R10 = |most negative| or 0.
	TESTL AX, AX
	CMOVLLT R9, AX
	MOVL BX, R10
	ANDL $0x7fffffff, R10
	TESTL BX, BX
	CMOVLGE R9, R10
	MOVL AX, R11
	CMPL R10, AX
	CMOVLHI R10, R11 // R11 = amax bits
	CMPL R11, $0x7f800000
	JCC q8k_done // NaN or ±Inf in the block
	TESTL R11, R11
	JEQ q8k_zero
	CMPL AX, R10
	JEQ q8k_tie // +amax and -amax both present
	MOVL R11, R12
	ORL $0x80000000, R12
	CMPL AX, R11
	CMOVLNE R12, R11 // R11 = m bits

q8k_scale:
	VMOVD R11, X16
	VDIVSS X16, X31, X17 // iscale = -127/m
	VMOVD X17, R12
	ANDL $0x7fffffff, R12
	CMPL R12, $0x7f800000
	JEQ q8k_done // iscale overflowed
	VDIVSS X17, X28, X18 // d = 1/iscale
	VMOVSS X18, (DI)
	VBROADCASTSS X17, Z16

	VMULPS Z16, Z0, Z0
	VMULPS Z16, Z1, Z1
	VMULPS Z16, Z2, Z2
	VMULPS Z16, Z3, Z3
	VMULPS Z16, Z4, Z4
	VMULPS Z16, Z5, Z5
	VMULPS Z16, Z6, Z6
	VMULPS Z16, Z7, Z7
	VMULPS Z16, Z8, Z8
	VMULPS Z16, Z9, Z9
	VMULPS Z16, Z10, Z10
	VMULPS Z16, Z11, Z11
	VMULPS Z16, Z12, Z12
	VMULPS Z16, Z13, Z13
	VMULPS Z16, Z14, Z14
	VMULPS Z16, Z15, Z15
	VCVTPS2DQ Z0, Z0
	VCVTPS2DQ Z1, Z1
	VCVTPS2DQ Z2, Z2
	VCVTPS2DQ Z3, Z3
	VCVTPS2DQ Z4, Z4
	VCVTPS2DQ Z5, Z5
	VCVTPS2DQ Z6, Z6
	VCVTPS2DQ Z7, Z7
	VCVTPS2DQ Z8, Z8
	VCVTPS2DQ Z9, Z9
	VCVTPS2DQ Z10, Z10
	VCVTPS2DQ Z11, Z11
	VCVTPS2DQ Z12, Z12
	VCVTPS2DQ Z13, Z13
	VCVTPS2DQ Z14, Z14
	VCVTPS2DQ Z15, Z15

	// Words: Z(2k) lane l = [group 2k lane l, group 2k+1 lane l].
	VPACKSSDW Z1, Z0, Z0
	VPACKSSDW Z3, Z2, Z2
	VPACKSSDW Z5, Z4, Z4
	VPACKSSDW Z7, Z6, Z6
	VPACKSSDW Z9, Z8, Z8
	VPACKSSDW Z11, Z10, Z10
	VPACKSSDW Z13, Z12, Z12
	VPACKSSDW Z15, Z14, Z14
	// Bytes: lane l = 4 quants of each of groups 4j..4j+3; VPERMD puts
	// each group's 16 together.
	VPACKSSWB Z2, Z0, Z17
	VPACKSSWB Z6, Z4, Z18
	VPACKSSWB Z10, Z8, Z19
	VPACKSSWB Z14, Z12, Z20
	VPERMD Z17, Z30, Z17
	VPERMD Z18, Z30, Z18
	VPERMD Z19, Z30, Z19
	VPERMD Z20, Z30, Z20
	VMOVDQU32 Z17, 4(DI)
	VMOVDQU32 Z18, 68(DI)
	VMOVDQU32 Z19, 132(DI)
	VMOVDQU32 Z20, 196(DI)

	// Sums: pairs of words, then (after packing) pairs again, leave
	// Z(4m) lane l elem s = lane-l sum of group 4m+s.
	VPMADDWD Z29, Z0, Z0
	VPMADDWD Z29, Z2, Z2
	VPMADDWD Z29, Z4, Z4
	VPMADDWD Z29, Z6, Z6
	VPMADDWD Z29, Z8, Z8
	VPMADDWD Z29, Z10, Z10
	VPMADDWD Z29, Z12, Z12
	VPMADDWD Z29, Z14, Z14
	VPACKSSDW Z2, Z0, Z0
	VPACKSSDW Z6, Z4, Z4
	VPACKSSDW Z10, Z8, Z8
	VPACKSSDW Z14, Z12, Z12
	VPMADDWD Z29, Z0, Z0
	VPMADDWD Z29, Z4, Z4
	VPMADDWD Z29, Z8, Z8
	VPMADDWD Z29, Z12, Z12
	// Add the four lanes of each: Z1 = [Z0 lanes 0+2, 1+3, Z4 lanes 0+2, 1+3].
	VSHUFI32X4 $0x44, Z4, Z0, Z1
	VSHUFI32X4 $0xee, Z4, Z0, Z2
	VPADDD Z2, Z1, Z1
	VSHUFI32X4 $0x44, Z12, Z8, Z3
	VSHUFI32X4 $0xee, Z12, Z8, Z5
	VPADDD Z5, Z3, Z3
	VSHUFI32X4 $0x88, Z3, Z1, Z5
	VSHUFI32X4 $0xdd, Z3, Z1, Z6
	VPADDD Z6, Z5, Z5
	VPMOVDW Z5, Y5
	VMOVDQU Y5, 260(DI)

q8k_next:
	ADDQ $1024, SI
	ADDQ $292, DI
	INCQ DX
	CMPQ DX, CX
	JLT q8k_loop

q8k_done:
	MOVQ DX, ret+24(FP)
	VZEROUPPER
	RET

q8k_zero:
	VPXORD Z17, Z17, Z17
	VMOVDQU32 Z17, 0(DI)
	VMOVDQU32 Z17, 64(DI)
	VMOVDQU32 Z17, 128(DI)
	VMOVDQU32 Z17, 192(DI)
	VMOVDQU32 Z17, 228(DI)
	JMP q8k_next

	// Both signs reach amax: the first value with |v| == amax decides.
q8k_tie:
	VPBROADCASTD R11, Z17
	MOVL $0x7fffffff, R12
	VPBROADCASTD R12, Z18
	MOVQ SI, R13
q8k_tieloop:
	VPANDD (R13), Z18, Z19
	VPCMPEQD Z17, Z19, K1
	KMOVW K1, R12
	TESTL R12, R12
	JNE q8k_tiefound
	ADDQ $64, R13
	JMP q8k_tieloop // ends: some value has |v| == amax
q8k_tiefound:
	BSFL R12, R12
	MOVL (R13)(R12*4), R11
	JMP q8k_scale
