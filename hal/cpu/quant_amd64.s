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
