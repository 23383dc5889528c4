#include "textflag.h"

// SiLU·mul with AVX-512, bit-equal to the scalar
//     gate[i] = gate[i] / (1 + float32(math.Exp(float64(-gate[i])))) * up[i]
// on amd64 CPUs with FMA: exp runs in float64 lanes with exactly the
// operations and constants of the Go runtime's FMA path of math.Exp
// (exp_amd64.s: Shibata's method, Taylor terms to 1/8!, four doublings),
// which gives the same float64 result for |x| <= 700 (no overflow,
// underflow or denormal branch). The kernel stops before the first chunk
// of 8 with an input outside that range and returns how many elements it
// did; the caller finishes that chunk in Go.

DATA silucst<>+0(SB)/8, $1.4426950408889634073599246810018920    // log2(e)
DATA silucst<>+8(SB)/8, $0.69314718055966295651160180568695068359375 // ln2, upper part
DATA silucst<>+16(SB)/8, $0.28235290563031577122588448175013436025525412068e-12 // ln2, lower part
DATA silucst<>+24(SB)/8, $0.0625
DATA silucst<>+32(SB)/8, $2.4801587301587301587e-5
DATA silucst<>+40(SB)/8, $1.9841269841269841270e-4
DATA silucst<>+48(SB)/8, $1.3888888888888888889e-3
DATA silucst<>+56(SB)/8, $8.3333333333333333333e-3
DATA silucst<>+64(SB)/8, $4.1666666666666666667e-2
DATA silucst<>+72(SB)/8, $1.6666666666666666667e-1
DATA silucst<>+80(SB)/8, $0.5
DATA silucst<>+88(SB)/8, $1.0
DATA silucst<>+96(SB)/8, $2.0
DATA silucst<>+104(SB)/8, $700.0
DATA silucst<>+112(SB)/8, $0x7fffffffffffffff // |x| mask
DATA silucst<>+120(SB)/8, $0x8000000000000000 // sign
DATA silucst<>+128(SB)/8, $1023
DATA silucst<>+136(SB)/4, $1.0 // float32
GLOBL silucst<>(SB), RODATA|NOPTR, $140

#define LOAD_EXP_CONSTS \
	VBROADCASTSD silucst<>+0(SB), Z16; \
	VBROADCASTSD silucst<>+8(SB), Z17; \
	VBROADCASTSD silucst<>+16(SB), Z18; \
	VBROADCASTSD silucst<>+24(SB), Z19; \
	VBROADCASTSD silucst<>+32(SB), Z20; \
	VBROADCASTSD silucst<>+40(SB), Z21; \
	VBROADCASTSD silucst<>+48(SB), Z22; \
	VBROADCASTSD silucst<>+56(SB), Z23; \
	VBROADCASTSD silucst<>+64(SB), Z24; \
	VBROADCASTSD silucst<>+72(SB), Z25; \
	VBROADCASTSD silucst<>+80(SB), Z26; \
	VBROADCASTSD silucst<>+88(SB), Z27; \
	VBROADCASTSD silucst<>+96(SB), Z28; \
	VBROADCASTSD silucst<>+104(SB), Z29; \
	VBROADCASTSD silucst<>+112(SB), Z30; \
	VBROADCASTSD silucst<>+120(SB), Z31; \
	VBROADCASTSD silucst<>+128(SB), Z15

// EXP_Z1 sets the float64 lanes of Z1 to exp(Z1) (|Z1| <= 700), as
// math.Exp's FMA path; uses Z3-Z6 and the constants in Z15-Z30.
#define EXP_Z1 \
	VMULPD Z16, Z1, Z3; \
	VCVTPD2DQ Z3, Y4; \
	VCVTDQ2PD Y4, Z3; \
	VFNMADD231PD Z17, Z3, Z1; \
	VFNMADD231PD Z18, Z3, Z1; \
	VMULPD Z19, Z1, Z1; \
	VMOVAPD Z20, Z5; \
	VFMADD213PD Z21, Z1, Z5; \
	VFMADD213PD Z22, Z1, Z5; \
	VFMADD213PD Z23, Z1, Z5; \
	VFMADD213PD Z24, Z1, Z5; \
	VFMADD213PD Z25, Z1, Z5; \
	VFMADD213PD Z26, Z1, Z5; \
	VFMADD213PD Z27, Z1, Z5; \
	VMULPD Z5, Z1, Z1; \
	VADDPD Z28, Z1, Z5; \
	VMULPD Z5, Z1, Z1; \
	VADDPD Z28, Z1, Z5; \
	VMULPD Z5, Z1, Z1; \
	VADDPD Z28, Z1, Z5; \
	VMULPD Z5, Z1, Z1; \
	VADDPD Z28, Z1, Z5; \
	VFMADD213PD Z27, Z5, Z1; \
	VPMOVSXDQ Y4, Z6; \
	VPADDQ Z15, Z6, Z6; \
	VPSLLQ $52, Z6, Z6; \
	VMULPD Z6, Z1, Z1

// func siluMulAVX512(gate, up *float32, n int) int
TEXT ·siluMulAVX512(SB), NOSPLIT, $0-32
	MOVQ gate+0(FP), SI
	MOVQ up+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	XORQ DX, DX
	LOAD_EXP_CONSTS
	VBROADCASTSS silucst<>+136(SB), Y14
	TESTQ CX, CX
	JEQ silu_done
silu_loop:
	VMOVUPS (SI)(DX*4), Y0
	VCVTPS2PD Y0, Z1
	VXORPD Z31, Z1, Z1 // x = -g
	VANDPD Z30, Z1, Z2
	VCMPPD $2, Z29, Z2, K1 // |x| <= 700, false for NaN
	KMOVW K1, AX
	CMPL AX, $0xff
	JNE silu_done
	EXP_Z1
	VCVTPD2PS Z1, Y7
	VADDPS Y14, Y7, Y7
	VDIVPS Y7, Y0, Y8
	VMULPS (DI)(DX*4), Y8, Y8
	VMOVUPS Y8, (SI)(DX*4)
	ADDQ $8, DX
	DECQ CX
	JNE silu_loop
silu_done:
	MOVQ DX, ret+24(FP)
	VZEROUPPER
	RET

// func expShiftedAVX512(v *float32, n int, m float32) int
// v[j] = float32(math.Exp(float64(v[j] - m))) for chunks of 8, stopping
// before a chunk with v[j]-m outside [-700, 700] or NaN; returns the count
// done.
TEXT ·expShiftedAVX512(SB), NOSPLIT, $0-32
	MOVQ v+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	XORQ DX, DX
	VBROADCASTSS m+16(FP), Y13
	LOAD_EXP_CONSTS
	TESTQ CX, CX
	JEQ exps_done
exps_loop:
	VMOVUPS (SI)(DX*4), Y0
	VSUBPS Y13, Y0, Y0
	VCVTPS2PD Y0, Z1
	VANDPD Z30, Z1, Z2
	VCMPPD $2, Z29, Z2, K1
	KMOVW K1, AX
	CMPL AX, $0xff
	JNE exps_done
	EXP_Z1
	VCVTPD2PS Z1, Y7
	VMOVUPS Y7, (SI)(DX*4)
	ADDQ $8, DX
	DECQ CX
	JNE exps_loop
exps_done:
	MOVQ DX, ret+24(FP)
	VZEROUPPER
	RET
