package kvcache

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// sanityBuffer is the input of xxHash's own self-test (xxhsum): byte i is the top
// byte of PRIME32_1 · PRIME64_1^i.
func sanityBuffer(n int) []byte {
	const prime32 = 2654435761
	b := make([]byte, n)
	gen := uint64(prime32)
	for i := range b {
		b[i] = byte(gen >> 56)
		gen *= 11400714785074694797
	}
	return b
}

func TestXXH64Vectors(t *testing.T) {
	const prime32 = 2654435761
	buf := sanityBuffer(2367)
	tests := []struct {
		n    int
		seed uint64
		want uint64
	}{
		// The official XXH64 sanity-check vectors.
		{0, 0, 0xEF46DB3751D8E999},
		{0, prime32, 0xAC75FDA2929B17EF},
		{1, 0, 0xE934A84ADB052768},
		{1, prime32, 0x5014607643A9B4C3},
		{4, 0, 0x9136A0DCA57457EE},
		{14, 0, 0x8282DCC4994E35C8},
		{14, prime32, 0xC3BD6BF63DEB6DF0},
		{222, 0, 0xB641AE8CB691C174},
		{222, prime32, 0x20CB8AB7AE10C14A},
		// Checked against libxxhash 0.8.1.
		{4, prime32, 0xCAAB286BD8E9FDB5},
		{2367, 0, 0xA82418DDEC0EA581},
		{2367, prime32, 0xA36A93C18052673A},
	}
	for _, tt := range tests {
		if got := xxh64(buf[:tt.n], tt.seed); got != tt.want {
			t.Errorf("xxh64(sanity[:%d], %#x) = %#x, want %#x", tt.n, tt.seed, got, tt.want)
		}
	}
	strs := []struct {
		s    string
		want uint64
	}{
		{"a", 0xD24EC4F1A98C6E5B},
		{"abc", 0x44BC2CF5AD770999},
		{"The quick brown fox jumps over the lazy dog", 0x0B242D361FDA71BC},
	}
	for _, tt := range strs {
		if got := xxh64([]byte(tt.s), 0); got != tt.want {
			t.Errorf("xxh64(%q) = %#x, want %#x", tt.s, got, tt.want)
		}
	}
}

func tokenBytes(t []int32) []byte {
	b := make([]byte, 0, 4*len(t))
	for _, x := range t {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

// localHash and chain are XXH64 specialised for tokens and for two uint64s.
func TestSpecialisedHashesMatchXXH64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 80 {
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32(r.Uint32())
		}
		seed := r.Uint64()
		if got, want := localHash(seed, toks), xxh64(tokenBytes(toks), seed); got != want {
			t.Fatalf("localHash(%d tokens) = %#x, want %#x", n, got, want)
		}
		a, b := r.Uint64(), r.Uint64()
		buf := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, a), b)
		if got, want := chain(seed, a, b), xxh64(buf, seed); got != want {
			t.Fatalf("chain = %#x, want %#x", got, want)
		}
	}
}

func iota32(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i)
	}
	return t
}

// Golden values of the v1 scheme, computed independently with libxxhash from
// docs/block-hashing.md. A change here is a wire-format change: bump HashVersion.
func TestHashGolden(t *testing.T) {
	salt := Salt("Qwen/Qwen3-0.6B", "", "")
	if salt != 0x7D38246F2D3EF01C {
		t.Errorf("Salt = %#x", salt)
	}
	if got := Salt("", "", ""); got != 0xEF6EB604187A17FA {
		t.Errorf("Salt of empty strings = %#x", got)
	}
	if got := Salt("Qwen/Qwen3-0.6B", "team-a", "sql-lora"); got != 0x5168CDE81BAACD1F {
		t.Errorf("Salt with namespace and lora = %#x", got)
	}
	got := HashBlocks(salt, iota32(40), 16, nil)
	want := []uint64{0xA1417577EF5914D2, 0xA3256096FA76BB82}
	if !slices.Equal(got, want) {
		t.Errorf("HashBlocks = %#x, want %#x", got, want)
	}
	neg := append([]int32{-1, 1<<31 - 1}, iota32(14)...)
	if got := HashBlocks(0, neg, 16, nil); !slices.Equal(got, []uint64{0xA3D8DD4B7A342512}) {
		t.Errorf("HashBlocks with extreme token ids = %#x", got)
	}
	if HashVersion != 1 {
		t.Errorf("HashVersion = %d; update the golden values and docs", HashVersion)
	}
}

