#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Rotates pairs of each head of each row of x in place by the angles of
// the row's position, read from a table of (cos, sin) per position and pair
// that the host computes as hal/cpu's ropeCache does; adjacent pairs
// (2i, 2i+1) or NEOX pairs (i, i+dims/2). One invocation per (row, head, pair).
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
	Floats x;
	Ints pos;
	Floats table; // [position][dims/2] of (cos, sin)
	uint rows, heads, headDim, dims;
	uint neox;
} p;

void main() {
	uint pairs = p.dims / 2u;
	uint i = gl_GlobalInvocationID.x, r = foldedRow();
	if (i >= p.heads * pairs || r >= p.rows) return;
	uint h = i / pairs, j = i % pairs;
	uint t = (uint(p.pos.v[r]) * pairs + j) * 2u;
	float c = p.table.v[t], s = p.table.v[t + 1u];
	uint base = (r * p.heads + h) * p.headDim;
	uint a = p.neox != 0u ? base + j : base + 2u * j;
	uint b = p.neox != 0u ? base + j + pairs : base + 2u * j + 1u;
	float x0 = p.x.v[a], x1 = p.x.v[b];
	precise float y0 = x0 * c - x1 * s;
	precise float y1 = x0 * s + x1 * c;
	p.x.v[a] = y0;
	p.x.v[b] = y1;
}
