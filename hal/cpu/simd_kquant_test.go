package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// kQuantF16Fields are the byte offsets of the f16 scales in one super-block
// of each K-quant weight type; every other byte is quants or packed scales,
// where any value is a valid block.
var kQuantF16Fields = map[hal.DType][]int{
	hal.Q2_K: {80, 82}, hal.Q3_K: {108}, hal.Q4_K: {0, 2}, hal.Q5_K: {0, 2}, hal.Q6_K: {208},
}

// kQuantBlocks fills nb super-blocks of type typ: pattern "random" gives
// every quant/scale byte a random value and the f16 scales random finite
// values (subnormals included); "max" sets every quant/scale byte to 0xFF
// (Q4_K/Q5_K: all 6-bit scales and mins 63, all quants 15 or 31) with unit
// f16 scales; "zero"
// every quant/scale byte to 0 (Q3_K: all codes −4, all scales −32), with
// unit f16 scales.
func kQuantBlocks(r *rand.Rand, typ hal.DType, nb int, pattern string) []byte {
	bs, _ := typ.RowBytes(256)
	w := make([]byte, nb*bs)
	for i := range w {
		switch pattern {
		case "max":
			w[i] = 0xff
		case "zero":
			w[i] = 0
		default:
			w[i] = byte(r.Uint32())
		}
	}
	for b := range nb {
		for _, o := range kQuantF16Fields[typ] {
			h := uint16(0x3c00) // 1.0
			if pattern == "random" {
				h = uint16(r.Uint32()) &^ 0x7c00
				h |= uint16(r.IntN(31)) << 10 // exponent 0..30: finite
			}
			binary.LittleEndian.PutUint16(w[b*bs+o:], h)
		}
	}
	return w
}

// q8KBlocks fills nb Q8_K blocks with quants from q(i) and consistent
// 16-element sums, and a random positive scale.
func q8KBlocks(r *rand.Rand, nb int, q func(i int) int8) []byte {
	x := make([]byte, 292*nb)
	for b := range nb {
		blk := x[292*b : 292*b+292]
		binary.LittleEndian.PutUint32(blk, math.Float32bits(float32(r.Float64()*0.1+1e-3)))
		for g := range 16 {
			var s int16
			for l := range 16 {
				v := q(256*b + 16*g + l)
				blk[4+16*g+l] = byte(v)
				s += int16(v)
			}
			binary.LittleEndian.PutUint16(blk[260+2*g:], uint16(s))
		}
	}
	return x
}

// TestSIMDKQuantExtremeBlocks holds the K-quant kernels (single-row and
// four-row) to the bits of the pure-Go twins on blocks quantization of
// smooth data rarely makes: random bytes everywhere (all scale/min
// codes, subnormal f16 scales), and every quant, scale and min at its
// maximum against activations of -128 or 127 (the largest int16 pair sums
// VPMADDUBSW forms), for one and for an odd count of super-blocks.
func TestSIMDKQuantExtremeBlocks(t *testing.T) {
	isas := simdISAs()
	if len(isas) == 0 {
		t.Skip("no SIMD kernels on this CPU")
	}
	r := rand.New(rand.NewPCG(41, 42))
	acts := []struct {
		name string
		q    func(i int) int8
	}{
		{"random", func(int) int8 { return int8(r.Uint32()) }},
		{"-128", func(int) int8 { return -128 }},
		{"127", func(int) int8 { return 127 }},
		{"mixed", func(i int) int8 { return [2]int8{-128, 127}[i/7%2] }},
	}
	for _, isa := range isas {
		kt := newKernelTable(isa)
		for _, typ := range []hal.DType{hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K} {
			one, four := kt.dot[typ], kt.dot4[typ]
			if one == nil && four == nil {
				continue
			}
			for _, nb := range []int{1, 3} {
				n := 256 * nb
				for _, wp := range []string{"random", "max"} {
					for _, act := range acts {
						w := kQuantBlocks(r, typ, nb, wp)
						xs := make([]byte, 4*292*nb)
						for row := range 4 {
							copy(xs[row*292*nb:], q8KBlocks(r, nb, act.q))
						}
						var out [4]float32
						if four != nil {
							four(n, w, xs, 292*nb, &out)
						}
						for row := range 4 {
							x := xs[row*292*nb : (row+1)*292*nb]
							want := vecDotRef(typ, n, w, x)
							if one != nil {
								if got := one(n, w, x); math.Float32bits(got) != math.Float32bits(want) {
									t.Fatalf("%s %v nb=%d weights %s activations %s row %d: SIMD %g, reference %g", isa, typ, nb, wp, act.name, row, got, want)
								}
							}
							if four != nil && math.Float32bits(out[row]) != math.Float32bits(want) {
								t.Fatalf("%s %v nb=%d weights %s activations %s: 4-row kernel row %d %g, reference %g", isa, typ, nb, wp, act.name, row, out[row], want)
							}
						}
					}
				}
			}
		}
	}
}
