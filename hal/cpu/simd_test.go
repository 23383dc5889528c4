package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// simdTestTypes are the weight types the tests run through every ISA's
// kernel table (types without a SIMD kernel fall back to the reference).
var simdTestTypes = dotTestWeightTypes

// simdExactTypes must give bit-for-bit the pure-Go twin's result: their
// SIMD kernels keep the twin's float operations and order.
var simdExactTypes = map[hal.DType]bool{
	hal.Q4_0: true, hal.Q4_1: true, hal.Q5_0: true, hal.Q5_1: true, hal.Q8_0: true,
	hal.Q2_K: true, hal.Q3_K: true, hal.Q4_K: true, hal.Q5_K: true, hal.Q6_K: true,
}

func simdTestRows(r *rand.Rand, typ hal.DType, n, rows int, offset bool) (w []byte, xs [][]byte) {
	wf := testRandRow(r, n)
	if offset {
		for i := range wf {
			wf[i] += 0.7
		}
	}
	w = testQuantize(typ, wf)
	for range rows {
		xf := testRandRow(r, n)
		if offset {
			for i := range xf {
				xf[i] = xf[i]*0.5 - 0.3
			}
		}
		xs = append(xs, testQuantize(VecDotType(typ), xf))
	}
	return w, xs
}

// magnitude is Σ|w_i·x_i| over the dequantized rows.
func magnitude(typ hal.DType, n int, w, x []byte) float64 {
	wd, xd := testDequantize(typ, w, n), testDequantize(VecDotType(typ), x, n)
	var m float64
	for i := range wd {
		m += math.Abs(float64(wd[i]) * float64(xd[i]))
	}
	return m
}

// TestSIMDMatchesReference holds every ISA's single-row kernel to the
// pure-Go twin: bit-equal for the quantized types, within 1e-5 of
// Σ|products| for the float types.
func TestSIMDMatchesReference(t *testing.T) {
	isas := simdISAs()
	if len(isas) == 0 {
		t.Skip("no SIMD kernels on this CPU")
	}
	r := rand.New(rand.NewPCG(21, 22))
	for _, isa := range isas {
		kt := newKernelTable(isa)
		if kt.isa != isa {
			t.Fatalf("kernel table for %s says %s", isa, kt.isa)
		}
		for _, typ := range simdTestTypes {
			f := kt.dot[typ]
			if f == nil {
				continue
			}
			bs := typ.BlockSize()
			for _, nblk := range []int{1, 2, 3, 4, 5, 7, 8, 9, 28, 33} {
				n := nblk * max(bs, 32)
				if bs == 1 {
					n += nblk % 7 // odd lengths for the float rows
				}
				for trial := range 4 {
					w, xs := simdTestRows(r, typ, n, 1, trial == 3)
					x := xs[0]
					got, want := f(n, w, x), vecDotRef(typ, n, w, x)
					if simdExactTypes[typ] {
						if math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s %v n=%d trial %d: SIMD %g, reference %g", isa, typ, n, trial, got, want)
						}
						continue
					}
					if d, tol := math.Abs(float64(got)-float64(want)), 1e-5*magnitude(typ, n, w, x)+1e-30; d > tol {
						t.Fatalf("%s %v n=%d trial %d: SIMD %g, reference %g (diff %g > %g)", isa, typ, n, trial, got, want, d, tol)
					}
				}
			}
		}
	}
}

// TestSIMDMultiRowBitEqual: for every ISA, weight type and row count 1..9,
// matmulRange (which uses the 4-row kernels where it can) gives each
// output exactly the single-row kernel's bits, for every split of the
// weight rows.
func TestSIMDMultiRowBitEqual(t *testing.T) {
	defer func(old bool) { useTwoRow = old }(useTwoRow)
	for _, two := range []bool{false, true} {
		useTwoRow = two
		testSIMDMultiRowBitEqual(t, 8)
		testSIMDMultiRowBitEqual(t, 9) // block loops with a tail
	}
}

