package hal

import (
	"slices"
	"testing"
)

func TestBufSlice(t *testing.T) {
	v := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	h := HostBuf(v).Slice(2, 7).Slice(1, 3)
	if h.Len() != 2 || !slices.Equal(h.Host(), []float32{3, 4}) || cap(h.Host()) != 2 {
		t.Errorf("host view: len %d, values %v (cap %d), want [3 4] (cap 2)", h.Len(), h.Host(), cap(h.Host()))
	}
	d := DeviceBuf(9, 100).Slice(10, 60).Slice(5, 15)
	if id, off := d.Device(); id != 9 || off != 15 || d.Len() != 10 || d.Host() != nil {
		t.Errorf("device view: id %d, offset %d, len %d, host %v; want 9, 15, 10, nil", id, off, d.Len(), d.Host())
	}
	for _, c := range []struct {
		name   string
		b      Buf
		lo, hi int
	}{
		{"host past the end", HostBuf(v), 0, 9},
		{"host negative", HostBuf(v), -1, 2},
		{"host reversed", HostBuf(v), 3, 2},
		{"device past the end", DeviceBuf(1, 4), 2, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Slice(%d, %d) of a Buf of %d did not panic", c.lo, c.hi, c.b.Len())
				}
			}()
			c.b.Slice(c.lo, c.hi)
		})
	}
}

func TestKVLayoutBlockBytes(t *testing.T) {
	l := KVLayout{Layers: 3, Blocks: 10, BlockSize: 16, KVHeads: 2, HeadDim: 64}
	if got, want := l.BlockBytes(), 3*2*16*2*64*4; got != want {
		t.Errorf("F32 block: %d bytes, want %d", got, want)
	}
	l.DType = F16
	if got, want := l.BlockBytes(), 3*2*16*2*64*2; got != want {
		t.Errorf("F16 block: %d bytes, want %d", got, want)
	}
}
