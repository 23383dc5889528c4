package cpu

import (
	"fmt"
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
		if f := packFormatFor(kern.isa, typ); f == nil || f.approx {
			continue // approx formats: TestPackedBF16Kernels, TestPackedF32Kernels
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
					be.MatMul(hal.HostBuf(out), hal.HostBuf(x[:rows*k]), rows, w)
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

// spreadValues returns n normal values scaled over 24 binades, so that a
// float sum taken in another order than the reference's changes some
// outputs.
func spreadValues(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(24)-12))
	}
	return x
}

// packVariants returns f as each kernel set the tests and benchmarks
// compare: "x4" the four- and single-row kernels alone, "x8"… with f's
// wide kernel of that many rows, "x8pf"… with its prefetching twin.
func packVariants(f *packFormat) map[string]*packFormat {
	base := *f
	base.kw, base.kwpf, base.kwRows = nil, nil, 0
	variants := map[string]*packFormat{"x4": &base}
	if f.kw != nil {
		v := base
		v.kw, v.kwRows = f.kw, f.kwRows
		variants[fmt.Sprintf("x%d", f.kwRows)] = &v
		if f.kwpf != nil {
			vpf := v
			vpf.kwpf = f.kwpf
			variants[fmt.Sprintf("x%dpf", f.kwRows)] = &vpf
		}
	}
	return variants
}

// TestPackWeightInWaves: a weight larger than a few packing waves, with a
// partial last group, packs to the same bytes on one worker and on two,
// and MatMul through the copy gives the reference's bits for every output.
func TestPackWeightInWaves(t *testing.T) {
	typ := hal.Q8_0
	if packFormatFor(kern.isa, typ) == nil {
		t.Skipf("no packed %v kernel for ISA %s", typ, kern.isa)
	}
	const k = 4096
	r := rand.New(rand.NewPCG(45, 46))
	row := testQuantize(typ, testRandRow(r, k))
	wave := packWaveBytes / (packRows * len(row)) * packRows // rows a wave packs
	n := 2*wave + 7*packRows + 5
	wd := make([]byte, 0, n*len(row))
	for j := range n {
		row[2+j%32]++ // rows differ, so a group packed in the wrong place shows
		wd = append(wd, row...)
	}
	w := &hal.Weight{Type: typ, Rows: n, Cols: k, Data: wd}
	x := testRandRow(r, k)
	xq := make([]byte, 34*k/32)
	QuantizeRow(VecDotType(typ), x, xq)
	var packed [][]byte
	for _, threads := range []int{1, 2} {
		be := New(threads)
		out := make([]float32, n)
		be.MatMul(hal.HostBuf(out), hal.HostBuf(x), 1, w)
		for j := range n {
			want := vecDotRef(typ, k, wd[j*len(row):(j+1)*len(row)], xq)
			if math.Float32bits(out[j]) != math.Float32bits(want) {
				t.Fatalf("threads=%d output %d: packed %g, reference %g", threads, j, out[j], want)
			}
		}
		packed = append(packed, append([]byte(nil), be.packs.m[w].data...))
		be.Close()
	}
	if string(packed[0]) != string(packed[1]) {
		t.Error("packed copies differ between one worker and two")
	}
}

// TestSumInt8x32 holds the word-at-a-time sum to a plain loop on random
// bytes and on the extremes (all −128, all 127).
func TestSumInt8x32(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 48))
	var cases [][32]byte
	var lo, hi [32]byte
	for i := range lo {
		lo[i], hi[i] = 0x80, 0x7f
	}
	cases = append(cases, lo, hi, [32]byte{})
	for range 1000 {
		var q [32]byte
		for i := range q {
			q[i] = byte(r.Uint32())
		}
		cases = append(cases, q)
	}
	for _, q := range cases {
		var want int32
		for _, b := range q {
			want += int32(int8(b))
		}
		if got := sumInt8x32(&q); got != want {
			t.Fatalf("sum of %v = %d, want %d", q, got, want)
		}
	}
}

// TestMatMulsMatchesMatMul: MatMuls gives each product the bits MatMul
// gives it, whether its weights run as one job (one packed format and
// width, with partial last groups, one to nine rows) or one at a time
// (formats that differ, more weights than a job takes).
func TestMatMulsMatchesMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(49, 50))
	const k = 512
	w := func(typ hal.DType, n, k int) *hal.Weight {
		var d []byte
		for range n {
			d = append(d, testQuantize(typ, testRandRow(r, k))...)
		}
		return &hal.Weight{Type: typ, Rows: n, Cols: k, Data: d}
	}
	q, kw, v := w(hal.Q8_0, 56, k), w(hal.Q8_0, 8, k), w(hal.Q8_0, 21, k)
	cases := map[string][]*hal.Weight{
		"q k v":          {q, kw, v},
		"gate up":        {w(hal.Q4_K, 40, k), w(hal.Q4_K, 33, k)},
		"one":            {v},
		"formats differ": {q, w(hal.Q5_0, 16, k), v},
		"four":           {q, kw, v, q},
	}
	x := testRandRow(r, 9*k)
	for _, threads := range []int{1, 2} {
		be := New(threads)
		for name, ws := range cases {
			for _, rows := range []int{1, 4, 5, 9} {
				var ps []hal.MatMulOut
				var want [][]float32
				for _, w := range ws {
					ps = append(ps, hal.MatMulOut{Out: hal.HostBuf(make([]float32, rows*w.Rows)), W: w})
					o := make([]float32, rows*w.Rows)
					be.MatMul(hal.HostBuf(o), hal.HostBuf(x[:rows*w.Cols]), rows, w)
					want = append(want, o)
				}
				be.MatMuls(hal.HostBuf(x[:rows*k]), rows, ps)
				for i := range ps {
					for j, got := range ps[i].Out.Host() {
						if math.Float32bits(got) != math.Float32bits(want[i][j]) {
							t.Fatalf("%s threads=%d rows=%d product %d element %d: %g, MatMul %g", name, threads, rows, i, j, got, want[i][j])
						}
					}
				}
			}
		}
		be.Close()
	}
}
