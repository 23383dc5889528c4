#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// out[m][n] = Σ_k x[m][k]·W[n][k] for a tile of TM activation rows × TN
// weight rows per workgroup of 32 lanes.
//
// The reduction order of one output is fixed by K alone: K is cut into
// units (one element for F32, F16 and BF16, 32 elements for the quantized types),
// lane l sums units l, l+32, l+64, … in order, and the 32 lane sums are
// added in a fixed tree. TM and TN (the matrix-vector form, TM = 1, and the
// tiled form) only change how many outputs a workgroup computes at once, so
// every form gives every output the same bits: the batch does not change a
// row's result.
layout(local_size_x = 32) in;
layout(constant_id = 0) const uint WTYPE = 0u;
layout(constant_id = 1) const uint TM = 1u;
layout(constant_id = 2) const uint TN = 1u;

layout(push_constant) uniform Push {
	Words w;      // the weight, in its device encoding
	Words x;      // the activations, converted to the weight's vec-dot encoding
	Floats out_;  // M rows of outStride values
	uint M, N, K;
	uint outStride;
	uint tilesX;  // workgroups along x before folding into z
	uint xStride; // words (F32: floats; F16: halves) per activation row
} p;

shared float red[32u * TM * TN];

// A weight unit, loaded and unpacked once for the TM activation rows it
// meets: a float (F32, F16, BF16), or a block's scales and quants.
struct WUnit {
	float a, b;   // the value; Q8_0's scale; K-quants' d and dmin
	int sc0, sc1; // Q4_K's scale and min; Q6_K's two scales
	uint q[8];    // the quants: Q8_0's int8, Q4_K's nibbles (low of each byte), Q6_K's low nibbles
	uint h[8];    // Q6_K's high bits (low two of each byte)
};

WUnit loadW(uint n, uint u) {
	WUnit w;
	w.a = 0.0;
	w.b = 0.0;
	w.sc0 = 0;
	w.sc1 = 0;
	if (WTYPE == W_F32) {
		w.a = uintBitsToFloat(p.w.v[n * p.K + u]);
		return w;
	}
	if (WTYPE == W_F16) {
		w.a = half16(p.w, n * p.K + u);
		return w;
	}
	if (WTYPE == W_BF16) {
		w.a = bf16(p.w, n * p.K + u);
		return w;
	}
	if (WTYPE == W_Q8_0) {
		uint wb = (n * (p.K / 32u) + u) * 9u;
		w.a = uintBitsToFloat(p.w.v[wb]);
		for (uint i = 0u; i < 8u; i++) w.q[i] = p.w.v[wb + 1u + i];
		return w;
	}
	// K-quants: unit u is elements 32u..32u+31, sub-block j of super-block sb.
	uint sb = u >> 3, j = u & 7u;
	if (WTYPE == W_Q4_K) {
		uint wb = (n * (p.K / 256u) + sb) * 36u;
		vec2 dm = unpackHalf2x16(p.w.v[wb]);
		w.a = dm.x;
		w.b = dm.y;
		// The 6-bit scale and min of sub-block j (hal/cpu's scaleMinK4).
		if (j < 4u) {
			w.sc0 = int(byteAt(p.w, wb * 4u + 4u + j) & 63u);
			w.sc1 = int(byteAt(p.w, wb * 4u + 8u + j) & 63u);
		} else {
			uint sj4 = byteAt(p.w, wb * 4u + 8u + j);
			w.sc0 = int((sj4 & 0xfu) | ((byteAt(p.w, wb * 4u + j) >> 6) << 4));
			w.sc1 = int((sj4 >> 4) | ((byteAt(p.w, wb * 4u + 4u + j) >> 6) << 4));
		}
		// Chunk j/2 holds sub-block j in its low (j even) or high nibbles.
		uint shift = (j & 1u) * 4u;
		uint qw = wb + 4u + (j >> 1) * 8u;
		for (uint i = 0u; i < 8u; i++) w.q[i] = (p.w.v[qw + i] >> shift) & 0x0f0f0f0fu;
		return w;
	}
	// W_Q6_K: 53 words per super-block. Unit j is half h = j/4, run k = j%4:
	// element 128h+32k+l takes the low (k<2) or high nibble of
	// ql[64h+l+32(k&1)] and bits 2k..2k+1 of qh[32h+l], minus 32; scales
	// 8h+2k (l<16) and 8h+2k+1.
	uint wb = (n * (p.K / 256u) + sb) * 53u;
	uint h = j >> 2, k = j & 3u;
	uint qlw = wb + 16u * h + 8u * (k & 1u), qhw = wb + 32u + 8u * h;
	uint nshift = (k >> 1) * 4u, hshift = 2u * k;
	for (uint i = 0u; i < 8u; i++) {
		w.q[i] = (p.w.v[qlw + i] >> nshift) & 0x0f0f0f0fu;
		w.h[i] = (p.w.v[qhw + i] >> hshift) & 0x03030303u;
	}
	uint scw = p.w.v[wb + 48u + (8u * h + 2u * k) / 4u];
	uint scs = ((8u * h + 2u * k) & 3u) * 8u;
	w.sc0 = int(scw << (24u - scs)) >> 24;
	w.sc1 = int(scw << (16u - scs)) >> 24;
	w.a = unpackHalf2x16(p.w.v[wb + 52u]).x;
	return w;
}

