package vulkan

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
)

// attnCase is a batch of several sequences over scattered blocks: a
// prefill chunk of one, decode tokens of others.
type attnCase struct {
	layout      hal.KVLayout
	heads       int
	seqLens     []int // positions each sequence already has
	newTokens   []int // tokens each adds in the step
	batch       hal.AttnBatch
	tokens      int
	blocksOfSeq [][]int32
}

func newAttnCase(r *rand.Rand, l hal.KVLayout, heads int, have, add []int) *attnCase {
	c := &attnCase{layout: l, heads: heads, seqLens: have, newTokens: add}
	perm := r.Perm(l.Blocks)
	next := 0
	for s := range have {
		n := (have[s] + add[s] + l.BlockSize - 1) / l.BlockSize
		var t []int32
		for range n {
			t = append(t, int32(perm[next]))
			next++
		}
		c.batch.Blocks = append(c.batch.Blocks, t)
		for i := range add[s] {
			c.batch.Pos = append(c.batch.Pos, int32(have[s]+i))
			c.batch.SeqOf = append(c.batch.SeqOf, int32(s))
		}
	}
	c.tokens = len(c.batch.Pos)
	return c
}

// history is a batch that stores every sequence's earlier positions.
func (c *attnCase) history() *hal.AttnBatch {
	h := &hal.AttnBatch{Blocks: c.batch.Blocks}
	for s, n := range c.seqLens {
		for p := range n {
			h.Pos = append(h.Pos, int32(p))
			h.SeqOf = append(h.SeqOf, int32(s))
		}
	}
	return h
}

// runAttn stores the history and the step's keys and values on be and
// returns the step's attention output and the store.
func runAttn(t *testing.T, be hal.Backend, c *attnCase, layer int, hk, hv, k, v, q []float32) ([]float32, hal.KVStore) {
	t.Helper()
	kv, err := be.NewKVStore(c.layout)
	if err != nil {
		t.Fatal(err)
	}
	h := c.history()
	if len(h.Pos) > 0 {
		be.StoreKV(kv, layer, upload(t, be, hk), upload(t, be, hv), h)
	}
	be.StoreKV(kv, layer, upload(t, be, k), upload(t, be, v), &c.batch)
	out := upload(t, be, make([]float32, len(q)))
	be.Attention(out, upload(t, be, q), c.heads, float32(1/math.Sqrt(float64(c.layout.HeadDim))), kv, layer, &c.batch)
	return download(t, be, out, len(q)), kv
}

func TestAttention(t *testing.T) {
	ref := cpu.New(1)
	defer ref.Close()
	r := rand.New(rand.NewPCG(9, 10))
	for _, cfg := range configs {
		b := testBackend(t, cfg.opts)
		for _, c := range []struct {
			name        string
			layout      hal.KVLayout
			heads       int
			have, added []int
		}{
			{"decode gqa", hal.KVLayout{Layers: 2, Blocks: 40, BlockSize: 16, KVHeads: 2, HeadDim: 64}, 8, []int{70, 3, 33}, []int{1, 1, 1}},
			{"prefill and decode", hal.KVLayout{Layers: 2, Blocks: 40, BlockSize: 16, KVHeads: 2, HeadDim: 16}, 4, []int{0, 40}, []int{37, 1}},
			{"f16 store", hal.KVLayout{Layers: 1, Blocks: 30, BlockSize: 16, KVHeads: 4, HeadDim: 32, DType: hal.F16}, 4, []int{5, 100}, []int{20, 1}},
			{"head 8 block 8", hal.KVLayout{Layers: 1, Blocks: 64, BlockSize: 8, KVHeads: 4, HeadDim: 8}, 8, []int{0, 65}, []int{64, 2}},
			{"head 128 odd block", hal.KVLayout{Layers: 1, Blocks: 20, BlockSize: 5, KVHeads: 1, HeadDim: 128, DType: hal.F16}, 2, []int{11}, []int{3}},
		} {
			t.Run(cfg.name+"/"+c.name, func(t *testing.T) {
				ac := newAttnCase(r, c.layout, c.heads, c.have, c.added)
				row := c.layout.KVHeads * c.layout.HeadDim
				hn := len(ac.history().Pos)
				hk, hv := randVec(r, hn*row, 1), randVec(r, hn*row, 1)
				k, v := randVec(r, ac.tokens*row, 1), randVec(r, ac.tokens*row, 1)
				q := randVec(r, ac.tokens*c.heads*c.layout.HeadDim, 1)
				layer := c.layout.Layers - 1
				want, refKV := runAttn(t, ref, ac, layer, hk, hv, k, v, q)
				got, kv := runAttn(t, b, ac, layer, hk, hv, k, v, q)
				closeTo(t, "attention", got, want, 1e-5, 1e-5)

				// The stores hold the same bytes, block by block: cpu-kv/1.
				if kv.Format() != cpu.KVFormat || kv.Format() != refKV.Format() {
					t.Fatalf("format %q, hal/cpu %q", kv.Format(), refKV.Format())
				}
				gb, wb := make([]byte, c.layout.BlockBytes()), make([]byte, c.layout.BlockBytes())
				for blk := range c.layout.Blocks {
					if err := kv.ReadBlock(blk, gb); err != nil {
						t.Fatal(err)
					}
					if err := refKV.ReadBlock(blk, wb); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(gb, wb) {
						t.Fatalf("block %d: the stores' bytes differ", blk)
					}
				}

				// Batch invariance: each token alone gives its bits in the batch.
				hd := c.layout.HeadDim
				for i := range ac.tokens {
					one := &hal.AttnBatch{Pos: ac.batch.Pos[i : i+1], SeqOf: []int32{0}, Blocks: [][]int32{ac.batch.Blocks[ac.batch.SeqOf[i]]}}
					out := upload(t, b, make([]float32, c.heads*hd))
					b.Attention(out, upload(t, b, q[i*c.heads*hd:(i+1)*c.heads*hd]), c.heads, float32(1/math.Sqrt(float64(hd))), kv, layer, one)
					alone := download(t, b, out, c.heads*hd)
					for j, x := range alone {
						if math.Float32bits(x) != math.Float32bits(got[i*c.heads*hd+j]) {
							t.Fatalf("token %d alone: %g, in the batch %g", i, x, got[i*c.heads*hd+j])
						}
					}
				}
			})
		}
	}
}

