#include "textflag.h"

// Constants for unpacking Q5_0.
DATA c0f<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA c0f<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA c0f<>+16(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA c0f<>+24(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL c0f<>(SB), RODATA|NOPTR, $32
DATA cf0<>+0(SB)/8, $0xf0f0f0f0f0f0f0f0
DATA cf0<>+8(SB)/8, $0xf0f0f0f0f0f0f0f0
DATA cf0<>+16(SB)/8, $0xf0f0f0f0f0f0f0f0
DATA cf0<>+24(SB)/8, $0xf0f0f0f0f0f0f0f0
GLOBL cf0<>(SB), RODATA|NOPTR, $32
// byte j <- byte j/8 of a broadcast dword
DATA cshuf<>+0(SB)/8, $0x0000000000000000
DATA cshuf<>+8(SB)/8, $0x0101010101010101
DATA cshuf<>+16(SB)/8, $0x0202020202020202
DATA cshuf<>+24(SB)/8, $0x0303030303030303
GLOBL cshuf<>(SB), RODATA|NOPTR, $32
// byte j: all bits but bit j%8
DATA cbits<>+0(SB)/8, $0x7fbfdfeff7fbfdfe
DATA cbits<>+8(SB)/8, $0x7fbfdfeff7fbfdfe
DATA cbits<>+16(SB)/8, $0x7fbfdfeff7fbfdfe
DATA cbits<>+24(SB)/8, $0x7fbfdfeff7fbfdfe
GLOBL cbits<>(SB), RODATA|NOPTR, $32

// Q8_0: the quants as they are.
#define LOADW_Q8_0(off, dst) VMOVDQU (off+2)(SI), dst

// Q5_0 (22 bytes: d, qh uint32, 16 bytes of nibbles): as ggml's AVX2
// path, q = nibble | 0xF0 where the high bit is clear, i.e. the signed
// value (nibble | hbit<<4) - 16. Uses Y10, Y11, Y14 (all ones).
#define LOADW_Q5_0(off, dst) \
	VMOVDQU (off+6)(SI), X10; \
	VPSRLW $4, X10, X11; \
	VINSERTI128 $1, X11, Y10, Y10; \
	VPAND c0f<>(SB), Y10, Y10; \
	VPBROADCASTD (off+2)(SI), Y11; \
	VPSHUFB cshuf<>(SB), Y11, Y11; \
	VPOR cbits<>(SB), Y11, Y11; \
	VPCMPEQB Y14, Y11, Y11; \
	VPANDN cf0<>(SB), Y11, Y11; \
	VPOR Y11, Y10, dst

// Q8_0, AVX2 build: VPMADDUBSW (pairs to int16, no saturation for |aw| <= 128,
// |sx| <= 127) then VPMADDWD with ones (Y15).
#define DOT(aw, sx, dst) VPMADDUBSW sx, aw, dst; VPMADDWD Y15, dst, dst
#define LOADW LOADW_Q8_0
#define WS 34
#define NAME_1 ·dotQ8_0AVX2(SB)
#define NAME_4 ·dotQ8_0x4AVX2(SB)
#include "simd_q8body_amd64.h"
#undef DOT
#undef LOADW
#undef WS
#undef NAME_1
#undef NAME_4

// Q8_0, AVX-512 VNNI build (EVEX VPDPBUSD on ymm, needs AVX512VL).
#define DOT(aw, sx, dst) VPXOR dst, dst, dst; VPDPBUSD sx, aw, dst
#define LOADW LOADW_Q8_0
#define WS 34
#define NAME_1 ·dotQ8_0VNNI(SB)
#define NAME_4 ·dotQ8_0x4VNNI(SB)
#include "simd_q8body_amd64.h"
#undef DOT
#undef LOADW
#undef WS
#undef NAME_1
#undef NAME_4

// Q5_0, AVX2 build: VPMADDUBSW (pairs to int16, no saturation for |aw| <= 128,
// |sx| <= 127) then VPMADDWD with ones (Y15).
#define DOT(aw, sx, dst) VPMADDUBSW sx, aw, dst; VPMADDWD Y15, dst, dst
#define LOADW LOADW_Q5_0
#define WS 22
#define NAME_1 ·dotQ5_0AVX2(SB)
#define NAME_4 ·dotQ5_0x4AVX2(SB)
#include "simd_q8body_amd64.h"
#undef DOT
#undef LOADW
#undef WS
#undef NAME_1
#undef NAME_4

// Q5_0, AVX-512 VNNI build (EVEX VPDPBUSD on ymm, needs AVX512VL).
#define DOT(aw, sx, dst) VPXOR dst, dst, dst; VPDPBUSD sx, aw, dst
#define LOADW LOADW_Q5_0
#define WS 22
#define NAME_1 ·dotQ5_0VNNI(SB)
#define NAME_4 ·dotQ5_0x4VNNI(SB)
#include "simd_q8body_amd64.h"
#undef DOT
#undef LOADW
#undef WS
#undef NAME_1
#undef NAME_4

// func cpuid(eax, ecx uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eax+0(FP), AX
	MOVL ecx+4(FP), CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET
