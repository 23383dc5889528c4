package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"tandem/hal"
)

// TestPackedKQuantExtremeBlocks holds every packed K-quant kernel (four
// rows with and without prefetch, one row) to the bits of the pure-Go
// reference on blocks quantization of smooth data rarely makes: random
// bytes everywhere (every scale, min and code, subnormal f16 scales),
// every code, scale and min at its maximum (bytes 0xFF), and every byte
// zero (Q3_K: codes −4 and scales −32), against activations of −128, 127,
// both, and random bytes, for one and three super-blocks. These are the
// sums at the edges of the kernels' int16 word pairs (Q2_K, Q3_K) and
// int32 lanes.
func TestPackedKQuantExtremeBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	acts := []struct {
		name string
		q    func(i int) int8
	}{
		{"random", func(int) int8 { return int8(r.Uint32()) }},
		{"-128", func(int) int8 { return -128 }},
		{"127", func(int) int8 { return 127 }},
		{"mixed", func(i int) int8 { return [2]int8{-128, 127}[i/7%2] }},
	}
	tested := 0
	for _, isa := range simdISAs() {
		for _, typ := range []hal.DType{hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K} {
			f := packFormatFor(isa, typ)
			if f == nil {
				continue
			}
			tested++
			for _, nb := range []int{1, 3} {
				for _, wp := range []string{"random", "max", "zero"} {
					for _, act := range acts {
						testPackedKQuantBlocks(t, r, typ, f, nb, wp, act.q, isa+" "+typ.String()+" weights "+wp+" activations "+act.name)
					}
				}
			}
		}
	}
	if tested == 0 {
		t.Skip("no packed K-quant kernels on this CPU")
	}
}

// testPackedKQuantBlocks runs f's kernels on two groups of weight rows of
// pattern wp (32 rows: the second group is the prefetch target) and five
// activation rows from q, and compares the first group's outputs with
// vecDotRef.
func testPackedKQuantBlocks(t *testing.T, r *rand.Rand, typ hal.DType, f *packFormat, nb int, wp string, q func(int) int8, what string) {
	t.Helper()
	const n, rows = 2 * packRows, 5
	bs, _ := typ.RowBytes(256)
	f16 := map[int]bool{}
	for _, o := range kQuantF16Fields[typ] {
		f16[o], f16[o+1] = true, true
	}
	var w [][]byte
	for range n {
		if wp != "zero" {
			w = append(w, kQuantBlocks(r, typ, nb, wp))
			continue
		}
		b := kQuantBlocks(r, typ, nb, "max") // then all but the f16 scales (1.0) cleared
		for i := range b {
			if !f16[i%bs] {
				b[i] = 0
			}
		}
		w = append(w, b)
	}
	gb := f.groupBlockBytes * nb
	packed := make([]byte, 2*gb)
	f.pack(packed[:gb], w[:packRows], nb)
	f.pack(packed[gb:], w[packRows:], nb)
	xrb := 292 * nb
	x := make([]byte, rows*xrb)
	for m := range rows {
		copy(x[m*xrb:], q8KBlocks(r, nb, q))
	}
	sw := f.sideWords * nb
	side := make([]int32, rows*sw)
	for m := range rows {
		f.side(side[m*sw:(m+1)*sw], x[m*xrb:(m+1)*xrb], nb, f.corrMul)
	}
	sp := func(m int) *byte { return (*byte)(unsafe.Pointer(&side[m*sw])) }
	var out [rows * packRows]float32
	check := func(kernel string, ms ...int) {
		t.Helper()
		for _, m := range ms {
			for j := range packRows {
				want := vecDotRef(typ, 256*nb, w[j], x[m*xrb:(m+1)*xrb])
				if got := out[m*packRows+j]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%s nb=%d, %s kernel, activation row %d, weight row %d: packed %g, reference %g", what, nb, kernel, m, j, got, want)
				}
			}
		}
	}
	f.k4(nb, &packed[0], &x[0], xrb, sp(0), 4*sw, &out[0], 4*packRows)
	check("four-row", 0, 1, 2, 3)
	if f.k4pf != nil {
		for _, pf := range []*byte{nil, &packed[gb]} {
			clear(out[:])
			f.k4pf(nb, &packed[0], &x[0], xrb, sp(0), 4*sw, &out[0], 4*packRows, pf)
			check("four-row prefetching", 0, 1, 2, 3)
		}
	}
	f.k1(nb, &packed[0], &x[4*xrb], sp(4), &out[4*packRows])
	check("one-row", 4)
}
