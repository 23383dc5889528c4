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
// float32 additions of Σ|products|, and to the bits of bf16PairSums,
// whatever the kernel set (the four- and single-row kernels alone, with the
// wide kernel, prefetching), the number of activation rows computed
// together and the thread count: batch invariance rests on that. Shapes as
// TestPackedF16Kernels; the values span many binades, and the test fails
// if its inputs could not catch a kernel that loses a column pair or adds
// a pair's products in the other order.
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
	catchable, swapped := 0, 0
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
		ref, model := make([]float32, maxRows*n), make([]float32, maxRows*n)
		bound := make([]float64, maxRows*n)
		for m := range maxRows {
			xm := xq[m*2*k:]
			for j := range n {
				wj := wd[j*2*k : (j+1)*2*k]
				ref[m*n+j] = vecDotRef(hal.BF16, k, wj, xm)
				model[m*n+j] = bf16PairSums(k, wj, xm, false)
				if math.Float32bits(bf16PairSums(k, wj, xm, true)) != math.Float32bits(model[m*n+j]) {
					swapped++
				}
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
						if math.Float32bits(got) != math.Float32bits(model[i]) {
							t.Fatalf("%s n=%d k=%d rows=%d threads=%d (m=%d, j=%d): packed %g, bf16PairSums %g", name, n, k, rows, threads, i/n, i%n, got, model[i])
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
	if swapped == 0 {
		t.Fatal("no output changes when each pair is added even product first: the inputs cannot catch it")
	}
}

// bf16PairSums is what the packed BF16 kernels compute for one output, as
// VDPBF16PS is defined (and as this CPU was found to round): column pairs
// alternate between two float32 sums, each pair adding its odd product,
// rounded, then its even one, rounded (evenFirst swaps them: a wrong
// kernel); the two sums are added at the end. Subnormal inputs and sums
// count as zero.
func bf16PairSums(k int, w, x []byte, evenFirst bool) float32 {
	at := func(b []byte, i int) float32 {
		return ftz(BF16ToFP32(uint16(b[2*i]) | uint16(b[2*i+1])<<8))
	}
	var sums [2]float32
	for p := range k / 2 {
		s := &sums[p%2]
		first, second := 2*p+1, 2*p
		if evenFirst {
			first, second = second, first
		}
		*s = ftz(*s + at(w, first)*at(x, first))
		*s = ftz(*s + at(w, second)*at(x, second))
	}
	return sums[0] + sums[1]
}

// ftz flushes a subnormal float32 to zero of its sign.
func ftz(v float32) float32 {
	if v != 0 && math.Abs(float64(v)) < 0x1p-126 {
		return float32(math.Copysign(0, float64(v)))
	}
	return v
}
