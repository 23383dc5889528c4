// Kernel bodies shared by the AVX2 and the AVX-512 VNNI builds; the
// including file defines DOT(aw, sx, dst) (dst = int32 lane sums of
// aw·sx over groups of 4 bytes, aw unsigned, sx signed) and the TEXT names.
// Lane i of dst is the exact sum of bytes 4i..4i+3, whichever DOT is used,
// so both builds give identical bits.

// Weight blocks of WS bytes start with an FP16 scale; LOADW(off, dst) loads
// the 32 signed quants of the block at off(SI) into dst. Activations are
// Q8_0 (34 bytes). Per block the integer dot s is exact; then, as the
// pure-Go dotQ8_0/dotQ5_0: d = dw*dx, p = float32(s)*d, sum += p, block
// after block (no FMA).

// func(nb int, w, x *byte) float32
TEXT NAME_1, NOSPLIT, $0-28
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	VXORPS X0, X0, X0
	VPCMPEQW Y15, Y15, Y15
	VPSRLW $15, Y15, Y15
	VPCMPEQB Y14, Y14, Y14
q8_0_1_loop4:
	CMPQ CX, $4
	JLT q8_0_1_tail
	LOADW(0, Y1)
	VPABSB Y1, Y2
	VMOVDQU 2(DI), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y4)
	LOADW(WS, Y1)
	VPABSB Y1, Y2
	VMOVDQU 36(DI), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y5)
	LOADW(2*WS, Y1)
	VPABSB Y1, Y2
	VMOVDQU 70(DI), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y6)
	LOADW(3*WS, Y1)
	VPABSB Y1, Y2
	VMOVDQU 104(DI), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y7)
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	MOVWLZX 0(SI), AX
	VMOVD AX, X8
	VPINSRW $1, (1*WS)(SI), X8, X8
	VPINSRW $2, (2*WS)(SI), X8, X8
	VPINSRW $3, (3*WS)(SI), X8, X8
	VCVTPH2PS X8, X8
	MOVWLZX 0(DI), AX
	VMOVD AX, X9
	VPINSRW $1, 34(DI), X9, X9
	VPINSRW $2, 68(DI), X9, X9
	VPINSRW $3, 102(DI), X9, X9
	VCVTPH2PS X9, X9
	VMULPS X9, X8, X8
	VMULPS X8, X4, X4
	VADDSS X4, X0, X0
	VMOVSHDUP X4, X5
	VADDSS X5, X0, X0
	VMOVHLPS X4, X4, X5
	VADDSS X5, X0, X0
	VPSHUFD $0xff, X4, X5
	VADDSS X5, X0, X0
	ADDQ $(4*WS), SI
	ADDQ $136, DI
	SUBQ $4, CX
	JMP q8_0_1_loop4
q8_0_1_tail:
	TESTQ CX, CX
	JEQ q8_0_1_done
	LOADW(0, Y1)
	VPABSB Y1, Y2
	VMOVDQU 2(DI), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y4)
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VPSHUFD $0x4e, X4, X5
	VPADDD X5, X4, X4
	VPSHUFD $0xb1, X4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	MOVWLZX 0(SI), AX
	VMOVD AX, X8
	VCVTPH2PS X8, X8
	MOVWLZX 0(DI), AX
	VMOVD AX, X9
	VCVTPH2PS X9, X9
	VMULSS X9, X8, X8
	VMULSS X8, X4, X4
	VADDSS X4, X0, X0
	ADDQ $WS, SI
	ADDQ $34, DI
	DECQ CX
	JMP q8_0_1_tail
q8_0_1_done:
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
	VPCMPEQW Y15, Y15, Y15
	VPSRLW $15, Y15, Y15
	VPCMPEQB Y14, Y14, Y14
	TESTQ CX, CX
	JEQ q8_0_4_done
q8_0_4_loop:
	LOADW(0, Y1)
	VPABSB Y1, Y2
	VMOVDQU 2(DI), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y4)
	VMOVDQU 2(DI)(R8*1), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y5)
	VMOVDQU 2(DI)(R8*2), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y6)
	VMOVDQU 2(DI)(R9*1), Y3
	VPSIGNB Y1, Y3, Y3
	DOT(Y2, Y3, Y7)
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	VPBROADCASTW 0(SI), X8
	VCVTPH2PS X8, X8
	MOVWLZX 0(DI), AX
	VMOVD AX, X9
	VPINSRW $1, (DI)(R8*1), X9, X9
	VPINSRW $2, (DI)(R8*2), X9, X9
	VPINSRW $3, (DI)(R9*1), X9, X9
	VCVTPH2PS X9, X9
	VMULPS X9, X8, X8
	VMULPS X8, X4, X4
	VADDPS X4, X0, X0
	ADDQ $WS, SI
	ADDQ $34, DI
	DECQ CX
	JNE q8_0_4_loop
q8_0_4_done:
	MOVQ out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET
