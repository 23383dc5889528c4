// Shared declarations of the hal/vulkan compute shaders. Buffers are reached
// through device addresses in push constants (GL_EXT_buffer_reference), so
// no shader has descriptor sets: a dispatch is its pipeline, its push
// constants and its grid, which is what a recorded step replays.
#extension GL_EXT_buffer_reference : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Ints { int v[]; };

// Weight and activation encodings (Go: the wtype and qtype constants).
const uint W_F32 = 0u;  // float32 rows
const uint W_F16 = 1u;  // FP16 rows, two to a word, as in the file
const uint W_Q8_0 = 2u; // per 32 elements: the scale as float32 bits, then 8 words of int8
const uint W_Q4_K = 3u; // ggml's 144-byte super-blocks, as in the file
const uint W_Q6_K = 4u; // ggml's 210-byte super-blocks, padded to 212 bytes
const uint W_BF16 = 5u; // bfloat16 rows, two to a word, as in the file

// foldedGroup is the flat index of a workgroup in a grid whose x extent was folded
// into z to stay under the 65535 limit on one dimension.
uint foldedGroup(uint tilesX) { return gl_WorkGroupID.x + gl_WorkGroupID.z * tilesX; }

// foldedRow is the row (token) index of a grid whose rows were folded into
// z past 65535 (Go: foldRows); the workgroups are one row high.
uint foldedRow() { return gl_WorkGroupID.y + gl_WorkGroupID.z * 65535u; }

// half16 reads element e of a packed FP16 array.
float half16(Words b, uint e) {
	uint w = b.v[e >> 1];
	return unpackHalf2x16((e & 1u) != 0u ? w >> 16 : w).x;
}

// toHalf narrows f to IEEE binary16 bits, rounding to nearest even, as
// hal/cpu's FP32ToFP16 does (the conversion instructions leave the rounding
// to the implementation).
uint toHalf(float f) {
	uint bits = floatBitsToUint(f);
	uint sign = (bits >> 16) & 0x8000u;
	uint a = bits & 0x7fffffffu;
	if (a > 0x7f800000u) return sign | 0x7e00u;
	if (a >= 0x47800000u) return sign | 0x7c00u;
	if (a >= 0x38800000u) {
		uint h = (a - 0x38000000u) >> 13;
		uint rest = a & 0x1fffu;
		if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) h++;
		return sign | h;
	}
	uint e = a >> 23;
	if (e < 102u) return sign;
	uint mant = (a & 0x7fffffu) | 0x800000u;
	uint shift = 126u - e;
	uint h = mant >> shift;
	uint rest = mant & ((1u << shift) - 1u);
	uint halfway = 1u << (shift - 1u);
	if (rest > halfway || (rest == halfway && (h & 1u) != 0u)) h++;
	return sign | h;
}

// bf16 reads element e of a packed bfloat16 array (exactly).
float bf16(Words b, uint e) {
	uint w = b.v[e >> 1];
	return uintBitsToFloat((e & 1u) != 0u ? w & 0xffff0000u : w << 16);
}

// toBF16 narrows f to bfloat16 bits, rounding to nearest even (NaN stays a
// quiet NaN), as hal/cpu's FP32ToBF16.
uint toBF16(float f) {
	uint bits = floatBitsToUint(f);
	if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;
	return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

float roundHalf(float f) { return unpackHalf2x16(toHalf(f)).x; }

// byteAt is byte i of a word array; sbyte the same as a signed value.
uint byteAt(Words b, uint i) { return (b.v[i >> 2] >> ((i & 3u) * 8u)) & 0xffu; }
int sbyte(uint w, uint k) { return int(w << (24u - 8u * k)) >> 24; }
