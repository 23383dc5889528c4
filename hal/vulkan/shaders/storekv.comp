#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Writes each token's keys and values into one layer of the paged store at
// the token's position, in hal/cpu's block layout (cpu-kv/1): keys
// [block][kv head][dim][slot], values [block][kv head][slot][dim], float32 or
// FP16 (rounded to nearest even). One invocation per (token, element). Two
// tokens' FP16 keys can share a word (neighbouring slots), so FP16 elements
// are written with atomics on their half of the word.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint F16 = 0u;

layout(push_constant) uniform Push {
	Floats k;
	Floats v;
	Ints pos;
	Ints seqOf;
	Ints tables; // per sequence, tableStride entries
	Words keys;   // this layer's keys
	Words values; // this layer's values
	uint tokens, kvHeads, headDim, blockSize, tableStride;
} p;

void put(Words b, uint e, float f) {
	if (F16 == 0u) {
		b.v[e] = floatBitsToUint(f);
		return;
	}
	uint shift = (e & 1u) * 16u;
	atomicAnd(b.v[e >> 1], ~(0xffffu << shift));
	atomicOr(b.v[e >> 1], toHalf(f) << shift);
}

void main() {
	uint row = p.kvHeads * p.headDim;
	uint i = gl_GlobalInvocationID.x, t = foldedRow();
	if (i >= row || t >= p.tokens) return;
	uint h = i / p.headDim, d = i % p.headDim;
	uint ps = uint(p.pos.v[t]);
	uint blk = uint(p.tables.v[uint(p.seqOf.v[t]) * p.tableStride + ps / p.blockSize]);
	uint slot = ps % p.blockSize;
	uint head = (blk * p.kvHeads + h) * p.blockSize * p.headDim;
	put(p.keys, head + d * p.blockSize + slot, p.k.v[t * row + i]);
	put(p.values, head + slot * p.headDim + d, p.v.v[t * row + i]);
}
