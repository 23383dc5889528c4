package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"tandem/hal"
)

// randKVF16 returns n FP16 values rounded from normal samples of the given spread.
func randKVF16(r *rand.Rand, n int, spread float64) []uint16 {
	x := make([]uint16, n)
	for i := range x {
		x[i] = FP32ToFP16(float32(r.NormFloat64() * spread))
	}
	return x
}

// TestAttnKernelsF16BitEqual holds the SIMD attention kernels over FP16 keys
// and values to the scalar loops bit for bit, under every ISA the CPU runs:
// head sizes the models use and others (multiples of 8 but not of 16 too),
// position counts that do and do not fill the last block or a vector, one
// position, and blocks in scattered order.
func TestAttnKernelsF16BitEqual(t *testing.T) {
	const bs = 16
	r := rand.New(rand.NewPCG(53, 54))
	isas := append([]string{"go"}, simdISAs()...)
	tested := 0
	for _, isa := range isas {
		for _, hd := range []int{8, 16, 24, 32, 48, 64, 80, 96, 128, 256} {
			ak := attnKernelsF16For(isa, hd, bs)
			if ak == nil {
				continue
			}
			tested++
			const blocks = 9
			k := randKVF16(r, blocks*bs*hd, 1)
			v := randKVF16(r, blocks*bs*hd, 1)
			// FP16's edges among them: subnormals, ±0, the largest finite values.
			for _, h := range []uint16{0x0001, 0x83ff, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400} {
				k[r.IntN(len(k))], v[r.IntN(len(v))] = h, h
			}
			q := testRandRow(r, hd)
			for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 100, blocks * bs} {
				nblk := (n + bs - 1) / bs
				offs := make([]int32, nblk)
				for i, p := range r.Perm(blocks)[:nblk] {
					offs[i] = int32(p * bs * hd)
				}
				got, want := make([]float32, nblk*bs), make([]float32, nblk*bs)
				ak.scores(q, k, offs, 0.125, got)
				attnScoresF16Ref(q, k, offs, bs, 0.125, want)
				for j := range want {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						t.Fatalf("%s hd=%d n=%d: score %d: SIMD %g, scalar %g", isa, hd, n, j, got[j], want[j])
					}
				}
				w := make([]float32, n)
				for j := range w {
					w[j] = r.Float32()
				}
				og, ow := make([]float32, hd), make([]float32, hd)
				for i := range og {
					og[i] = 99 // overwritten, not accumulated into
				}
				ak.accumV(og, v, offs, w)
				attnAccumVF16Ref(ow, v, offs, bs, w)
				for i := range ow {
					if math.Float32bits(og[i]) != math.Float32bits(ow[i]) {
						t.Fatalf("%s hd=%d n=%d: out %d: SIMD %g, scalar %g", isa, hd, n, i, og[i], ow[i])
					}
				}
			}
		}
	}
	if tested == 0 {
		t.Skipf("no SIMD F16 attention kernels on this CPU (ISAs %v)", isas)
	}
}

// TestAttentionF16Store: an F16 store holds each stored key and value
// rounded to nearest even, in the F32 store's arrangement, and attention
// over it gives the bits of attention over an F32 store that was given the
// rounded values (widening is exact, and the float32 operations are the
// same), for several head and block sizes and a batch of two sequences.
func TestAttentionF16Store(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	be := New(2)
	defer be.Close()
	for _, c := range []struct{ hd, bs, heads, kvHeads int }{
		{64, 16, 4, 2}, {128, 16, 2, 1}, {8, 16, 4, 4}, {16, 4, 2, 1}, {24, 16, 2, 2},
	} {
		t.Run(fmt.Sprintf("hd%d_bs%d", c.hd, c.bs), func(t *testing.T) {
			// Sequence 0: 37 positions, sequence 1: 5.
			batch, next := prefillBatch([]int{37, 5}, c.bs)
			for _, tb := range batch.Blocks { // blocks backwards, so the test depends on the tables
				for i := range tb {
					tb[i] = next - 1 - tb[i]
				}
			}
			tokens := len(batch.Pos)
			row := c.kvHeads * c.hd
			k, v := testRandRow(r, tokens*row), testRandRow(r, tokens*row)
			for i := range k {
				k[i] *= 3
			}
			kr, vr := make([]float32, len(k)), make([]float32, len(v))
			for i := range k {
				kr[i], vr[i] = FP16ToFP32(FP32ToFP16(k[i])), FP16ToFP32(FP32ToFP16(v[i]))
			}
			l := hal.KVLayout{Layers: 2, Blocks: int(next), BlockSize: c.bs, KVHeads: c.kvHeads, HeadDim: c.hd}
			st32, err := be.NewKVStore(l)
			if err != nil {
				t.Fatal(err)
			}
			l.DType = hal.F16
			st16, err := be.NewKVStore(l)
			if err != nil {
				t.Fatal(err)
			}
			if st16.Bytes()*2 != st32.Bytes() {
				t.Errorf("F16 store %d bytes, F32 %d", st16.Bytes(), st32.Bytes())
			}
			be.StoreKV(st32, 1, hal.HostBuf(kr), hal.HostBuf(vr), batch)
			be.StoreKV(st16, 1, hal.HostBuf(k), hal.HostBuf(v), batch)
			s32, s16 := st32.(*kvStore), st16.(*kvStore)
			for i := range s32.k[1] {
				if FP32ToFP16(s32.k[1][i]) != s16.k16[1][i] || FP32ToFP16(s32.v[1][i]) != s16.v16[1][i] {
					t.Fatalf("element %d: F16 store holds %#04x, %#04x; F32 store %g, %g", i, s16.k16[1][i], s16.v16[1][i], s32.k[1][i], s32.v[1][i])
				}
			}
			q := testRandRow(r, tokens*c.heads*c.hd)
			o32, o16 := make([]float32, len(q)), make([]float32, len(q))
			be.Attention(hal.HostBuf(o32), hal.HostBuf(q), c.heads, 0.125, st32, 1, batch)
			be.Attention(hal.HostBuf(o16), hal.HostBuf(q), c.heads, 0.125, st16, 1, batch)
			for i := range o32 {
				if math.Float32bits(o32[i]) != math.Float32bits(o16[i]) {
					t.Fatalf("out %d: F16 store %g, F32 store of the rounded values %g", i, o16[i], o32[i])
				}
			}
			// CopyBlock moves an F16 block whole.
			st16.CopyBlock(0, int(batch.Blocks[0][0]))
			n := c.bs * c.kvHeads * c.hd
			o := int(batch.Blocks[0][0]) * n
			for i := range n {
				if s16.k16[1][i] != s16.k16[1][o+i] || s16.v16[1][i] != s16.v16[1][o+i] {
					t.Fatalf("CopyBlock: element %d differs", i)
				}
			}
		})
	}
}

