package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"tandem/hal"
)

// TestPackedBF16Kernels: the packed BF16 kernels add the exact products two
// at a time in float32 lanes (VDPBF16PS), so each output is held to the
// reference (exact products, float64 sum) within the rounding of k/2+2
// float32 additions of Σ|products|, and each output has the same bits
// whatever the kernel set (the four- and single-row kernels alone, with the
// wide kernel, prefetching), the number of activation rows computed
// together and the thread count: batch invariance rests on that. Shapes as
// TestPackedF16Kernels; the values span many binades, and the test fails
// if its inputs could not catch a kernel that loses a column pair.
func TestPackedBF16Kernels(t *testing.T) {
	f := packFormatFor(kern.isa, hal.BF16)
	if f == nil {
		t.Skipf("no packed BF16 kernels for ISA %s on this CPU", kern.isa)
	}
	variants := packVariants(f, hal.BF16)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range variants {
			if !yield(n) {
				return
			}
		}
	})
	r := rand.New(rand.NewPCG(51, 52))
	spread := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(24)-12))
		}
		return x
	}
	bf := func(b []byte, i int) float64 { return float64(BF16ToFP32(uint16(b[2*i]) | uint16(b[2*i+1])<<8)) }
	catchable := 0
	for _, shape := range []struct{ n, k int }{{1, 16}, {16, 48}, {17, 16}, {31, 48}, {64, 48}, {100, 896}, {130, 48}, {47, 16}} {
		n, k := shape.n, shape.k
		var wd []byte
		for range n {
			wd = append(wd, testQuantize(hal.BF16, spread(k))...)
		}
		w := &hal.Weight{Type: hal.BF16, Rows: n, Cols: k, Data: wd}
		const maxRows = 33
		x := spread(maxRows * k)
		xq := make([]byte, maxRows*2*k)
		for m := range maxRows {
			QuantizeRow(hal.BF16, x[m*k:(m+1)*k], xq[m*2*k:(m+1)*2*k])
		}
		ref := make([]float32, maxRows*n)
		bound := make([]float64, maxRows*n)
		for m := range maxRows {
			xm := xq[m*2*k:]
			for j := range n {
				wj := wd[j*2*k : (j+1)*2*k]
				ref[m*n+j] = vecDotRef(hal.BF16, k, wj, xm)
				var abs float64
				for i := range k {
					abs += math.Abs(bf(wj, i) * bf(xm, i))
				}
				bound[m*n+j] = float64(k/2+2)*0x1p-24*abs + 0x1p-126
				if last := bf(wj, k-2)*bf(xm, k-2) + bf(wj, k-1)*bf(xm, k-1); math.Abs(last) > 2*bound[m*n+j] {
					catchable++
				}
			}
		}
		canon := make([]float32, maxRows*n)
		seen := make([]bool, maxRows*n)
		for _, name := range names {
			for _, threads := range []int{1, 2} {
				be := New(threads)
				be.MatMul(make([]float32, n), x[:k], 1, w) // packs w
				be.packs.m[w].f = variants[name]
				for _, rows := range []int{1, 2, 3, 4, 5, 8, 9, 12, 13, 16, 17, 21, 24, 25, 33} {
					out := make([]float32, rows*n)
					be.MatMul(out, x[:rows*k], rows, w)
					for i, got := range out {
						if d := math.Abs(float64(got) - float64(ref[i])); !(d <= bound[i]) {
							t.Fatalf("%s n=%d k=%d rows=%d threads=%d (m=%d, j=%d): packed %g, reference %g: |Δ| %g over %g", name, n, k, rows, threads, i/n, i%n, got, ref[i], d, bound[i])
						}
						if !seen[i] {
							canon[i], seen[i] = got, true
						} else if math.Float32bits(got) != math.Float32bits(canon[i]) {
							t.Fatalf("%s n=%d k=%d rows=%d threads=%d (m=%d, j=%d): %g, but %g computed with other rows or kernels", name, n, k, rows, threads, i/n, i%n, got, canon[i])
						}
					}
				}
				be.Close()
			}
		}
	}
	if catchable == 0 {
		t.Fatal("no output's last column pair exceeds twice its bound: the inputs cannot catch a kernel that loses one")
	}
}
