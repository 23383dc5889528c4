#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// The elementwise ops, by OP: 0 dst[i] += src[i % srcLen] (Add, and AddBias
// with the bias as src), 1 dst[i] = silu(dst[i]) · src[i] (SiLUMul), 2
// dst[i*width + c] = src[rows[i]*width + c] (CopyRows, n = rows·width).
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint OP = 0u;

layout(push_constant) uniform Push {
	Floats dst;
	Floats src;
	Ints rows;
	uint n, srcLen, width;
	uint tilesX;
} p;

void main() {
	uint i = foldedGroup(p.tilesX) * 256u + gl_LocalInvocationID.x;
	if (i >= p.n) return;
	if (OP == 0u) {
		precise float v = p.dst.v[i] + p.src.v[i % p.srcLen];
		p.dst.v[i] = v;
	} else if (OP == 1u) {
		float g = p.dst.v[i];
		precise float v = g / (1.0 + exp(-g)) * p.src.v[i];
		p.dst.v[i] = v;
	} else {
		uint r = i / p.width, c = i % p.width;
		p.dst.v[i] = p.src.v[uint(p.rows.v[r]) * p.width + c];
	}
}
