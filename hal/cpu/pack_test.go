package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// TestPackedMatMulBitEqual: for every format with a packed kernel on this
// CPU, MatMul through the packed layout gives every output element the
// bits of the pure-Go reference dot product, for weight row counts that
// are and are not multiples of the group, one to nine activation rows
// (the 4-row kernel and the single-row tail), and any thread count.
func TestPackedMatMulBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	tested := 0
	for _, typ := range dotTestWeightTypes {
		if packFormatFor(kern.isa, typ) == nil {
			continue
		}
		tested++
		for _, shape := range []struct{ n, k int }{{1, 1}, {16, 1}, {17, 2}, {15, 3}, {33, 8}, {48, 28}} {
			n, k := shape.n, shape.k*32
			if typ.BlockSize() == 256 {
				k = shape.k * 256
			}
			var wd []byte
			for j := range n {
				wf := testRandRow(r, k)
				if j%3 == 1 {
					for i := range wf {
						wf[i] += 0.7 // all-positive blocks
					}
				}
				wd = append(wd, testQuantize(typ, wf)...)
			}
			w := &hal.Weight{Type: typ, Rows: n, Cols: k, Data: wd}
			x := make([]float32, 9*k)
			for i := range x {
				x[i] = float32(r.NormFloat64())
				if i%k < 32 && (i/k)%2 == 1 {
					x[i] = float32(math.Abs(float64(x[i]))) // a one-signed block
				}
			}
			vt := VecDotType(typ)
			xrb, _ := vt.RowBytes(k)
			wrb := w.RowBytes()
			for _, threads := range []int{1, 2} {
				be := New(threads)
				for rows := 0; rows <= 9; rows++ {
					out := make([]float32, rows*n)
					be.MatMul(out, x[:rows*k], rows, w)
					for m := range rows {
						xq := make([]byte, xrb)
						QuantizeRow(vt, x[m*k:(m+1)*k], xq)
						for j := range n {
							want := vecDotRef(typ, k, wd[j*wrb:(j+1)*wrb], xq)
							if got := out[m*n+j]; math.Float32bits(got) != math.Float32bits(want) {
								t.Fatalf("%v n=%d k=%d rows=%d threads=%d (m=%d, j=%d): packed %g, reference %g", typ, n, k, rows, threads, m, j, got, want)
							}
						}
					}
				}
				be.Close()
			}
		}
	}
	if tested == 0 {
		t.Skipf("no packed kernels for ISA %s on this CPU", kern.isa)
	}
}
