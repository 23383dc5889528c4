// Macros shared by the AVX2 Q4_K and Q5_K kernels (simd_k_amd64.s,
// simd_q5k_amd64.s), whose super-blocks keep d, dmin and the 12 bytes of
// 6-bit scales and mins at the same offsets, against Q8_K activation rows
// (XR0..XR3: rows 0..3 from DI, R8 the row stride, R9 three strides).

#define XR0 (DI)
#define XR1 (DI)(R8*1)
#define XR2 (DI)(R8*2)
#define XR3 (DI)(R9*1)

// Unpack the 6-bit scales and mins (ggml's kmask trick) into X14, X13.
#define KQ_SCALES \
	MOVL 4(SI), AX; \
	MOVL 8(SI), BX; \
	MOVL 12(SI), DX; \
	MOVL AX, R11; \
	ANDL $0x3f3f3f3f, R11; \
	VMOVD R11, X14; \
	MOVL AX, R11; \
	SHRL $6, R11; \
	ANDL $0x03030303, R11; \
	SHLL $4, R11; \
	MOVL DX, R12; \
	ANDL $0x0f0f0f0f, R12; \
	ORL R12, R11; \
	VPINSRD $1, R11, X14, X14; \
	MOVL BX, R11; \
	ANDL $0x3f3f3f3f, R11; \
	VMOVD R11, X13; \
	MOVL BX, R11; \
	SHRL $6, R11; \
	ANDL $0x03030303, R11; \
	SHLL $4, R11; \
	SHRL $4, DX; \
	ANDL $0x0f0f0f0f, DX; \
	ORL DX, R11; \
	VPINSRD $1, R11, X13, X13; \
	VPMOVZXBW X14, X14; \
	VPMOVZXBW X13, X13

#define KQ_ROW(c, XR, acc) \
	VPMADDUBSW (4+64*c)XR, Y1, Y5; \
	VPMADDWD Y3, Y5, Y5; \
	VPADDD Y5, acc, acc; \
	VPMADDUBSW (36+64*c)XR, Y2, Y6; \
	VPMADDWD Y4, Y6, Y6; \
	VPADDD Y6, acc, acc

// Row epilogue: X1 = dw, X2 = dmin (float32), out element at o(R10).
#define KQ_EPI(XR, acc, accx, o) \
	VEXTRACTI128 $1, acc, X5; \
	VPADDD X5, accx, X5; \
	VPSHUFD $0x4e, X5, X6; \
	VPADDD X6, X5, X5; \
	VPSHUFD $0xb1, X5, X6; \
	VPADDD X6, X5, X5; \
	VMOVDQU 260 XR, Y6; \
	VEXTRACTI128 $1, Y6, X7; \
	VPHADDW X7, X6, X6; \
	VPMADDWD X13, X6, X6; \
	VPSHUFD $0x4e, X6, X7; \
	VPADDD X7, X6, X6; \
	VPSHUFD $0xb1, X6, X7; \
	VPADDD X7, X6, X6; \
	VCVTDQ2PS X5, X5; \
	VCVTDQ2PS X6, X6; \
	VMOVSS 0 XR, X7; \
	VMULSS X7, X1, X3; \
	VMULSS X7, X2, X4; \
	VMULSS X5, X3, X3; \
	VMULSS X6, X4, X4; \
	VMOVSS o(R10), X5; \
	VADDSS X3, X5, X5; \
	VSUBSS X4, X5, X5; \
	VMOVSS X5, o(R10)

#define KQ_DSCALES \
	MOVWLZX 0(SI), AX; \
	VMOVD AX, X1; \
	VCVTPH2PS X1, X1; \
	MOVWLZX 2(SI), AX; \
	VMOVD AX, X2; \
	VCVTPH2PS X2, X2
