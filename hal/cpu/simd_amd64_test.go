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

// TestSIMDTwoRowBitEqual holds every two-weight-row kernel to the
// single-row kernel's (and so the pure-Go twin's) bits, for block counts
// that exercise the 4-block loop and the tail, with quantized rows and
// with raw random quants (every byte value, -128 included).
func TestSIMDTwoRowBitEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	defer func(old bool) { useTwoRow = old }(useTwoRow)
	useTwoRow = true
	for _, isa := range simdISAs() {
		kt := newKernelTable(isa)
		for _, typ := range simdTestTypes {
			two := kt.dot2[typ]
			if two == nil {
				continue
			}
			for _, nblk := range []int{1, 2, 3, 4, 5, 7, 8, 9, 28, 33, 152} {
				n := nblk * typ.BlockSize()
				for trial := range 6 {
					w0, xs := simdTestRows(r, typ, n, 1, trial%2 == 1)
					w1, _ := simdTestRows(r, typ, n, 0, trial%3 == 1)
					if trial >= 4 { // raw quants, keep the FP16 scales
						bs, _ := typ.RowBytes(typ.BlockSize())
						for _, w := range [][]byte{w0, w1} {
							for i := range w {
								if i%bs >= 2 {
									w[i] = byte(r.Uint32())
								}
							}
						}
					}
					gap := r.IntN(3) * 7 // rows need not be adjacent
					w := append(append(append([]byte{}, w0...), make([]byte, gap)...), w1...)
					var o [2]float32
					two(n, w, len(w0)+gap, xs[0], &o)
					for i, wr := range [][]byte{w0, w1} {
						want := vecDotRef(typ, n, wr, xs[0])
						one := kt.dot[typ](n, wr, xs[0])
						if math.Float32bits(o[i]) != math.Float32bits(want) || math.Float32bits(one) != math.Float32bits(want) {
							t.Fatalf("%s %v n=%d trial %d row %d: two-row %g, single %g, reference %g", isa, typ, n, trial, i, o[i], one, want)
						}
					}
				}
			}
		}
	}
}
