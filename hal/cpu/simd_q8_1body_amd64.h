// Kernel bodies for weights with a scale d and a min m against Q8_1
// activations (36 bytes: d f16, s f16 = d·Σq, 32 int8 quants), AVX2; the
// including file defines LOADW(off, dst) (the 32 unsigned quants of the
// weight block at off(SI), at most 31 each, into dst), WS (weight block
// bytes, d and m as FP16 at 0 and 2) and the TEXT names NAME_1, NAME_4,
// and the byte constants q4c0f<> and q4c10<>.
//
// Per block the integer dot s = Σq_w·q_x is exact: VPMADDUBSW pairs
// (unsigned weights ≤ 31, signed activations) cannot saturate int16, and
// VPMADDWD with ones (Y15) widens to int32 lanes. Then, as the pure-Go
// dotQ4_1/dotQ5_1: dd = dw*dx, A = dd*float32(s), B = mw*sx, sum += A+B,
// block after block, no FMA. dw*dx and mw*sx come from one VMULPS of the
// (d, m) pairs by the (d, s) pairs.
//
// Registers: Y15 words of 1, Y14 all ones, Y13 bytes 0x0F, Y12 bytes
// 0x10, Y10/Y11 LOADW's scratch, X0 the sum(s).

#define Q81_CONSTS \
	VPCMPEQW Y15, Y15, Y15; \
	VPSRLW $15, Y15, Y15; \
	VPCMPEQB Y14, Y14, Y14; \
	VMOVDQU q4c0f<>(SB), Y13; \
	VMOVDQU q4c10<>(SB), Y12

// X8/Y8 holds (dw, mw) pairs, X9/Y9 the (dx, sx) pairs, X4 the four
// float32 sums s: X4 = [dd·s + B] per lane. Clobbers X8..X11.
#define Q81_SCALE \
	VCVTPH2PS X8, Y8; \
	VCVTPH2PS X9, Y9; \
	VMULPS Y9, Y8, Y8; \
	VEXTRACTF128 $1, Y8, X9; \
	VSHUFPS $0x88, X9, X8, X10; \
	VSHUFPS $0xdd, X9, X8, X11; \
	VMULPS X10, X4, X4; \
	VADDPS X11, X4, X4

// func(nb int, w, x *byte) float32
TEXT NAME_1, NOSPLIT, $0-28
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	VXORPS X0, X0, X0
	Q81_CONSTS
q81_1_loop4:
	CMPQ CX, $4
	JLT q81_1_tail
	LOADW(0, Y1)
	VPMADDUBSW 4(DI), Y1, Y4
	VPMADDWD Y15, Y4, Y4
	LOADW(WS, Y1)
	VPMADDUBSW 40(DI), Y1, Y5
	VPMADDWD Y15, Y5, Y5
	LOADW(2*WS, Y1)
	VPMADDUBSW 76(DI), Y1, Y6
	VPMADDWD Y15, Y6, Y6
	LOADW(3*WS, Y1)
	VPMADDUBSW 112(DI), Y1, Y7
	VPMADDWD Y15, Y7, Y7
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	VMOVD 0(SI), X8
	VPINSRD $1, (1*WS)(SI), X8, X8
	VPINSRD $2, (2*WS)(SI), X8, X8
	VPINSRD $3, (3*WS)(SI), X8, X8
	VMOVD 0(DI), X9
	VPINSRD $1, 36(DI), X9, X9
	VPINSRD $2, 72(DI), X9, X9
	VPINSRD $3, 108(DI), X9, X9
	Q81_SCALE
	VADDSS X4, X0, X0
	VMOVSHDUP X4, X5
	VADDSS X5, X0, X0
	VMOVHLPS X4, X4, X5
	VADDSS X5, X0, X0
	VPSHUFD $0xff, X4, X5
	VADDSS X5, X0, X0
	ADDQ $(4*WS), SI
	ADDQ $144, DI
	SUBQ $4, CX
	JMP q81_1_loop4
q81_1_tail:
	TESTQ CX, CX
	JEQ q81_1_done
	LOADW(0, Y1)
	VPMADDUBSW 4(DI), Y1, Y4
	VPMADDWD Y15, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VPSHUFD $0x4e, X4, X5
	VPADDD X5, X4, X4
	VPSHUFD $0xb1, X4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	VMOVD 0(SI), X8
	VCVTPH2PS X8, X8
	VMOVD 0(DI), X9
	VCVTPH2PS X9, X9
	VMULPS X9, X8, X8
	VMOVSHDUP X8, X11
	VMULSS X8, X4, X4
	VADDSS X11, X4, X4
	VADDSS X4, X0, X0
	ADDQ $WS, SI
	ADDQ $36, DI
	DECQ CX
	JMP q81_1_tail
q81_1_done:
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func(nb int, w, x *byte, xstride int, out *[4]float32)
// Rows x, x+xstride, x+2*xstride, x+3*xstride; each gets exactly the
// operations of NAME_1.
TEXT NAME_4, NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	VXORPS X0, X0, X0
	Q81_CONSTS
	TESTQ CX, CX
	JEQ q81_4_done
q81_4_loop:
	LOADW(0, Y1)
	VPMADDUBSW 4(DI), Y1, Y4
	VPMADDWD Y15, Y4, Y4
	VPMADDUBSW 4(DI)(R8*1), Y1, Y5
	VPMADDWD Y15, Y5, Y5
	VPMADDUBSW 4(DI)(R8*2), Y1, Y6
	VPMADDWD Y15, Y6, Y6
	VPMADDUBSW 4(DI)(R9*1), Y1, Y7
	VPMADDWD Y15, Y7, Y7
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	VPBROADCASTD 0(SI), X8
	VMOVD 0(DI), X9
	VPINSRD $1, (DI)(R8*1), X9, X9
	VPINSRD $2, (DI)(R8*2), X9, X9
	VPINSRD $3, (DI)(R9*1), X9, X9
	Q81_SCALE
	VADDPS X4, X0, X0
	ADDQ $WS, SI
	ADDQ $36, DI
	DECQ CX
	JNE q81_4_loop
q81_4_done:
	MOVQ out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

#undef Q81_CONSTS
#undef Q81_SCALE