// Blocks written into a Vulkan store from a CPU store's bytes (a KV
// transfer between the backends) give the attention the CPU computes over
// its own; WriteBlock, ReadBlock and CopyBlock round-trip.
func TestKVBlockIO(t *testing.T) {
	ref := cpu.New(1)
	defer ref.Close()
	r := rand.New(rand.NewPCG(11, 12))
	for _, cfg := range configs {
		for _, dt := range []hal.DType{hal.F32, hal.F16} {
			t.Run(fmt.Sprintf("%s/%v", cfg.name, dt), func(t *testing.T) {
				b := testBackend(t, cfg.opts)
				l := hal.KVLayout{Layers: 3, Blocks: 12, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: dt}
				ac := newAttnCase(r, l, 4, []int{50}, []int{1})
				row := l.KVHeads * l.HeadDim
				hk, hv := randVec(r, 50*row, 1), randVec(r, 50*row, 1)
				k, v, q := randVec(r, row, 1), randVec(r, row, 1), randVec(r, 4*l.HeadDim, 1)
				want, refKV := runAttn(t, ref, ac, 1, hk, hv, k, v, q)

				kv, err := b.NewKVStore(l)
				if err != nil {
					t.Fatal(err)
				}
				if got := kv.Bytes(); got != int64(l.BlockBytes()*l.Blocks) {
					t.Errorf("Bytes %d, want %d", got, l.BlockBytes()*l.Blocks)
				}
				buf := make([]byte, l.BlockBytes())
				for blk := range l.Blocks {
					if err := refKV.ReadBlock(blk, buf); err != nil {
						t.Fatal(err)
					}
					if err := kv.WriteBlock(blk, buf); err != nil {
						t.Fatal(err)
					}
				}
				out := upload(t, b, make([]float32, len(q)))
				b.Attention(out, upload(t, b, q), 4, float32(1/math.Sqrt(16)), kv, 1, &ac.batch)
				closeTo(t, "attention over transferred blocks", download(t, b, out, len(q)), want, 1e-5, 1e-5)

				// CopyBlock: the copy reads back as its source.
				src, dst := int(ac.batch.Blocks[0][1]), int(ac.batch.Blocks[0][0])
				kv.CopyBlock(dst, src)
				a, c := make([]byte, l.BlockBytes()), make([]byte, l.BlockBytes())
				if err := kv.ReadBlock(dst, a); err != nil {
					t.Fatal(err)
				}
				if err := refKV.ReadBlock(src, c); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(a, c) {
					t.Error("CopyBlock: the copy differs from its source")
				}
				for _, bad := range []struct {
					block, n int
					want     string
				}{{-1, l.BlockBytes(), "block -1"}, {l.Blocks, l.BlockBytes(), "block 12 of 12"}, {0, 3, "3 bytes"}} {
					if err := kv.ReadBlock(bad.block, make([]byte, bad.n)); err == nil || !strings.Contains(err.Error(), bad.want) {
						t.Errorf("ReadBlock(%d, %d bytes) = %v, want an error naming %q", bad.block, bad.n, err, bad.want)
					}
				}
				if err := b.Err(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestNewKVStoreRefuses(t *testing.T) {
	b := testBackend(t, Options{Device: -1})
	for _, l := range []hal.KVLayout{
		{Layers: 0, Blocks: 1, BlockSize: 16, KVHeads: 1, HeadDim: 8},
		{Layers: 1, Blocks: 1, BlockSize: 16, KVHeads: 1, HeadDim: 8, DType: hal.Q8_0},
		{Layers: 1, Blocks: 1, BlockSize: 3, KVHeads: 1, HeadDim: 3, DType: hal.F16},
		{Layers: 1, Blocks: 1, BlockSize: 16, KVHeads: 1, HeadDim: 512},
	} {
		if _, err := b.NewKVStore(l); err == nil {
			t.Errorf("NewKVStore(%+v) succeeded", l)
		}
	}
}
