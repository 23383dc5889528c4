package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"tandem/hal"
)

// TestPackedKernelsRawBlocks holds the packed int8 kernels of every ISA
// this CPU runs (the four-row kernel, its prefetching twin, and the
// single-row kernel) to the pure-Go reference's bits on blocks built byte
// by byte rather than quantized: the 32-element formats from q32RawRows
// (codes of the largest magnitudes with products of one sign, random and
// full-mantissa scales), the K-quants from kQuantBlocks (random bytes
// everywhere; every code, scale and min at its maximum; every byte zero,
// Q3_K's most negative codes and scales) against activations of -128,
// 127, both or random bytes: the largest int16 sums the AVX2 kernels form
// before widening, and the edges of the int16 word pairs the Q2_K and
// Q3_K kernels keep (pack_q23k.go). Groups are full (16 rows) and partial
// (13).
func TestPackedKernelsRawBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	isas := simdISAs()
	tested := 0
	for _, isa := range isas {
		for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0, hal.Q4_0, hal.Q4_1, hal.Q5_1, hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K} {
			f := packFormatFor(isa, typ)
			if f == nil || f.approx {
				continue
			}
			tested++
			nbs := []int{1, 2, 7}
			if f.blockElems == 256 {
				nbs = []int{1, 3}
			}
			for _, nb := range nbs {
				for trial := range 6 {
					for _, rows := range []int{packRows, 13} {
						ws, xs := packRawCase(r, typ, nb, rows, trial)
						checkPackedGroup(t, isa, f, typ, nb, ws, xs, trial)
					}
				}
			}
		}
	}
	if tested == 0 {
		t.Skip("no packed int8 kernels on this CPU")
	}
}

// packRawCase returns rows weight rows and four activation rows of nb
// blocks of typ, built byte by byte; trial picks the K-quant patterns.
func packRawCase(r *rand.Rand, typ hal.DType, nb, rows, trial int) (ws, xs [][]byte) {
	if typ.BlockSize() == 256 {
		wp := [3]string{"random", "max", "zero"}[trial%3]
		acts := []func(i int) int8{
			func(int) int8 { return int8(r.Uint32()) },
			func(int) int8 { return -128 },
			func(int) int8 { return 127 },
			func(i int) int8 { return [2]int8{-128, 127}[i/7%2] },
		}
		for range rows {
			ws = append(ws, kQuantBlocks(r, typ, nb, wp))
		}
		for m := range 4 {
			xs = append(xs, q8KBlocks(r, nb, acts[(trial/2+m)%len(acts)]))
		}
		return ws, xs
	}
	// The activation rows come with the first weight row (q32RawRows
	// correlates their signs with its codes); the other rows have their own.
	w0, x := q32RawRows(r, typ, nb, 4)
	ws = append(ws, w0)
	for range rows - 1 {
		w, _ := q32RawRows(r, typ, nb, 1)
		ws = append(ws, w)
	}
	return ws, x
}

// checkPackedGroup packs ws as one group in f's layout, runs f's kernels
// on the activation rows xs and compares every output with vecDotRef.
func checkPackedGroup(t *testing.T, isa string, f *packFormat, typ hal.DType, nb int, ws, xs [][]byte, trial int) {
	t.Helper()
	n := nb * f.blockElems
	w := make([]byte, f.groupBlockBytes*nb)
	f.pack(w, ws, nb)
	xrb := len(xs[0])
	xstride := xrb + 5 // rows apart, as in a batch with padding
	xq := make([]byte, 4*xstride)
	for m, x := range xs {
		copy(xq[m*xstride:], x)
	}
	sw := f.sideWords * nb
	side := make([]int32, 4*sw+1)
	for m := range 4 {
		f.side(side[m*sw:(m+1)*sw], xq[m*xstride:m*xstride+xrb], nb, f.corrMul)
	}
	var out4 [4 * packRows]float32
	f.k4(nb, &w[0], &xq[0], xstride, sideRow(side[:4*sw], 0), 4*sw, &out4[0], 4*packRows)
	for m := range 4 {
		var out1 [packRows]float32
		var sp *byte
		if sw > 0 {
			sp = (*byte)(unsafe.Pointer(&side[m*sw]))
		}
		f.k1(nb, &w[0], &xq[m*xstride], sp, &out1[0])
		for j, wr := range ws {
			want := vecDotRef(typ, n, wr, xs[m])
			if got := out4[m*packRows+j]; math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("%s %v nb=%d trial %d rows %d: 4-row kernel row %d output %d %g, reference %g", isa, typ, nb, trial, len(ws), m, j, got, want)
			}
			if got := out1[j]; math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("%s %v nb=%d trial %d rows %d: 1-row kernel row %d output %d %g, reference %g", isa, typ, nb, trial, len(ws), m, j, got, want)
			}
		}
	}
	if f.k4pf != nil { // its outputs must be k4's (the reference's, checked above), prefetching (from w itself) or not
		for _, pf := range []*byte{nil, &w[0]} {
			var outPF [4 * packRows]float32
			f.k4pf(nb, &w[0], &xq[0], xstride, sideRow(side[:4*sw], 0), 4*sw, &outPF[0], 4*packRows, pf)
			for i := range outPF {
				if math.Float32bits(outPF[i]) != math.Float32bits(out4[i]) {
					t.Fatalf("%s %v nb=%d trial %d rows %d: prefetching 4-row kernel output %d %g, 4-row kernel %g", isa, typ, nb, trial, len(ws), i, outPF[i], out4[i])
				}
			}
		}
	}
}
