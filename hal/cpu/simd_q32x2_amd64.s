#include "textflag.h"

// Two weight rows × one Q8_0 activation row, AVX-512 VNNI (EVEX on ymm),
// for Q8_0 and Q5_0 weights. Decode streams every weight once, so these
// kernels are about memory: two independent rows in flight, software
// prefetch of the next pair of rows (pf bytes ahead), and few
// instructions per block.
//
// Per block the integer dot s is exact: the weights go in as unsigned
// bytes u = q + B (Q8_0: q^0x80 = q+128; Q5_0: the 5-bit value, q+16),
// VPDPBUSD gives Σu·x, and s = Σu·x - B·Σx with Σx from VPDPBUSD of ones.
// The float operations are then the pure-Go twin's, in its order:
// d = dw*dx, p = float32(s)*d, sum += p, block after block, no FMA. So each
// row's result has the same bits as the single-row kernel's.
//
// Registers: SI row 0, SI+R8 row 1, DI activations, R10 prefetch offset,
// R11 = R8+R10, CX blocks left. Y16 ones, Y17 0x80, Y18 0x0F, Y19 0x10
// (bytes). Y4..Y7 row 0, Y8..Y11 row 1, Y12..Y15 Σx lane sums. X0, X1 sums.


// Q8_0 weights: u = q ^ 0x80.
#define U_Q8_0(off, base, dst) VPXORD (off+2)base, Y17, dst
// Q5_0 weights (d, qh uint32, 16 bytes of nibbles): u = nibble | hbit<<4.
// Uses X2/Y2, X3 and K1.
#define U_Q5_0(off, base, dst) \
	VMOVDQU (off+6)base, X2; \
	VPSRLW $4, X2, X3; \
	VINSERTI128 $1, X3, Y2, Y2; \
	VPANDD Y18, Y2, dst; \
	KMOVD (off+2)base, K1; \
	VPADDB Y19, dst, K1, dst

// One block b of both rows: accumulators 4+b, 8+b, 12+b.
#define BLK(b, a0, a1, ax) \
	U(b*WS, (SI), Y20); \
	U(b*WS, (SI)(R8*1), Y21); \
	VPXOR a0, a0, a0; \
	VPXOR a1, a1, a1; \
	VPXOR ax, ax, ax; \
	VPDPBUSD (2+34*b)(DI), Y20, a0; \
	VPDPBUSD (2+34*b)(DI), Y21, a1; \
	VPDPBUSD (2+34*b)(DI), Y16, ax

// Four lane sums (a, b, c, d) → X of a: [Σa, Σb, Σc, Σd]; clobbers b, c.
#define HSUM4(a, b, c, d, ax, bx) \
	VPHADDD b, a, a; \
	VPHADDD d, c, c; \
	VPHADDD c, a, a; \
	VEXTRACTI128 $1, a, bx; \
	VPADDD bx, ax, ax

// Four FP16 scales at stride st from base into X dst (float32).
#define SCALES4(base, st, dst) \
	MOVWLZX base, AX; \
	VMOVD AX, dst; \
	VPINSRW $1, (st)base, dst, dst; \
	VPINSRW $2, (2*st)base, dst, dst; \
	VPINSRW $3, (3*st)base, dst, dst; \
	VCVTPH2PS dst, dst

// sum += p[0]; sum += p[1]; sum += p[2]; sum += p[3]. Clobbers X3.
#define ADD4(p, sum) \
	VADDSS p, sum, sum; \
	VMOVSHDUP p, X3; \
	VADDSS X3, sum, sum; \
	VMOVHLPS p, p, X3; \
	VADDSS X3, sum, sum; \
	VPSHUFD $0xff, p, X3; \
	VADDSS X3, sum, sum

// Horizontal int32 sum of Y a into the low lane of X ax; clobbers X tx.
#define HSUM1(a, ax, tx) \
	VEXTRACTI128 $1, a, tx; \
	VPADDD tx, ax, ax; \
	VPSHUFD $0x4e, ax, tx; \
	VPADDD tx, ax, ax; \
	VPSHUFD $0xb1, ax, tx; \
	VPADDD tx, ax, ax

