#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Causal attention of each (token, query head) over positions 0..pos of the
// token's sequence in one layer of the paged store, one workgroup of 32
// lanes each; query head h reads KV head h / (heads/kvHeads).
//
// Positions are taken in chunks of 32, one a lane: the lane's score (its
// dot product in float32, in dimension order, times scale), the chunk's
// maximum, and a running softmax (the sum and the value accumulators scaled
// by exp(old max − new max) as each chunk arrives); each lane owns the
// output dimensions lane, lane+32, … and adds the chunk's weighted values
// in position order. Everything depends on the token's position alone, so
// a token's output is the same in any batch, alone or in a prefill.
layout(local_size_x = 32) in;
layout(constant_id = 0) const uint F16 = 0u;
const uint MAXD = 256u;

layout(push_constant) uniform Push {
	Floats q;
	Floats out_;
	Ints pos;
	Ints seqOf;
	Ints tables;
	Words keys;
	Words values;
	uint heads, kvHeads, headDim, blockSize, tableStride;
	float scale;
} p;

shared float qs[MAXD];
shared float w[32];
shared uint voff[32];

float kvAt(Words b, uint e) {
	if (F16 == 0u) return uintBitsToFloat(b.v[e]);
	return half16(b, e);
}

void main() {
	uint lane = gl_LocalInvocationID.x;
	uint h = gl_WorkGroupID.x, t = foldedRow();
	uint D = p.headDim, BS = p.blockSize;
	uint g = h / (p.heads / p.kvHeads);
	uint qb = (t * p.heads + h) * D;
	for (uint d = lane; d < D; d += 32u) qs[d] = p.q.v[qb + d];
	uint n = uint(p.pos.v[t]) + 1u;
	uint tb = uint(p.seqOf.v[t]) * p.tableStride;
	barrier();

	float m = uintBitsToFloat(0xff800000u); // -Inf
	precise float l = 0.0;
	precise float acc[MAXD / 32u];
	for (uint i = 0u; i < MAXD / 32u; i++) acc[i] = 0.0;
	for (uint c0 = 0u; c0 < n; c0 += 32u) {
		uint ps = c0 + lane;
		float score = uintBitsToFloat(0xff800000u);
		if (ps < n) {
			uint blk = uint(p.tables.v[tb + ps / BS]);
			uint head = (blk * p.kvHeads + g) * BS * D;
			uint slot = ps % BS;
			precise float dot = 0.0;
			for (uint d = 0u; d < D; d++) dot += qs[d] * kvAt(p.keys, head + d * BS + slot);
			precise float sc = dot * p.scale;
			score = sc;
			voff[lane] = head + slot * D;
		}
		w[lane] = score;
		barrier();
		float cmax = m;
		for (uint j = 0u; j < 32u; j++) cmax = max(cmax, w[j]);
		precise float alpha = exp(m - cmax);
		barrier();
		w[lane] = ps < n ? exp(score - cmax) : 0.0;
		barrier();
		precise float csum = 0.0;
		uint valid = min(32u, n - c0);
		for (uint j = 0u; j < valid; j++) csum += w[j];
		l = l * alpha + csum;
		for (uint i = 0u; i < MAXD / 32u; i++) {
			uint d = lane + 32u * i;
			if (d >= D) break;
			precise float a = acc[i] * alpha;
			for (uint j = 0u; j < valid; j++) a += w[j] * kvAt(p.values, voff[j] + d);
			acc[i] = a;
		}
		m = cmax;
		barrier();
	}
	for (uint i = 0u; i < MAXD / 32u; i++) {
		uint d = lane + 32u * i;
		if (d >= D) break;
		precise float o = acc[i] / l;
		p.out_.v[qb + d] = o;
	}
}