func testSIMDMultiRowBitEqual(t *testing.T, blocks int) {
	r := rand.New(rand.NewPCG(23, 24))
	isas := append([]string{"go"}, simdISAs()...)
	for _, isa := range isas {
		kt := newKernelTable(isa)
		for _, typ := range simdTestTypes {
			k := blocks * max(typ.BlockSize(), 32)
			if typ.BlockSize() == 1 {
				k += 5
			}
			const n = 7 // weight rows
			wrb, err := typ.RowBytes(k)
			if err != nil {
				t.Fatal(err)
			}
			xrb, _ := VecDotType(typ).RowBytes(k)
			var w []byte
			for range n {
				wr, _ := simdTestRows(r, typ, k, 0, false)
				w = append(w, wr...)
			}
			for rows := 1; rows <= 9; rows++ {
				_, xs := simdTestRows(r, typ, k, rows, rows%2 == 0)
				var xq []byte
				for _, x := range xs {
					xq = append(xq, x...)
				}
				out := make([]float32, rows*n)
				matmulRange(kt, typ, k, n, rows, w, wrb, xq, xrb, out, 0, 3, &workerBufs{})
				matmulRange(kt, typ, k, n, rows, w, wrb, xq, xrb, out, 3, n, &workerBufs{})
				single := kt.dot[typ]
				if single == nil {
					single = func(n int, w, x []byte) float32 { return vecDotRef(typ, n, w, x) }
				}
				for m := range rows {
					for j := range n {
						want := single(k, w[j*wrb:(j+1)*wrb], xq[m*xrb:(m+1)*xrb])
						if got := out[m*n+j]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s %v rows=%d (m=%d, j=%d): multi-row %g, single-row %g", isa, typ, rows, m, j, got, want)
						}
					}
				}
			}
		}
	}
}

// TestMatMulBatchInvariantSIMD: Backend.MatMul's output row m is the same
// bits whatever the batch size and thread count.
func TestMatMulBatchInvariantSIMD(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0, hal.Q4_K, hal.Q6_K, hal.F16, hal.F32} {
		const k, n = 512, 13
		var wd []byte
		for range n {
			wd = append(wd, testQuantize(typ, testRandRow(r, k))...)
		}
		w := &hal.Weight{Type: typ, Rows: n, Cols: k, Data: wd}
		x := make([]float32, 9*k)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		ref := make([]float32, n)
		for _, threads := range []int{1, 2, 3} {
			be := New(threads)
			for rows := 1; rows <= 9; rows++ {
				out := make([]float32, rows*n)
				be.MatMul(hal.HostBuf(out), hal.HostBuf(x[:rows*k]), rows, w)
				for m := range rows {
					one := make([]float32, n)
					be.MatMul(hal.HostBuf(one), hal.HostBuf(x[m*k:(m+1)*k]), 1, w)
					if rows == 1 && threads == 1 {
						copy(ref, one)
					}
					for j := range n {
						if math.Float32bits(out[m*n+j]) != math.Float32bits(one[j]) {
							t.Fatalf("%v threads=%d rows=%d m=%d j=%d: %g in batch, %g alone", typ, threads, rows, m, j, out[m*n+j], one[j])
						}
					}
				}
			}
			be.Close()
		}
	}
}

func BenchmarkVecDotSIMD(b *testing.B) {
	r := rand.New(rand.NewPCG(27, 28))
	const n = 4096
	for _, isa := range append([]string{"go"}, simdISAs()...) {
		kt := newKernelTable(isa)
		for _, typ := range simdTestTypes {
			if isa != "go" && kt.dot[typ] == nil {
				continue
			}
			w, xs := simdTestRows(r, typ, n, 4, false)
			var xq []byte
			for _, x := range xs {
				xq = append(xq, x...)
			}
			xrb := len(xs[0])
			dot := kt.dot[typ]
			if dot == nil {
				dot = func(n int, w, x []byte) float32 { return vecDotRef(typ, n, w, x) }
			}
			b.Run(isa+"/"+typ.String(), func(b *testing.B) {
				b.SetBytes(int64(len(w)))
				var sink float32
				for b.Loop() {
					sink += dot(n, w, xs[0])
				}
				_ = sink
			})
			if kt.dot4[typ] != nil {
				b.Run(isa+"/"+typ.String()+"x4", func(b *testing.B) {
					b.SetBytes(int64(len(w)))
					var o [4]float32
					for b.Loop() {
						kt.dot4[typ](n, w, xq, xrb, &o)
					}
				})
			}
		}
	}
}
