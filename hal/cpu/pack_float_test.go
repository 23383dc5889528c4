package cpu

import (
	"encoding/binary"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"

	"tandem/hal"
)

// TestPackedFloatKernels holds every packed F16, BF16 and F32 kernel set,
// under every ISA the CPU runs, to its arithmetic. F16's kernels add the
// exact products in column order, as the reference does: the reference's
// bits. BF16's on AVX512_BF16 add them two at a time in float32 lanes
// (VDPBF16PS); F32's, and BF16's with AVX2 alone, add each product by FMA
// in float32: they are held to the reference (rounded or exact products,
// float64 sum) within the rounding of the kernel's float32 additions of
// Σ|products|, and to the bits of the kernel's model (bf16PairSums,
// fmaChain). That for every kernel of the set (the four- and single-row
// kernels alone, with the wide kernel, prefetching), any number of
// activation rows computed together and any thread count: batch invariance
// rests on it. Column counts of one, three and 56 blocks of 16, weight row
// counts around the groups (a partial last group, one row), activation row
// counts that leave every tail (8+8+4+1, 8+4+1, …). The values span many
// binades, and the test fails if its inputs could not catch a kernel that
// loses the last product pair or sums in another order (the model's wrong
// twin).
func TestPackedFloatKernels(t *testing.T) {
	tested := 0
	for _, isa := range simdISAs() {
		for _, typ := range []hal.DType{hal.F16, hal.BF16, hal.F32} {
			f := packFormatFor(isa, typ)
			// The test swaps f in for the format the backend packed with,
			// so the backend's own ISA must pack typ too.
			if f == nil || packFormatFor(kern.isa, typ) == nil {
				continue
			}
			tested++
			model := func(k int, w, x []byte, wrong bool) float32 { return fmaChain(typ, k, w, x, wrong) }
			adds := func(k int) int { return k + 2 }
			if sumsBF16Pairs(f) {
				model, adds = bf16PairSums, func(k int) int { return k/2 + 2 }
			}
			t.Run(isa+"/"+typ.String(), func(t *testing.T) { testPackedFloatKernels(t, typ, f, model, adds) })
		}
	}
	if tested == 0 {
		t.Skipf("no packed float kernels on this CPU, or none for TANDEM_CPU_ISA=%s", kern.isa)
	}
}