#define BODY \
	MOVQ nb+0(FP), CX; \
	MOVQ w+8(FP), SI; \
	MOVQ wstride+16(FP), R8; \
	MOVQ x+24(FP), DI; \
	MOVQ pf+32(FP), R10; \
	LEAQ (R8)(R10*1), R11; \
	VXORPS X0, X0, X0; \
	VXORPS X1, X1, X1; \
	MOVL $0x01010101, AX; \
	VPBROADCASTD AX, Y16; \
	MOVL $0x80808080, AX; \
	VPBROADCASTD AX, Y17; \
	MOVL $0x0f0f0f0f, AX; \
	VPBROADCASTD AX, Y18; \
	MOVL $0x10101010, AX; \
	VPBROADCASTD AX, Y19; \
loop4: \
	CMPQ CX, $4; \
	JLT tail; \
	PF; \
	BLK(0, Y4, Y8, Y12); \
	BLK(1, Y5, Y9, Y13); \
	BLK(2, Y6, Y10, Y14); \
	BLK(3, Y7, Y11, Y15); \
	HSUM4(Y4, Y5, Y6, Y7, X4, X5); \
	HSUM4(Y8, Y9, Y10, Y11, X8, X9); \
	HSUM4(Y12, Y13, Y14, Y15, X12, X13); \
	VPSLLD $SH, X12, X12; \
	VPSUBD X12, X4, X4; \
	VPSUBD X12, X8, X8; \
	VCVTDQ2PS X4, X4; \
	VCVTDQ2PS X8, X8; \
	SCALES4((DI), 34, X13); \
	SCALES4((SI), WS, X14); \
	SCALES4((SI)(R8*1), WS, X15); \
	VMULPS X13, X14, X14; \
	VMULPS X13, X15, X15; \
	VMULPS X14, X4, X4; \
	VMULPS X15, X8, X8; \
	ADD4(X4, X0); \
	ADD4(X8, X1); \
	ADDQ $(4*WS), SI; \
	ADDQ $136, DI; \
	SUBQ $4, CX; \
	JMP loop4; \
tail: \
	TESTQ CX, CX; \
	JEQ done; \
	BLK(0, Y4, Y8, Y12); \
	HSUM1(Y4, X4, X5); \
	HSUM1(Y8, X8, X9); \
	HSUM1(Y12, X12, X13); \
	VPSLLD $SH, X12, X12; \
	VPSUBD X12, X4, X4; \
	VPSUBD X12, X8, X8; \
	VCVTDQ2PS X4, X4; \
	VCVTDQ2PS X8, X8; \
	MOVWLZX (DI), AX; \
	VMOVD AX, X13; \
	VCVTPH2PS X13, X13; \
	MOVWLZX (SI), AX; \
	VMOVD AX, X14; \
	VCVTPH2PS X14, X14; \
	MOVWLZX (SI)(R8*1), AX; \
	VMOVD AX, X15; \
	VCVTPH2PS X15, X15; \
	VMULSS X13, X14, X14; \
	VMULSS X13, X15, X15; \
	VMULSS X14, X4, X4; \
	VMULSS X15, X8, X8; \
	VADDSS X4, X0, X0; \
	VADDSS X8, X1, X1; \
	ADDQ $WS, SI; \
	ADDQ $34, DI; \
	DECQ CX; \
	JMP tail; \
done: \
	MOVQ out+40(FP), AX; \
	VMOVSS X0, (AX); \
	VMOVSS X1, 4(AX); \
	VZEROUPPER; \
	RET


// One block b of one row: accumulators a (dot) and ax (Σx).
#define BLK1(b, a, ax) \
	U(b*WS, (SI), Y20); \
	VPXOR a, a, a; \
	VPXOR ax, ax, ax; \
	VPDPBUSD (2+34*b)(DI), Y20, a; \
	VPDPBUSD (2+34*b)(DI), Y16, ax

// Single-row kernel body: SI row, DI activations, R10 prefetch offset.
#define BODY1 \
	MOVQ nb+0(FP), CX; \
	MOVQ w+8(FP), SI; \
	MOVQ x+16(FP), DI; \
	MOVQ pf+24(FP), R10; \
	VXORPS X0, X0, X0; \
	MOVL $0x01010101, AX; \
	VPBROADCASTD AX, Y16; \
	MOVL $0x80808080, AX; \
	VPBROADCASTD AX, Y17; \
	MOVL $0x0f0f0f0f, AX; \
	VPBROADCASTD AX, Y18; \
	MOVL $0x10101010, AX; \
	VPBROADCASTD AX, Y19; \
