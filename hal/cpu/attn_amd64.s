#include "textflag.h"

// Attention kernels (AVX-512F) for KV blocks of 16 positions. Every lane
// runs the scalar loops' float32 operations in their order (a product
// rounded, then added; no FMA), so the results are bit-equal to
// attnScoresRef and attnAccumVRef.

// func attnScores16AVX512(q *float32, hd int, k *float32, offs *int32, nblk int, scale float32, out *float32)
// For each block b: out[16b+s] = (Σ_i q[i]·kb[16i+s])·scale, kb = k + offs[b]
// (keys transposed in the block). Four blocks at a time, then one.
TEXT ·attnScores16AVX512(SB), NOSPLIT, $0-56
	MOVQ k+16(FP), DX
	MOVQ offs+24(FP), R8
	MOVQ nblk+32(FP), BX
	VBROADCASTSS scale+40(FP), Z15
	MOVQ out+48(FP), DI
scores_loop4:
	CMPQ BX, $4
	JLT scores_tail
	MOVLQSX 0(R8), R9
	LEAQ (DX)(R9*4), R9
	MOVLQSX 4(R8), R10
	LEAQ (DX)(R10*4), R10
	MOVLQSX 8(R8), R11
	LEAQ (DX)(R11*4), R11
	MOVLQSX 12(R8), R12
	LEAQ (DX)(R12*4), R12
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3
	MOVQ q+0(FP), SI
	MOVQ hd+8(FP), CX
scores_inner4:
	VBROADCASTSS (SI), Z4
	VMULPS (R9), Z4, Z5
	VADDPS Z5, Z0, Z0
	VMULPS (R10), Z4, Z6
	VADDPS Z6, Z1, Z1
	VMULPS (R11), Z4, Z7
	VADDPS Z7, Z2, Z2
	VMULPS (R12), Z4, Z8
	VADDPS Z8, Z3, Z3
	ADDQ $4, SI
	ADDQ $64, R9
	ADDQ $64, R10
	ADDQ $64, R11
	ADDQ $64, R12
	DECQ CX
	JNE scores_inner4
	VMULPS Z15, Z0, Z0
	VMULPS Z15, Z1, Z1
	VMULPS Z15, Z2, Z2
	VMULPS Z15, Z3, Z3
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	ADDQ $256, DI
	ADDQ $16, R8
	SUBQ $4, BX
	JMP scores_loop4
scores_tail:
	TESTQ BX, BX
	JEQ scores_done
	MOVLQSX 0(R8), R9
	LEAQ (DX)(R9*4), R9
	VXORPS Z0, Z0, Z0
	MOVQ q+0(FP), SI
	MOVQ hd+8(FP), CX
scores_inner1:
	VBROADCASTSS (SI), Z4
	VMULPS (R9), Z4, Z5
	VADDPS Z5, Z0, Z0
	ADDQ $4, SI
	ADDQ $64, R9
	DECQ CX
	JNE scores_inner1
	VMULPS Z15, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $4, R8
	DECQ BX
	JMP scores_tail
scores_done:
	VZEROUPPER
	RET

// func attnAccumV16AVX512(o *float32, hd int, v *float32, offs *int32, n int, w *float32)
// o[i] = Σ_j w[j]·v_j[i] for j < n in order, v_j = v + offs[j/16] + (j%16)·hd.
// Columns in chunks of 64 (four accumulators), then of 16.
TEXT ·attnAccumV16AVX512(SB), NOSPLIT, $0-48
	MOVQ o+0(FP), R11
	MOVQ hd+8(FP), R10
	MOVQ v+16(FP), DX
	LEAQ 0(R10*4), R14
	XORQ R12, R12
accum_chunk64:
	CMPQ R10, $64
	JLT accum_chunk16
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3
	MOVQ offs+24(FP), R8
	MOVQ w+40(FP), R13
	MOVQ n+32(FP), BX
accum_blk64:
	MOVLQSX (R8), R9
	LEAQ (DX)(R9*4), R9
	ADDQ R12, R9
	MOVQ $16, CX
	CMPQ BX, CX
	CMOVQLT BX, CX
	SUBQ CX, BX
accum_slot64:
	VBROADCASTSS (R13), Z4
	VMULPS (R9), Z4, Z5
	VADDPS Z5, Z0, Z0
	VMULPS 64(R9), Z4, Z6
	VADDPS Z6, Z1, Z1
	VMULPS 128(R9), Z4, Z7
	VADDPS Z7, Z2, Z2
	VMULPS 192(R9), Z4, Z8
	VADDPS Z8, Z3, Z3
	ADDQ $4, R13
	ADDQ R14, R9
	DECQ CX
	JNE accum_slot64
	ADDQ $4, R8
	TESTQ BX, BX
	JNE accum_blk64
	VMOVUPS Z0, (R11)
	VMOVUPS Z1, 64(R11)
	VMOVUPS Z2, 128(R11)
	VMOVUPS Z3, 192(R11)
	ADDQ $256, R11
	ADDQ $256, R12
	SUBQ $64, R10
	JMP accum_chunk64
accum_chunk16:
	TESTQ R10, R10
	JEQ accum_done
	VXORPS Z0, Z0, Z0
	MOVQ offs+24(FP), R8
	MOVQ w+40(FP), R13
	MOVQ n+32(FP), BX
accum_blk16:
	MOVLQSX (R8), R9
	LEAQ (DX)(R9*4), R9
	ADDQ R12, R9
	MOVQ $16, CX
	CMPQ BX, CX
	CMOVQLT BX, CX
	SUBQ CX, BX
accum_slot16:
	VBROADCASTSS (R13), Z4
	VMULPS (R9), Z4, Z5
	VADDPS Z5, Z0, Z0
	ADDQ $4, R13
	ADDQ R14, R9
	DECQ CX
	JNE accum_slot16
	ADDQ $4, R8
	TESTQ BX, BX
	JNE accum_blk16
	VMOVUPS Z0, (R11)
	ADDQ $64, R11
	ADDQ $64, R12
	SUBQ $16, R10
	JMP accum_chunk16
accum_done:
	VZEROUPPER
	RET