// TestNewKVStoreTypes: F32 and F16 stores are made; other element types
// are refused with an error that names the type and the supported ones.
func TestNewKVStoreTypes(t *testing.T) {
	be := New(1)
	defer be.Close()
	for _, c := range []struct {
		t    hal.DType
		want string // "" for a store
	}{{hal.F32, ""}, {hal.F16, ""}, {hal.BF16, "BF16 is not supported"}, {hal.Q8_0, "Q8_0 is not supported"}} {
		st, err := be.NewKVStore(hal.KVLayout{Layers: 1, Blocks: 2, BlockSize: 16, KVHeads: 1, HeadDim: 8, DType: c.t})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.t, err)
		case c.want == "" && st.Layout().DType != c.t:
			t.Errorf("%v: store of %v", c.t, st.Layout().DType)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "F16")):
			t.Errorf("%v: error %v, want one containing %q", c.t, err, c.want)
		}
	}
}

// BenchmarkAttnKernels times one head's scores and weighted value sum over
// a long context, F32 and F16 KV, with each ISA's kernels and the scalar
// loops. Bytes per op are the keys and values read. "cache": the same head
// every time (4 MiB of F32 KV at head size 128, in L3); "mem": a different
// head each time, from 128 MiB of F32 KV (64 MiB of F16), so the keys and
// values come from memory, as in a decode step over long contexts.
func BenchmarkAttnKernels(b *testing.B) {
	const bs, n = 16, 4096
	r := rand.New(rand.NewPCG(57, 58))
	for _, hd := range []int{64, 128} {
		for _, where := range []string{"cache", "mem"} {
			heads := 1
			if where == "mem" {
				heads = (128 << 20) / (n * hd * 8)
			}
			nblk := n / bs
			offs := make([][]int32, heads)
			for h := range offs {
				offs[h] = make([]int32, nblk)
				for i, p := range r.Perm(nblk) {
					offs[h][i] = int32((h*nblk + p) * bs * hd)
				}
			}
			q := testRandRow(r, hd)
			k32, v32 := testRandRow(r, heads*n*hd), testRandRow(r, heads*n*hd)
			k16, v16 := randKVF16(r, heads*n*hd, 1), randKVF16(r, heads*n*hd, 1)
			sc, o := make([]float32, n), make([]float32, hd)
			w := make([]float32, n)
			for i := range w {
				w[i] = r.Float32() / n
			}
			for _, isa := range append(simdISAs(), "go") {
				b.Run(fmt.Sprintf("f32/hd%d/%s/%s", hd, where, isa), func(b *testing.B) {
					ak := attnKernelsFor(isa, hd, bs)
					if ak == nil && isa != "go" {
						b.Skipf("no F32 attention kernels for %s", isa)
					}
					b.SetBytes(int64(2 * n * hd * 4))
					h := 0
					for b.Loop() {
						h = (h + 1) % heads
						if ak != nil {
							ak.scores(q, k32, offs[h], 0.125, sc)
							ak.accumV(o, v32, offs[h], w)
						} else {
							attnScoresRef(q, k32, offs[h], bs, 0.125, sc)
							attnAccumVRef(o, v32, offs[h], bs, w)
						}
					}
				})
				b.Run(fmt.Sprintf("f16/hd%d/%s/%s", hd, where, isa), func(b *testing.B) {
					ak := attnKernelsF16For(isa, hd, bs)
					if ak == nil && isa != "go" {
						b.Skipf("no F16 attention kernels for %s", isa)
					}
					b.SetBytes(int64(2 * n * hd * 2))
					h := 0
					for b.Loop() {
						h = (h + 1) % heads
						if ak != nil {
							ak.scores(q, k16, offs[h], 0.125, sc)
							ak.accumV(o, v16, offs[h], w)
						} else {
							attnScoresF16Ref(q, k16, offs[h], bs, 0.125, sc)
							attnAccumVF16Ref(o, v16, offs[h], bs, w)
						}
					}
				})
			}
		}
	}
	benchAttnGroups(b)
}

// prefillBatch is a batch of every position of sequences of lens positions,
// each given the next unused blocks of bs positions in turn; blocks is how
// many that takes.
func prefillBatch(lens []int, bs int) (batch *hal.AttnBatch, blocks int32) {
	batch = &hal.AttnBatch{}
	for s, n := range lens {
		var tb []int32
		for range (n + bs - 1) / bs {
			tb = append(tb, blocks)
			blocks++
		}
		batch.Blocks = append(batch.Blocks, tb)
		for p := range n {
			batch.Pos = append(batch.Pos, int32(p))
			batch.SeqOf = append(batch.SeqOf, int32(s))
		}
	}
	return batch, blocks
}
