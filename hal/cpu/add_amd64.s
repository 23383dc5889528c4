#include "textflag.h"

// func addF32AVX512(dst, src *float32, n int) int
// dst[i] += src[i] for the first n&^15 elements; returns how many it did.
// Float addition is commutative bit for bit, so this is the scalar loop's
// result.
TEXT ·addF32AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	MOVQ CX, AX
	SHLQ $4, AX
	TESTQ CX, CX
	JEQ add_done
add_loop:
	VMOVUPS (DI), Z0
	VADDPS (SI), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	DECQ CX
	JNE add_loop
add_done:
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET
