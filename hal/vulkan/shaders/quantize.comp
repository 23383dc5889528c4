#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Converts activation rows to a weight type's vec-dot encoding, as hal/cpu's
// QuantizeRow does: Q8_0 (x86 rounding: id = 127/amax, ties to even, the
// scale rounded to FP16), Q8_K (ggml's reference: the signed value of
// largest magnitude, iscale = -127/max, d = 1/iscale), FP16 or bfloat16 (to
// nearest even). One invocation per block of a row (per pair of elements for FP16).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint QTYPE = 0u; // 0 Q8_0, 1 Q8_K, 2 F16, 3 BF16

layout(push_constant) uniform Push {
	Floats x;
	Words out_;
	uint M, K;
	uint outStride; // words per converted row
	uint tilesX;
} p;

void main() {
	uint i = gl_GlobalInvocationID.x, m = foldedRow();
	if (m >= p.M) return;
	uint xb = m * p.K;
	uint ob = m * p.outStride;
	if (QTYPE == 2u || QTYPE == 3u) {
		uint e = 2u * i;
		if (e >= p.K) return;
		float x0 = p.x.v[xb + e], x1 = e + 1u < p.K ? p.x.v[xb + e + 1u] : 0.0;
		uint lo = QTYPE == 2u ? toHalf(x0) : toBF16(x0);
		uint hi = QTYPE == 2u ? toHalf(x1) : toBF16(x1);
		p.out_.v[ob + i] = lo | (hi << 16);
		return;
	}
	if (QTYPE == 0u) {
		if (i >= p.K / 32u) return;
		uint base = xb + 32u * i;
		float amax = 0.0;
		for (uint j = 0u; j < 32u; j++) amax = max(amax, abs(p.x.v[base + j]));
		float d = amax / 127.0;
		float id = amax != 0.0 ? 127.0 / amax : 0.0;
		uint o = ob + 9u * i;
		p.out_.v[o] = floatBitsToUint(roundHalf(d));
		for (uint w = 0u; w < 8u; w++) {
			uint word = 0u;
			for (uint k = 0u; k < 4u; k++) {
				precise float v = p.x.v[base + 4u * w + k] * id;
				int r = clamp(int(roundEven(v)), -128, 127);
				word |= (uint(r) & 0xffu) << (8u * k);
			}
			p.out_.v[o + 1u + w] = word;
		}
		return;
	}
	if (i >= p.K / 256u) return;
	uint base = xb + 256u * i;
	float amax = 0.0, mx = 0.0;
	for (uint j = 0u; j < 256u; j++) {
		float v = p.x.v[base + j];
		if (abs(v) > amax) {
			amax = abs(v);
			mx = v;
		}
	}
	uint o = ob + 65u * i;
	if (mx == 0.0) {
		for (uint w = 0u; w < 65u; w++) p.out_.v[o + w] = 0u;
		return;
	}
	float iscale = -127.0 / mx;
	p.out_.v[o] = floatBitsToUint(1.0 / iscale);
	for (uint w = 0u; w < 64u; w++) {
		uint word = 0u;
		for (uint k = 0u; k < 4u; k++) {
			precise float v = iscale * p.x.v[base + 4u * w + k];
			int r = min(127, int(roundEven(v)));
			word |= (uint(r) & 0xffu) << (8u * k);
		}
		p.out_.v[o + 1u + w] = word;
	}
}
