#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// out[i][c] = row ids[i] of the weight, column c, as float32 with the
// float32 operations of hal/cpu's DequantizeRow (so the same bits).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint WTYPE = 0u;

layout(push_constant) uniform Push {
	Words w;
	Ints ids;
	Floats out_;
	uint rows, K;
} p;

float dequant(uint n, uint c) {
	if (WTYPE == W_F32) return uintBitsToFloat(p.w.v[n * p.K + c]);
	if (WTYPE == W_F16) return half16(p.w, n * p.K + c);
	if (WTYPE == W_BF16) return bf16(p.w, n * p.K + c);
	if (WTYPE == W_Q8_0) {
		uint b = (n * (p.K / 32u) + c / 32u) * 9u;
		uint e = c % 32u;
		precise float r = float(sbyte(p.w.v[b + 1u + e / 4u], e % 4u)) * uintBitsToFloat(p.w.v[b]);
		return r;
	}
	uint sb = c / 256u, e = c % 256u;
	if (WTYPE == W_Q4_K) {
		uint wb = (n * (p.K / 256u) + sb) * 36u;
		vec2 dm = unpackHalf2x16(p.w.v[wb]);
		uint j = e / 32u, l = e % 32u;
		uint sc, mn;
		if (j < 4u) {
			sc = byteAt(p.w, wb * 4u + 4u + j) & 63u;
			mn = byteAt(p.w, wb * 4u + 8u + j) & 63u;
		} else {
			uint sj4 = byteAt(p.w, wb * 4u + 8u + j);
			sc = (sj4 & 0xfu) | ((byteAt(p.w, wb * 4u + j) >> 6) << 4);
			mn = (sj4 >> 4) | ((byteAt(p.w, wb * 4u + 4u + j) >> 6) << 4);
		}
		uint q = (byteAt(p.w, wb * 4u + 16u + 32u * (j / 2u) + l) >> (4u * (j & 1u))) & 15u;
		precise float d1 = dm.x * float(sc);
		precise float dm1 = dm.y * float(mn);
		precise float r = d1 * float(q) - dm1;
		return r;
	}
	// W_Q6_K
	uint wb = (n * (p.K / 256u) + sb) * 53u;
	uint h = e / 128u, k = (e % 128u) / 32u, l = e % 32u;
	uint a = byteAt(p.w, wb * 4u + 64u * h + l + 32u * (k & 1u)) >> (4u * (k >> 1));
	uint hb = byteAt(p.w, wb * 4u + 128u + 32u * h + l) >> (2u * k);
	int q = int((a & 15u) | ((hb & 3u) << 4)) - 32;
	int sc = int(byteAt(p.w, wb * 4u + 192u + 8u * h + 2u * k + l / 16u) << 24) >> 24;
	float d = unpackHalf2x16(p.w.v[wb + 52u]).x;
	precise float ds = d * float(sc);
	precise float r = ds * float(q);
	return r;
}

void main() {
	uint c = gl_GlobalInvocationID.x, i = foldedRow();
	if (c >= p.K || i >= p.rows) return;
	p.out_.v[i * p.K + c] = dequant(uint(p.ids.v[i]), c);
}
