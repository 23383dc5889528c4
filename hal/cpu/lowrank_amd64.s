#include "textflag.h"

// The low-rank (LoRA) update's kernels, bit-equal to dotLanes16Ref and axpyRef: float32
// products rounded before each addition (VMULPS then VADDPS, no FMA).

// func dotLanes16AVX2(a, x *float32, n16 int) float32
// Y0 holds lanes 0-7 and Y1 lanes 8-15 of the 16 float32 sums; the fold adds lane l and
// l+8, then l and l+4, l and l+2, l and l+1, as the reference does.
TEXT ·dotLanes16AVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n16+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
dotloop:
	VMOVUPS 0(SI), Y2
	VMULPS 0(DI), Y2, Y2
	VADDPS Y2, Y0, Y0
	VMOVUPS 32(SI), Y3
	VMULPS 32(DI), Y3, Y3
	VADDPS Y3, Y1, Y1
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNE dotloop
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVHLPS X0, X0, X1
	VADDPS X1, X0, X0
	VMOVSHDUP X0, X1
	VADDSS X1, X0, X0
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func axpyAVX2(dst, src *float32, s float32, n8 int)
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	VBROADCASTSS s+16(FP), Y0
	MOVQ n8+24(FP), CX
axpyloop:
	VMULPS 0(SI), Y0, Y1
	VADDPS 0(DI), Y1, Y1
	VMOVUPS Y1, 0(DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNE axpyloop
	VZEROUPPER
	RET