func testPackedFloatKernels(t *testing.T, typ hal.DType, f *packFormat, model func(k int, w, x []byte, wrong bool) float32, adds func(int) int) {
	variants := packVariants(f)
	names := slices.Sorted(maps.Keys(variants))
	r := rand.New(rand.NewPCG(51, 52))
	spread := func(n int) []float32 { return spreadValues(r, n) }
	catchable, reordered := 0, 0
	for _, shape := range []struct{ n, k int }{{1, 16}, {16, 48}, {17, 16}, {31, 48}, {64, 48}, {100, 896}, {130, 48}, {47, 16}} {
		n, k := shape.n, shape.k
		var wd []byte
		for range n {
			wd = append(wd, testQuantize(typ, spread(k))...)
		}
		w := &hal.Weight{Type: typ, Rows: n, Cols: k, Data: wd}
		wrb := w.RowBytes()
		const maxRows = 33
		x := spread(maxRows * k)
		xrb, _ := typ.RowBytes(k)
		xq := make([]byte, maxRows*xrb)
		for m := range maxRows {
			QuantizeRow(typ, x[m*k:(m+1)*k], xq[m*xrb:(m+1)*xrb])
		}
		ref, want := make([]float32, maxRows*n), make([]float32, maxRows*n)
		bound := make([]float64, maxRows*n)
		for m := range maxRows {
			xm := xq[m*xrb : (m+1)*xrb]
			for j := range n {
				wj := wd[j*wrb : (j+1)*wrb]
				ref[m*n+j] = vecDotRef(typ, k, wj, xm)
				want[m*n+j] = model(k, wj, xm, false)
				if !f.approx {
					want[m*n+j] = ref[m*n+j] // the reference's own bits
				}
				if math.Float32bits(model(k, wj, xm, true)) != math.Float32bits(want[m*n+j]) {
					reordered++
				}
				var abs float64
				for i := range k {
					abs += math.Abs(elemAt(typ, wj, i) * elemAt(typ, xm, i))
				}
				bound[m*n+j] = float64(adds(k))*0x1p-24*abs + 0x1p-126
				last := elemAt(typ, wj, k-2)*elemAt(typ, xm, k-2) + elemAt(typ, wj, k-1)*elemAt(typ, xm, k-1)
				if math.Abs(last) > 2*bound[m*n+j] {
					catchable++
				}
			}
		}
		for _, name := range names {
			for _, threads := range []int{1, 2} {
				be := New(threads)
				be.MatMul(hal.HostBuf(make([]float32, n)), hal.HostBuf(x[:k]), 1, w) // packs w
				be.packs.m[w].f = variants[name]
				for _, rows := range []int{1, 2, 3, 4, 5, 8, 9, 12, 13, 16, 17, 21, 24, 25, 33} {
					out := make([]float32, rows*n)
					be.MatMul(hal.HostBuf(out), hal.HostBuf(x[:rows*k]), rows, w)
					for i, got := range out {
						if d := math.Abs(float64(got) - float64(ref[i])); !(d <= bound[i]) {
							t.Fatalf("%s n=%d k=%d rows=%d threads=%d (m=%d, j=%d): packed %g, reference %g: |Δ| %g over %g", name, n, k, rows, threads, i/n, i%n, got, ref[i], d, bound[i])
						}
						if math.Float32bits(got) != math.Float32bits(want[i]) {
							t.Fatalf("%s n=%d k=%d rows=%d threads=%d (m=%d, j=%d): packed %g, want %g (the reference for exact formats, else the kernel's model)", name, n, k, rows, threads, i/n, i%n, got, want[i])
						}
					}
				}
				be.Close()
			}
		}
	}
	if catchable == 0 {
		t.Fatal("no output's last two products exceed twice its bound: the inputs cannot catch a kernel that loses them")
	}
	if reordered == 0 {
		t.Fatal("no output changes when summed in the wrong order: the inputs cannot catch it")
	}
}

// elemAt is element i of an F16, BF16 or F32 row.
func elemAt(typ hal.DType, b []byte, i int) float64 {
	switch typ {
	case hal.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case hal.F16:
		return float64(fp16Table[binary.LittleEndian.Uint16(b[2*i:])])
	}
	return float64(BF16ToFP32(binary.LittleEndian.Uint16(b[2*i:])))
}

// fmaChain is what the packed F32 and F16 kernels, and the AVX2 BF16 ones,
// compute for one output: the products added in column order by float32
// FMAs (wrong: in reverse).
func fmaChain(typ hal.DType, k int, w, x []byte, wrong bool) float32 {
	var s float32
	for i := range k {
		if wrong {
			i = k - 1 - i
		}
		s = fma32(float32(elemAt(typ, w, i)), float32(elemAt(typ, x, i)), s)
	}
	return s
}

// fma32 is a·b+c rounded once to float32. math.FMA rounds to float64
// first; that double rounding can only differ where the float64 result
// lies halfway between two float32 values (or below float32's normal
// range), which big.Float settles exactly.
func fma32(a, b, c float32) float32 {
	r := math.FMA(float64(a), float64(b), float64(c))
	if bits := math.Float64bits(r); bits&(1<<29-1) != 1<<28 && (r == 0 || math.Abs(r) >= 0x1p-126) {
		return float32(r)
	}
	e := new(big.Float).SetPrec(2000).SetFloat64(float64(a))
	e.Mul(e, new(big.Float).SetFloat64(float64(b)))
	e.Add(e, new(big.Float).SetFloat64(float64(c)))
	v, _ := e.Float32()
	return v
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
