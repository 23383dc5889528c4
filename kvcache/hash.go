package kvcache

import (
	"encoding/binary"
	"math/bits"
)

// HashVersion is the version of the block hashing scheme described in
// docs/block-hashing.md. Engines and routers exchange it with the block size and
// salt; hashes of different versions must never be compared.
const HashVersion = 1

// XXH64 primes.
const (
	prime1 uint64 = 0x9E3779B185EBCA87
	prime2 uint64 = 0xC2B2AE3D27D4EB4F
	prime3 uint64 = 0x165667B19E3779F9
	prime4 uint64 = 0x85EBCA77C2B2AE63
	prime5 uint64 = 0x27D4EB2F165667C5
)

// Salt returns the salt of a model's block hashes: XXH64 (seed 0) of the three
// strings, each preceded by its length in bytes as a little-endian uint32. An empty
// namespace is the default cache namespace; an empty lora is the base model.
func Salt(model, namespace, lora string) uint64 {
	b := make([]byte, 0, 12+len(model)+len(namespace)+len(lora))
	for _, s := range [...]string{model, namespace, lora} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return xxh64(b, 0)
}

// HashBlocks appends to dst the sequence hashes of the full blocks of tokens, cut
// into blocks of blockSize tokens, and returns the extended slice. A trailing partial
// block is not hashed. The first block's parent is 0. It panics if blockSize < 1.
//
// To reuse a buffer, pass dst[:0]; HashBlocks allocates only when dst lacks capacity.
func HashBlocks(salt uint64, tokens []int32, blockSize int, dst []uint64) []uint64 {
	if blockSize < 1 {
		panic("kvcache: block size must be positive")
	}
	var parent uint64
	for len(tokens) >= blockSize {
		parent = HashBlock(salt, parent, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// HashBlock returns the sequence hash of a full block of tokens whose parent block
// has sequence hash parent (0 for a sequence's first block). It is the incremental
// form of [HashBlocks]: feeding a sequence's blocks in order, each with the previous
// result as parent, yields the same hashes. The caller ensures len(block) is the
// block size.
func HashBlock(salt, parent uint64, block []int32) uint64 {
	return chain(salt, parent, localHash(salt, block))
}

// chain returns XXH64(le64(parent) ‖ le64(local), salt), specialised for 16 bytes.
func chain(salt, parent, local uint64) uint64 {
	h := salt + prime5 + 16
	h ^= round(0, parent)
	h = bits.RotateLeft64(h, 27)*prime1 + prime4
	h ^= round(0, local)
	h = bits.RotateLeft64(h, 27)*prime1 + prime4
	return avalanche(h)
}

// localHash returns XXH64 of the tokens as little-endian uint32s, seeded by salt,
// reading the tokens in place.
func localHash(seed uint64, t []int32) uint64 {
	n := uint64(len(t)) * 4
	var h uint64
	if len(t) >= 8 {
		v1 := seed + prime1 + prime2
		v2 := seed + prime2
		v3 := seed
		v4 := seed - prime1
		for ; len(t) >= 8; t = t[8:] {
			v1 = round(v1, pair(t[0], t[1]))
			v2 = round(v2, pair(t[2], t[3]))
			v3 = round(v3, pair(t[4], t[5]))
			v4 = round(v4, pair(t[6], t[7]))
		}
		h = mergeLanes(v1, v2, v3, v4)
	} else {
		h = seed + prime5
	}
	h += n
	for ; len(t) >= 2; t = t[2:] {
		h ^= round(0, pair(t[0], t[1]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(t) == 1 {
		h ^= uint64(uint32(t[0])) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
	}
	return avalanche(h)
}

// pair is the little-endian 8-byte lane holding tokens a then b.
func pair(a, b int32) uint64 { return uint64(uint32(a)) | uint64(uint32(b))<<32 }

// xxh64 is XXH64 over bytes, as specified by the xxHash project.
func xxh64(b []byte, seed uint64) uint64 {
	n := uint64(len(b))
	var h uint64
	if len(b) >= 32 {
		v1 := seed + prime1 + prime2
		v2 := seed + prime2
		v3 := seed
		v4 := seed - prime1
		for ; len(b) >= 32; b = b[32:] {
			v1 = round(v1, binary.LittleEndian.Uint64(b[0:]))
			v2 = round(v2, binary.LittleEndian.Uint64(b[8:]))
			v3 = round(v3, binary.LittleEndian.Uint64(b[16:]))
			v4 = round(v4, binary.LittleEndian.Uint64(b[24:]))
		}
		h = mergeLanes(v1, v2, v3, v4)
	} else {
		h = seed + prime5
	}
	h += n
	for ; len(b) >= 8; b = b[8:] {
		h ^= round(0, binary.LittleEndian.Uint64(b))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b)) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	return avalanche(h)
}

func round(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func mergeRound(acc, val uint64) uint64 {
	acc ^= round(0, val)
	return acc*prime1 + prime4
}

func mergeLanes(v1, v2, v3, v4 uint64) uint64 {
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) +
		bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = mergeRound(h, v1)
	h = mergeRound(h, v2)
	h = mergeRound(h, v3)
	return mergeRound(h, v4)
}

func avalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}