loop4: \
	CMPQ CX, $4; \
	JLT tail; \
	PF1; \
	BLK1(0, Y4, Y8); \
	BLK1(1, Y5, Y9); \
	BLK1(2, Y6, Y10); \
	BLK1(3, Y7, Y11); \
	HSUM4(Y4, Y5, Y6, Y7, X4, X5); \
	HSUM4(Y8, Y9, Y10, Y11, X8, X9); \
	VPSLLD $SH, X8, X8; \
	VPSUBD X8, X4, X4; \
	VCVTDQ2PS X4, X4; \
	SCALES4((DI), 34, X13); \
	SCALES4((SI), WS, X14); \
	VMULPS X13, X14, X14; \
	VMULPS X14, X4, X4; \
	ADD4(X4, X0); \
	ADDQ $(4*WS), SI; \
	ADDQ $136, DI; \
	SUBQ $4, CX; \
	JMP loop4; \
tail: \
	TESTQ CX, CX; \
	JEQ done; \
	BLK1(0, Y4, Y8); \
	HSUM1(Y4, X4, X5); \
	HSUM1(Y8, X8, X9); \
	VPSLLD $SH, X8, X8; \
	VPSUBD X8, X4, X4; \
	VCVTDQ2PS X4, X4; \
	MOVWLZX (DI), AX; \
	VMOVD AX, X13; \
	VCVTPH2PS X13, X13; \
	MOVWLZX (SI), AX; \
	VMOVD AX, X14; \
	VCVTPH2PS X14, X14; \
	VMULSS X13, X14, X14; \
	VMULSS X14, X4, X4; \
	VADDSS X4, X0, X0; \
	ADDQ $WS, SI; \
	ADDQ $34, DI; \
	DECQ CX; \
	JMP tail; \
done: \
	VMOVSS X0, ret+32(FP); \
	VZEROUPPER; \
	RET

// func dotQ8_0x1VNNI(nb int, w, x *byte, pf int) float32
#define U U_Q8_0
#define WS 34
#define SH 7
#define PF1 \
	PREFETCHT0 (SI)(R10*1); \
	PREFETCHT0 64(SI)(R10*1); \
	PREFETCHT0 128(SI)(R10*1)
TEXT ·dotQ8_0x1VNNI(SB), NOSPLIT, $0-36
	BODY1
#undef U
#undef WS
#undef SH
#undef PF1

// func dotQ5_0x1VNNI(nb int, w, x *byte, pf int) float32
#define U U_Q5_0
#define WS 22
#define SH 4
#define PF1 \
	PREFETCHT0 (SI)(R10*1); \
	PREFETCHT0 64(SI)(R10*1)
TEXT ·dotQ5_0x1VNNI(SB), NOSPLIT, $0-36
	BODY1
#undef U
#undef WS
#undef SH
#undef PF1

// func dotQ8_0x2VNNI(nb int, w *byte, wstride int, x *byte, pf int, out *[2]float32)
#define U U_Q8_0
#define WS 34
#define SH 7
#define PF \
	PREFETCHT0 (SI)(R10*1); \
	PREFETCHT0 64(SI)(R10*1); \
	PREFETCHT0 128(SI)(R10*1); \
	PREFETCHT0 (SI)(R11*1); \
	PREFETCHT0 64(SI)(R11*1); \
	PREFETCHT0 128(SI)(R11*1)
TEXT ·dotQ8_0x2VNNI(SB), NOSPLIT, $0-48
	BODY
#undef U
#undef WS
#undef SH
#undef PF

// func dotQ5_0x2VNNI(nb int, w *byte, wstride int, x *byte, pf int, out *[2]float32)
#define U U_Q5_0
#define WS 22
#define SH 4
#define PF \
	PREFETCHT0 (SI)(R10*1); \
	PREFETCHT0 64(SI)(R10*1); \
	PREFETCHT0 (SI)(R11*1); \
	PREFETCHT0 64(SI)(R11*1)
TEXT ·dotQ5_0x2VNNI(SB), NOSPLIT, $0-48
	BODY
