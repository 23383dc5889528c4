#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// out[r] = x[r] / sqrt(mean(x[r]²) + eps) · weight, one workgroup per row.
// The sum of squares is float32 over 64 lanes (lane l sums l, l+64, …) and
// a fixed tree: a row's result depends on that row alone. out may be x.
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
	Floats x;
	Floats out_;
	Floats weight;
	uint n, rows;
	float eps;
} p;

shared float red[64];

void main() {
	uint lane = gl_LocalInvocationID.x, r = gl_WorkGroupID.x + gl_WorkGroupID.y * 65535u;
	if (r >= p.rows) return;
	uint base = r * p.n;
	precise float s = 0.0;
	for (uint i = lane; i < p.n; i += 64u) {
		precise float v = p.x.v[base + i];
		s += v * v;
	}
	red[lane] = s;
	barrier();
	for (uint k = 32u; k > 0u; k >>= 1) {
		if (lane < k) {
			precise float v = red[lane] + red[lane + k];
			red[lane] = v;
		}
		barrier();
	}
	precise float mean = red[0] / float(p.n);
	precise float scale = 1.0 / sqrt(mean + p.eps);
	for (uint i = lane; i < p.n; i += 64u) {
		precise float v = (p.x.v[base + i] * scale) * p.weight.v[i];
		p.out_.v[base + i] = v;
	}
}
