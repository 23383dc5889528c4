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

// The term of unit u for weight row n and activation row m.
float term(uint n, uint m, uint u) {
	if (WTYPE == W_F32) {
		precise float r = uintBitsToFloat(p.w.v[n * p.K + u]) * uintBitsToFloat(p.x.v[m * p.xStride + u]);
		return r;
	}
	if (WTYPE == W_F16) {
		// x was rounded to FP16: the product of two halves is exact in float32.
		precise float r = half16(p.w, n * p.K + u) * half16(p.x, m * p.xStride + u);
		return r;
	}
	if (WTYPE == W_BF16) {
		// x was rounded to bfloat16: the product is exact in float32.
		precise float r = bf16(p.w, n * p.K + u) * bf16(p.x, m * p.xStride + u);
		return r;
	}
	if (WTYPE == W_Q8_0) {
		uint nb = p.K / 32u;
		uint wb = (n * nb + u) * 9u, xb = m * p.xStride + u * 9u;
		int s = 0;
		for (uint i = 1u; i < 9u; i++) {
			uint a = p.w.v[wb + i], b = p.x.v[xb + i];
			s += sbyte(a, 0u) * sbyte(b, 0u) + sbyte(a, 1u) * sbyte(b, 1u) + sbyte(a, 2u) * sbyte(b, 2u) + sbyte(a, 3u) * sbyte(b, 3u);
		}
		precise float dd = uintBitsToFloat(p.w.v[wb]) * uintBitsToFloat(p.x.v[xb]);
		precise float r = float(s) * dd;
		return r;
	}
	// K-quants against Q8_K activations: per 256 elements, d as float32 bits
	// and 64 words of int8. Unit u is elements 32u..32u+31.
	uint sb = u >> 3, j = u & 7u;
	uint xb = m * p.xStride + sb * 65u;
	float yd = uintBitsToFloat(p.x.v[xb]);
	if (WTYPE == W_Q4_K) {
		uint wb = (n * (p.K / 256u) + sb) * 36u;
		vec2 dm = unpackHalf2x16(p.w.v[wb]);
		// The 6-bit scale and min of sub-block j (hal/cpu's scaleMinK4).
		uint s0 = byteAt(p.w, wb * 4u + 4u + j);
		uint sc, mn;
		if (j < 4u) {
			sc = s0 & 63u;
			mn = byteAt(p.w, wb * 4u + 8u + j) & 63u;
		} else {
			uint sj4 = byteAt(p.w, wb * 4u + 4u + j + 4u);
			sc = (sj4 & 0xfu) | ((byteAt(p.w, wb * 4u + 4u + j - 4u) >> 6) << 4);
			mn = (sj4 >> 4) | ((byteAt(p.w, wb * 4u + 4u + j) >> 6) << 4);
		}
		uint shift = (j & 1u) * 4u;
		uint qw = wb + 4u + (j >> 1) * 8u;
		int s = 0, ys = 0;
		for (uint i = 0u; i < 8u; i++) {
			uint a = p.w.v[qw + i] >> shift, b = p.x.v[xb + 1u + j * 8u + i];
			for (uint k = 0u; k < 4u; k++) {
				int y = sbyte(b, k);
				s += int((a >> (8u * k)) & 15u) * y;
				ys += y;
			}
		}
		precise float dq = dm.x * yd;
		precise float dmq = dm.y * yd;
		precise float r = dq * float(int(sc) * s) - dmq * float(int(mn) * ys);
		return r;
	}
	// W_Q6_K: 53 words per super-block. Unit j is half h = j/4, run k = j%4:
	// element 128h+32k+l takes the low (k<2) or high nibble of
	// ql[64h+l+32(k&1)] and bits 2k..2k+1 of qh[32h+l], minus 32; scales
	// 8h+2k (l<16) and 8h+2k+1.
	uint wb = (n * (p.K / 256u) + sb) * 53u;
	uint h = j >> 2, k = j & 3u;
	uint qlw = wb + 16u * h + 8u * (k & 1u), qhw = wb + 32u + 8u * h;
	uint nshift = (k >> 1) * 4u, hshift = 2u * k;
	int s0 = 0, s1 = 0;
	for (uint i = 0u; i < 8u; i++) {
		uint a = p.w.v[qlw + i] >> nshift, hb = p.w.v[qhw + i] >> hshift, b = p.x.v[xb + 1u + j * 8u + i];
		for (uint c = 0u; c < 4u; c++) {
			int q = int(((a >> (8u * c)) & 15u) | (((hb >> (8u * c)) & 3u) << 4)) - 32;
			int prod = q * sbyte(b, c);
			if (i < 4u) s0 += prod; else s1 += prod;
		}
	}
	uint scw = p.w.v[wb + 48u + (8u * h + 2u * k) / 4u];
	uint scs = ((8u * h + 2u * k) & 3u) * 8u;
	int sc0 = int(scw << (24u - scs)) >> 24, sc1 = int(scw << (16u - scs)) >> 24;
	float d = unpackHalf2x16(p.w.v[wb + 52u]).x;
	precise float dq = d * yd;
	precise float r = dq * float(sc0 * s0 + sc1 * s1);
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
			uint n = min(n0 + j, p.N - 1u);
			for (uint i = 0u; i < TM; i++) {
				uint m = min(m0 + i, p.M - 1u);
				acc[i * TN + j] += term(n, m, u);
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
