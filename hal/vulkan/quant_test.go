package vulkan

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
)

// readConverted runs the activation conversion for enc and returns the
// converted rows as bytes.
func readConverted(t *testing.T, b *Backend, x []float32, rows, k, enc int) []byte {
	t.Helper()
	xb := upload(t, b, x)
	if !b.begin() {
		t.Fatal(b.Err())
	}
	if _, _, ok := b.convert(xb, rows, k, enc); !ok {
		t.Fatal(b.Err())
	}
	b.end()
	out := make([]byte, 4*convStride(vecDotConv(enc), k)*rows)
	if err := b.read(out, b.xq, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

// The activation conversions give hal/cpu's QuantizeRow bits: Q8_0 (scale,
// quants), Q8_K (scale, quants) and FP16, on random rows with ties, zeros
// and outliers.
func TestConvertActivations(t *testing.T) {
	b := testBackend(t, Options{Device: -1})
	r := rand.New(rand.NewPCG(13, 14))
	const rows, k = 7, 1024
	x := randVec(r, rows*k, 1)
	for i := 0; i < 256; i++ {
		x[i] = float32(r.IntN(7) - 3) // small integers: exact ties after scaling
	}
	for i := 256; i < 512; i++ {
		x[i] = 0 // an all-zero block
	}
	x[600] = 1e4
	for _, c := range []struct {
		enc int
		vt  hal.DType
	}{{encQ8_0, hal.Q8_0}, {encQ4_K, hal.Q8_K}, {encF16, hal.F16}, {encBF16, hal.BF16}} {
		got := readConverted(t, b, x, rows, k, c.enc)
		rb, _ := c.vt.RowBytes(k)
		want := make([]byte, rb)
		for m := range rows {
			cpu.QuantizeRow(c.vt, x[m*k:(m+1)*k], want)
			row := got[4*convStride(vecDotConv(c.enc), k)*m:]
			switch c.vt {
			case hal.F16, hal.BF16:
				for i := range k {
					if g, w := binary.LittleEndian.Uint16(row[2*i:]), binary.LittleEndian.Uint16(want[2*i:]); g != w {
						t.Fatalf("%v row %d element %d: %#x, hal/cpu %#x", c.vt, m, i, g, w)
					}
				}
			case hal.Q8_0:
				for blk := range k / 32 {
					g := row[36*blk : 36*blk+36]
					w := want[34*blk : 34*blk+34]
					if d := math.Float32frombits(binary.LittleEndian.Uint32(g)); d != cpu.FP16ToFP32(binary.LittleEndian.Uint16(w)) {
						t.Fatalf("Q8_0 row %d block %d: scale %g, hal/cpu %g", m, blk, d, cpu.FP16ToFP32(binary.LittleEndian.Uint16(w)))
					}
					for j := range 32 {
						if g[4+j] != w[2+j] {
							t.Fatalf("Q8_0 row %d block %d quant %d: %d, hal/cpu %d", m, blk, j, int8(g[4+j]), int8(w[2+j]))
						}
					}
				}
			case hal.Q8_K:
				for blk := range k / 256 {
					g := row[260*blk : 260*blk+260]
					w := want[292*blk : 292*blk+292]
					if binary.LittleEndian.Uint32(g) != binary.LittleEndian.Uint32(w) {
						t.Fatalf("Q8_K row %d block %d: scale %g, hal/cpu %g", m, blk, math.Float32frombits(binary.LittleEndian.Uint32(g)), math.Float32frombits(binary.LittleEndian.Uint32(w)))
					}
					for j := range 256 {
						if g[4+j] != w[4+j] {
							t.Fatalf("Q8_K row %d block %d quant %d: %d, hal/cpu %d", m, blk, j, int8(g[4+j]), int8(w[4+j]))
						}
					}
				}
			}
		}
	}
}
