package cpu

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// TestKVBlockIO moves every block of a sequence from one store to another
// through ReadBlock and WriteBlock, into other block numbers: attention over
// the copy, through the moved block table, gives the original's bits, for
// F32 and F16 stores; a block's bytes are each layer's keys then values.
func TestKVBlockIO(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	be := New(2)
	defer be.Close()
	const heads, kvHeads, hd, bs = 4, 2, 32, 16
	for _, dt := range []hal.DType{hal.F32, hal.F16} {
		t.Run(dt.String(), func(t *testing.T) {
			batch, blocks := prefillBatch([]int{37}, bs)
			l := hal.KVLayout{Layers: 2, Blocks: int(blocks) + 2, BlockSize: bs, KVHeads: kvHeads, HeadDim: hd, DType: dt}
			src, err := be.NewKVStore(l)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := be.NewKVStore(l)
			if err != nil {
				t.Fatal(err)
			}
			if src.Format() != KVFormat || KVFormat != "cpu-kv/1" {
				t.Fatalf("format %q, want %q", src.Format(), "cpu-kv/1")
			}
			tokens := len(batch.Pos)
			for layer := range l.Layers {
				k, v := testRandRow(r, tokens*kvHeads*hd), testRandRow(r, tokens*kvHeads*hd)
				be.StoreKV(src, layer, hal.HostBuf(k), hal.HostBuf(v), batch)
			}
			moved := &hal.AttnBatch{Pos: batch.Pos, SeqOf: batch.SeqOf, Blocks: [][]int32{make([]int32, blocks)}}
			buf := make([]byte, l.BlockBytes())
			for i, b := range batch.Blocks[0] {
				to := int32(l.Blocks) - 1 - int32(i)
				moved.Blocks[0][i] = to
				if err := src.ReadBlock(int(b), buf); err != nil {
					t.Fatal(err)
				}
				s, n := src.(*kvStore), layerBlockBytes(l)
				for layer := range l.Layers {
					if !bytes.Equal(buf[2*layer*n:(2*layer+1)*n], s.kb[layer][int(b)*n:int(b+1)*n]) ||
						!bytes.Equal(buf[(2*layer+1)*n:(2*layer+2)*n], s.vb[layer][int(b)*n:int(b+1)*n]) {
						t.Fatalf("block %d layer %d: the bytes read are not the layer's keys then values", b, layer)
					}
				}
				if err := dst.WriteBlock(int(to), buf); err != nil {
					t.Fatal(err)
				}
			}
			q := testRandRow(r, tokens*heads*hd)
			for layer := range l.Layers {
				want, got := make([]float32, len(q)), make([]float32, len(q))
				be.Attention(hal.HostBuf(want), hal.HostBuf(q), heads, 0.125, src, layer, batch)
				be.Attention(hal.HostBuf(got), hal.HostBuf(q), heads, 0.125, dst, layer, moved)
				for i := range want {
					if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
						t.Fatalf("layer %d out %d: %g over the moved blocks, %g over the original", layer, i, got[i], want[i])
					}
				}
			}
			if a := testing.AllocsPerRun(10, func() { _ = src.ReadBlock(0, buf); _ = dst.WriteBlock(1, buf) }); a != 0 {
				t.Errorf("block I/O allocates %v times", a)
			}
		})
	}
}

// layerBlockBytes is the bytes of one block in one layer's key array.
func layerBlockBytes(l hal.KVLayout) int { return l.BlockSize * l.KVHeads * l.HeadDim * l.ElemBytes() }

// TestKVBlockIOErrors: a block outside the store, or a buffer that is not
// one block, is refused with an error, and nothing is written.
func TestKVBlockIOErrors(t *testing.T) {
	be := New(1)
	defer be.Close()
	l := hal.KVLayout{Layers: 1, Blocks: 3, BlockSize: 4, KVHeads: 1, HeadDim: 8}
	st, err := be.NewKVStore(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		block int
		n     int
	}{
		{"negative block", -1, l.BlockBytes()},
		{"block past the end", 3, l.BlockBytes()},
		{"short buffer", 0, l.BlockBytes() - 1},
		{"long buffer", 0, l.BlockBytes() + 1},
	} {
		buf := bytes.Repeat([]byte{7}, c.n)
		if err := st.WriteBlock(c.block, buf); err == nil {
			t.Errorf("%s: WriteBlock(%d, %d bytes) = nil", c.name, c.block, c.n)
		}
		if err := st.ReadBlock(c.block, buf); err == nil {
			t.Errorf("%s: ReadBlock(%d, %d bytes) = nil", c.name, c.block, c.n)
		}
	}
	for _, b := range st.(*kvStore).kb[0] {
		if b != 0 {
			t.Fatal("a refused write wrote the store")
		}
	}
}
