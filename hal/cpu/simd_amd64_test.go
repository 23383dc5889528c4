package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// TestF16FourRowKernel holds the (unused) AVX-512 4-row F16 kernel to the
// single-row kernel's bits.
func TestF16FourRowKernel(t *testing.T) {
	if !isaAvailable("avx512vnni") {
		t.Skip("no AVX-512")
	}
	one, four := wrapF16(true)
	r := rand.New(rand.NewPCG(29, 30))
	for _, n := range []int{1, 15, 16, 17, 261, 896, 1000} {
		w, xs := simdTestRows(r, hal.F16, n, 4, n%2 == 0)
		var xq []byte
		for _, x := range xs {
			xq = append(xq, x...)
		}
		var o [4]float32
		four(n, w, xq, len(xs[0]), &o)
		for i, x := range xs {
			if want := one(n, w, x); math.Float32bits(o[i]) != math.Float32bits(want) {
				t.Fatalf("n=%d row %d: 4-row %g, single %g", n, i, o[i], want)
			}
		}
	}
}