// The term of weight unit w (unit u) for activation row m.
float term(WUnit w, uint m, uint u) {
	if (WTYPE == W_F32) {
		precise float r = w.a * uintBitsToFloat(p.x.v[m * p.xStride + u]);
		return r;
	}
	if (WTYPE == W_F16) {
		// x was rounded to FP16: the product of two halves is exact in float32.
		precise float r = w.a * half16(p.x, m * p.xStride + u);
		return r;
	}
	if (WTYPE == W_BF16) {
		// x was rounded to bfloat16: the product is exact in float32.
		precise float r = w.a * bf16(p.x, m * p.xStride + u);
		return r;
	}
	if (WTYPE == W_Q8_0) {
		uint xb = m * p.xStride + u * 9u;
		int s = 0;
		for (uint i = 0u; i < 8u; i++) {
			uint a = w.q[i], b = p.x.v[xb + 1u + i];
			s += sbyte(a, 0u) * sbyte(b, 0u) + sbyte(a, 1u) * sbyte(b, 1u) + sbyte(a, 2u) * sbyte(b, 2u) + sbyte(a, 3u) * sbyte(b, 3u);
		}
		precise float dd = w.a * uintBitsToFloat(p.x.v[xb]);
		precise float r = float(s) * dd;
		return r;
	}
	// K-quants against Q8_K activations: per 256 elements, d as float32 bits
	// and 64 words of int8.
	uint sb = u >> 3, j = u & 7u;
	uint xb = m * p.xStride + sb * 65u;
	float yd = uintBitsToFloat(p.x.v[xb]);
	uint xq = xb + 1u + j * 8u;
	if (WTYPE == W_Q4_K) {
		int s = 0, ys = 0;
		for (uint i = 0u; i < 8u; i++) {
			uint a = w.q[i], b = p.x.v[xq + i];
			for (uint c = 0u; c < 4u; c++) {
				int y = sbyte(b, c);
				s += int((a >> (8u * c)) & 15u) * y;
				ys += y;
			}
		}
		precise float dq = w.a * yd;
		precise float dmq = w.b * yd;
		precise float r = dq * float(w.sc0 * s) - dmq * float(w.sc1 * ys);
		return r;
	}
	// W_Q6_K
	int s0 = 0, s1 = 0;
	for (uint i = 0u; i < 8u; i++) {
		uint a = w.q[i], hb = w.h[i], b = p.x.v[xq + i];
		for (uint c = 0u; c < 4u; c++) {
			int q = int(((a >> (8u * c)) & 15u) | (((hb >> (8u * c)) & 3u) << 4)) - 32;
			int prod = q * sbyte(b, c);
			if (i < 4u) s0 += prod; else s1 += prod;
		}
	}
	precise float dq = w.a * yd;
	precise float r = dq * float(w.sc0 * s0 + w.sc1 * s1);
	return r;
}

uint units() {
	if (WTYPE == W_F32 || WTYPE == W_F16 || WTYPE == W_BF16) return p.K;
	return p.K / 32u;
}

void main() {
	uint lane = gl_LocalInvocationID.x;
	uint n0 = foldedGroup(p.tilesX) * TN, m0 = gl_WorkGroupID.y * TM;
	if (n0 >= p.N) return; // the whole workgroup: no barrier is skipped by part of it
	precise float acc[TM * TN];
	for (uint t = 0u; t < TM * TN; t++) acc[t] = 0.0;
	uint U = units();
	for (uint u = lane; u < U; u += 32u) {
		for (uint j = 0u; j < TN; j++) {
			WUnit w = loadW(min(n0 + j, p.N - 1u), u);
			for (uint i = 0u; i < TM; i++) {
				acc[i * TN + j] += term(w, min(m0 + i, p.M - 1u), u);
			}
		}
	}
	for (uint t = 0u; t < TM * TN; t++) red[lane * TM * TN + t] = acc[t];
	barrier();
	// The 32 lane sums of each output in a fixed tree ((l, l+16), then
	// (l, l+8), …), by one lane an output: one barrier instead of five.
	for (uint t = lane; t < TM * TN; t += 32u) {
		precise float v[16];
		for (uint l = 0u; l < 16u; l++) v[l] = red[l * TM * TN + t] + red[(l + 16u) * TM * TN + t];
		for (uint s = 8u; s > 0u; s >>= 1) {
			for (uint l = 0u; l < s; l++) v[l] = v[l] + v[l + s];
		}
		uint m = m0 + t / TN, n = n0 + t % TN;
		if (m < p.M && n < p.N) p.out_.v[m * p.outStride + n] = v[0];
	}
}