func TestHashBlocks(t *testing.T) {
	salt := Salt("m", "", "")
	toks := iota32(100)
	tests := []struct {
		n, bs, blocks int
	}{
		{0, 16, 0},
		{15, 16, 0},
		{16, 16, 1},
		{17, 16, 1},
		{31, 16, 1},
		{32, 16, 2},
		{100, 16, 6},
		{100, 1, 100},
		{100, 7, 14},
	}
	for _, tt := range tests {
		got := HashBlocks(salt, toks[:tt.n], tt.bs, nil)
		if len(got) != tt.blocks {
			t.Errorf("HashBlocks(%d tokens, block %d): %d hashes, want %d", tt.n, tt.bs, len(got), tt.blocks)
			continue
		}
		// Chaining: each hash is HashBlock of its block under the previous one.
		var parent uint64
		for i, h := range got {
			if want := HashBlock(salt, parent, toks[i*tt.bs:(i+1)*tt.bs]); h != want {
				t.Errorf("n=%d bs=%d block %d: %#x, want chained %#x", tt.n, tt.bs, i, h, want)
			}
			parent = h
		}
		// Determinism, and appending to dst.
		again := HashBlocks(salt, toks[:tt.n], tt.bs, []uint64{42})
		if again[0] != 42 || !slices.Equal(again[1:], got) {
			t.Errorf("n=%d bs=%d: second run %#x, want [42] + %#x", tt.n, tt.bs, again, got)
		}
	}
}

func TestHashBlocksDependence(t *testing.T) {
	salt := Salt("m", "", "")
	base := iota32(64)
	h := HashBlocks(salt, base, 16, nil)

	// A prefix's hashes are the leading hashes.
	if p := HashBlocks(salt, base[:40], 16, nil); !slices.Equal(p, h[:2]) {
		t.Errorf("prefix hashes %#x, want %#x", p, h[:2])
	}
	// Changing a token of block 2 changes blocks 2 and 3 only.
	mod := slices.Clone(base)
	mod[37]++
	hm := HashBlocks(salt, mod, 16, nil)
	for i := range h {
		if same := hm[i] == h[i]; same != (i < 2) {
			t.Errorf("token 37 changed: block %d same=%v", i, same)
		}
	}
	// Swapping two tokens within a block changes it.
	sw := slices.Clone(base)
	sw[0], sw[1] = sw[1], sw[0]
	if HashBlocks(salt, sw, 16, nil)[0] == h[0] {
		t.Error("swapped tokens: same hash")
	}
	// A different salt changes every hash.
	for _, other := range []uint64{0, Salt("m", "ns", ""), Salt("m", "", "lora"), Salt("n", "", "")} {
		ho := HashBlocks(other, base, 16, nil)
		for i := range h {
			if ho[i] == h[i] {
				t.Errorf("salt %#x: block %d hash unchanged", other, i)
			}
		}
	}
	// The same block under a different parent differs.
	if HashBlock(salt, 0, base[16:32]) == h[1] {
		t.Error("block 1 hashed without its parent equals its chained hash")
	}
}

func TestSaltIsUnambiguous(t *testing.T) {
	salts := map[uint64][3]string{}
	for _, s := range [][3]string{
		{"ab", "c", ""}, {"a", "bc", ""}, {"abc", "", ""}, {"", "abc", ""},
		{"", "", "abc"}, {"a", "", "bc"}, {"", "", ""}, {"m", "", ""}, {"m", "", "x"},
	} {
		h := Salt(s[0], s[1], s[2])
		if prev, ok := salts[h]; ok {
			t.Errorf("Salt%q == Salt%q", s, prev)
		}
		salts[h] = s
		if Salt(s[0], s[1], s[2]) != h {
			t.Errorf("Salt%q not deterministic", s)
		}
	}
}

func TestHashBlocksDoesNotAllocate(t *testing.T) {
	toks := iota32(4096)
	dst := make([]uint64, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = HashBlocks(1, toks, 16, dst[:0]) }); n != 0 {
		t.Errorf("HashBlocks allocates %v times", n)
	}
}
