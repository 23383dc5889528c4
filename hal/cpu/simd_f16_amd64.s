#include "textflag.h"

// F16 × F16. Products are exact in float32 (11-bit significands) and are
// summed in float64 over 16 fixed lanes: lane i takes elements i, i+16,
// i+32, … in order. The lanes are then folded in a fixed tree,
// ((L[0:4]+L[8:12]) + (L[4:8]+L[12:16])) → 4 → 2 → 1, the same in every
// kernel below. Elements past the last multiple of 16 are added by the Go
// wrapper, in order, after the fold.


// func dotF16AVX2(n16 int, w, x *byte) float64   (n16 = groups of 16)
TEXT ·dotF16AVX2(SB), NOSPLIT, $0-32
	MOVQ n16+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	TESTQ CX, CX
	JEQ fold
loop:
	VCVTPH2PS 0(SI), Y4
	VCVTPH2PS 0(DI), Y5
	VMULPS Y5, Y4, Y4
	VCVTPH2PS 16(SI), Y6
	VCVTPH2PS 16(DI), Y7
	VMULPS Y7, Y6, Y6
	VCVTPS2PD X4, Y8
	VEXTRACTF128 $1, Y4, X4
	VCVTPS2PD X4, Y9
	VCVTPS2PD X6, Y10
	VEXTRACTF128 $1, Y6, X6
	VCVTPS2PD X6, Y11
	VADDPD Y8, Y0, Y0
	VADDPD Y9, Y1, Y1
	VADDPD Y10, Y2, Y2
	VADDPD Y11, Y3, Y3
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNE loop
fold:
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	VADDPD Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPD X1, X0, X0
	VPERMILPD $1, X0, X1
	VADDSD X1, X0, X0
	VMOVSD X0, ret+24(FP)
	VZEROUPPER
	RET

#define F16_ROW(XR, lo, hi) \
	VCVTPH2PS XR, Z2; \
	VMULPS Z1, Z2, Z2; \
	VCVTPS2PD Y2, Z3; \
	VEXTRACTF64X4 $1, Z2, Y4; \
	VCVTPS2PD Y4, Z4; \
	VADDPD Z3, lo, lo; \
	VADDPD Z4, hi, hi

// Fold lanes lo (0-7) and hi (8-15) exactly as dotF16AVX2, store at o(R10).
#define F16_FOLDZ(lo, hi, o) \
	VADDPD hi, lo, lo; \
	VEXTRACTF64X4 $1, lo, Y5; \
	VMOVAPD lo, Z6; \
	VADDPD Y5, Y6, Y6; \
	VEXTRACTF128 $1, Y6, X5; \
	VADDPD X5, X6, X6; \
	VPERMILPD $1, X6, X5; \
	VADDSD X5, X6, X6; \
	VMOVSD X6, o(R10)

// func dotF16x4AVX512(n16 int, w, x *byte, xstride int, out *[4]float64)
TEXT ·dotF16x4AVX512(SB), NOSPLIT, $0-40
	MOVQ n16+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	MOVQ out+32(FP), R10
	VPXORQ Z16, Z16, Z16
	VPXORQ Z17, Z17, Z17
	VPXORQ Z18, Z18, Z18
	VPXORQ Z19, Z19, Z19
	VPXORQ Z20, Z20, Z20
	VPXORQ Z21, Z21, Z21
	VPXORQ Z22, Z22, Z22
	VPXORQ Z23, Z23, Z23
	TESTQ CX, CX
	JEQ fold
loop:
	VCVTPH2PS (SI), Z1
	F16_ROW((DI), Z16, Z17)
	F16_ROW((DI)(R8*1), Z18, Z19)
	F16_ROW((DI)(R8*2), Z20, Z21)
	F16_ROW((DI)(R9*1), Z22, Z23)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNE loop
fold:
	F16_FOLDZ(Z16, Z17, 0)
	F16_FOLDZ(Z18, Z19, 8)
	F16_FOLDZ(Z20, Z21, 16)
	F16_FOLDZ(Z22, Z23, 24)
	VZEROUPPER
	RET
