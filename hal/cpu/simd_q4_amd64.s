#include "textflag.h"

// AVX2 kernels for Q4_0 (against Q8_0 activations), Q4_1 and Q5_1
// (against Q8_1), each with the bits of its pure-Go twin in dot.go: the
// integer block sums are exact in any lane order, and the float
// operations are the twin's, in its order and association, without FMA.
// Single-row kernels take four blocks a step (their four scaled block
// sums are added to the one float32 sum in block order), four-row kernels
// one block of the weight row against four activation rows.

DATA q4c0f<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4c0f<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4c0f<>+16(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4c0f<>+24(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL q4c0f<>(SB), RODATA|NOPTR, $32
DATA q4c08<>+0(SB)/8, $0x0808080808080808
DATA q4c08<>+8(SB)/8, $0x0808080808080808
DATA q4c08<>+16(SB)/8, $0x0808080808080808
DATA q4c08<>+24(SB)/8, $0x0808080808080808
GLOBL q4c08<>(SB), RODATA|NOPTR, $32
DATA q4c10<>+0(SB)/8, $0x1010101010101010
DATA q4c10<>+8(SB)/8, $0x1010101010101010
DATA q4c10<>+16(SB)/8, $0x1010101010101010
DATA q4c10<>+24(SB)/8, $0x1010101010101010
GLOBL q4c10<>(SB), RODATA|NOPTR, $32
// byte j <- byte j/8 of a broadcast dword
DATA q4shuf<>+0(SB)/8, $0x0000000000000000
DATA q4shuf<>+8(SB)/8, $0x0101010101010101
DATA q4shuf<>+16(SB)/8, $0x0202020202020202
DATA q4shuf<>+24(SB)/8, $0x0303030303030303
GLOBL q4shuf<>(SB), RODATA|NOPTR, $32
// byte j: all bits but bit j%8
DATA q4bits<>+0(SB)/8, $0x7fbfdfeff7fbfdfe
DATA q4bits<>+8(SB)/8, $0x7fbfdfeff7fbfdfe
DATA q4bits<>+16(SB)/8, $0x7fbfdfeff7fbfdfe
DATA q4bits<>+24(SB)/8, $0x7fbfdfeff7fbfdfe
GLOBL q4bits<>(SB), RODATA|NOPTR, $32

// The 16 nibble bytes at off(SI) as 32 unsigned quants in element order
// (low nibbles are elements 0..15, high nibbles 16..31). Uses X10/Y10,
// X11, Y13 (bytes 0x0F).
#define NIBBLES(off, dst) \
	VMOVDQU off(SI), X10; \
	VPSRLW $4, X10, X11; \
	VINSERTI128 $1, X11, Y10, Y10; \
	VPAND Y13, Y10, dst

// ---- Q4_0 (18 bytes: d f16, 16 bytes of nibbles; q = nibble - 8) ----

// One Q4_0 block at woff(SI) against the Q8_0 quants at xq, int32 lane
// sums into dst: with the unsigned nibbles u (q = u-8), the int16 pair
// sums of u·x and of 8·x (VPMADDUBSW, at most 15·128·2 and 8·128·2: no
// saturation) are subtracted, exact, then widened (VPMADDWD with ones).
// Any activation byte works, -128 included. Uses Y1, Y2, Y10..Y13, Y15.
#define Q40W(woff) NIBBLES(woff+2, Y1)
#define Q40X(xq, dst) \
	VPMADDUBSW xq, Y1, dst; \
	VPMADDUBSW xq, Y12, Y2; \
	VPSUBW Y2, dst, dst; \
	VPMADDWD Y15, dst, dst

// Four FP16 scales at stride st from base into X dst (float32).
#define Q40SCALES4(base, st, dst) \
	MOVWLZX base, AX; \
	VMOVD AX, dst; \
	VPINSRW $1, (st)base, dst, dst; \
	VPINSRW $2, (2*st)base, dst, dst; \
	VPINSRW $3, (3*st)base, dst, dst; \
	VCVTPH2PS dst, dst

#define Q40_CONSTS \
	VPCMPEQW Y15, Y15, Y15; \
	VPSRLW $15, Y15, Y15; \
	VMOVDQU q4c0f<>(SB), Y13; \
	VMOVDQU q4c08<>(SB), Y12

// func dotQ4_0AVX2(nb int, w, x *byte) float32
// Per block, as dotQ4_0: p = (float32(s)*dw)*dx, sum += p.
TEXT ·dotQ4_0AVX2(SB), NOSPLIT, $0-28
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	VXORPS X0, X0, X0
	Q40_CONSTS
q40_1_loop4:
	CMPQ CX, $4
	JLT q40_1_tail
	Q40W(0)
	Q40X(2(DI), Y4)
	Q40W(18)
	Q40X(36(DI), Y5)
	Q40W(36)
	Q40X(70(DI), Y6)
	Q40W(54)
	Q40X(104(DI), Y7)
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4
	Q40SCALES4((SI), 18, X8)
	Q40SCALES4((DI), 34, X9)
	VMULPS X8, X4, X4
	VMULPS X9, X4, X4
	VADDSS X4, X0, X0
	VMOVSHDUP X4, X5
	VADDSS X5, X0, X0
	VMOVHLPS X4, X4, X5
	VADDSS X5, X0, X0
	VPSHUFD $0xff, X4, X5
	VADDSS X5, X0, X0
	ADDQ $72, SI
	ADDQ $136, DI
	SUBQ $4, CX
	JMP q40_1_loop4
q40_1_tail:
	TESTQ CX, CX
	JEQ q40_1_done
	Q40W(0)
	Q40X(2(DI), Y4)
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
	VMULSS X8, X4, X4
	VMULSS X9, X4, X4
	VADDSS X4, X0, X0
	ADDQ $18, SI
	ADDQ $34, DI
	DECQ CX
	JMP q40_1_tail
q40_1_done:
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotQ4_0x4AVX2(nb int, w, x *byte, xstride int, out *[4]float32)
// Rows x, x+xstride, x+2*xstride, x+3*xstride; each gets exactly the
// operations of dotQ4_0AVX2.
TEXT ·dotQ4_0x4AVX2(SB), NOSPLIT, $0-40
	MOVQ nb+0(FP), CX
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DI
	MOVQ xstride+24(FP), R8
	LEAQ (R8)(R8*2), R9
	VXORPS X0, X0, X0
	Q40_CONSTS
	TESTQ CX, CX
	JEQ q40_4_done
q40_4_loop:
	Q40W(0)
	Q40X(2(DI), Y4)
	Q40X(2(DI)(R8*1), Y5)
	Q40X(2(DI)(R8*2), Y6)
	Q40X(2(DI)(R9*1), Y7)
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
	VMULPS X8, X4, X4
	VMULPS X9, X4, X4
	VADDPS X4, X0, X0
	ADDQ $18, SI
	ADDQ $34, DI
	DECQ CX
	JNE q40_4_loop
q40_4_done:
	MOVQ out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// ---- Q4_1 (20 bytes: d, m f16, 16 bytes of nibbles; q = nibble) ----

#define LOADW(off, dst) NIBBLES(off+4, dst)
#define WS 20
#define NAME_1 ·dotQ4_1AVX2(SB)
#define NAME_4 ·dotQ4_1x4AVX2(SB)
#include "simd_q8_1body_amd64.h"
#undef LOADW
#undef WS
#undef NAME_1
#undef NAME_4

// ---- Q5_1 (24 bytes: d, m f16, qh uint32, 16 bytes of nibbles) ----

// q = nibble | (bit j of qh)<<4 for element j: qh's byte j/8 goes to
// byte j, all its bits but bit j%8 are set, and a compare with all ones
// (Y14) finds the bytes whose bit was set; they get 0x10 (Y12).
#define LOADW(off, dst) \
	NIBBLES(off+8, Y10); \
	VPBROADCASTD (off+4)(SI), Y11; \
	VPSHUFB q4shuf<>(SB), Y11, Y11; \
	VPOR q4bits<>(SB), Y11, Y11; \
	VPCMPEQB Y14, Y11, Y11; \
	VPAND Y12, Y11, Y11; \
	VPOR Y11, Y10, dst
#define WS 24
#define NAME_1 ·dotQ5_1AVX2(SB)
#define NAME_4 ·dotQ5_1x4AVX2(SB)
#include "simd_q8_1body_amd64.h"
#undef LOADW
#undef WS
#undef NAME_1
#undef NAME_4
