package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

// q32Layout describes a weight format of 32-element blocks for
// q32RawRows: its block bytes, its quants' bits and offset (q = code -
// off), whether a min follows the scale, and the activation block size
// (34 for Q8_0, 36 for Q8_1), and the most negative activation byte its
// kernels take: the AVX2 Q8_0 and Q5_0 kernels move the weight's sign onto
// the activation (VPSIGNB), which -128 does not survive, and QuantizeRow
// never writes -128 into Q8_0; the others take any byte.
type q32Layout struct {
	wsize, bits, off, xsize, minX int
	min                           bool
}

var q32Layouts = map[hal.DType]q32Layout{
	hal.Q4_0: {wsize: 18, bits: 4, off: 8, xsize: 34, minX: -128},
	hal.Q4_1: {wsize: 20, bits: 4, xsize: 36, minX: -128, min: true},
	hal.Q5_0: {wsize: 22, bits: 5, off: 16, xsize: 34, minX: -127},
	hal.Q5_1: {wsize: 24, bits: 5, xsize: 36, minX: -128, min: true},
	hal.Q8_0: {wsize: 34, bits: 8, off: 128, xsize: 34, minX: -127},
}

// randF16 is a finite FP16 value with a random sign and full mantissa.
func randF16(r *rand.Rand) uint16 {
	return uint16(r.IntN(2))<<15 | uint16(1+r.IntN(30))<<10 | uint16(r.IntN(1024))
}

// q32RawRows builds one weight row and rows activation rows of nb blocks
// byte by byte, not by quantizing: scales and mins are random FP16 values
// with full mantissas, and each block is one of three kinds: random
// quants; quants of the largest magnitudes with products all of one sign
// (block sums of 15 bits and more, whose float32 products with a scale
// round, so a kernel that reassociates the twin's float operations shows);
// or all-zero activations. Activation bytes go down to the layout's minX.
func q32RawRows(r *rand.Rand, typ hal.DType, nb, rows int) (w []byte, xs [][]byte) {
	l := q32Layouts[typ]
	w = make([]byte, l.wsize*nb)
	xs = make([][]byte, rows)
	for m := range xs {
		xs[m] = make([]byte, l.xsize*nb)
	}
	maxCode := 1<<l.bits - 1
	for b := range nb {
		kind := r.IntN(3)
		wb := w[b*l.wsize:]
		binary.LittleEndian.PutUint16(wb, randF16(r))
		if l.min {
			binary.LittleEndian.PutUint16(wb[2:], randF16(r))
		}
		var codes [32]int
		for j := range codes {
			switch {
			case kind != 1:
				codes[j] = r.IntN(maxCode + 1)
			case l.off == 0: // unsigned quants: the largest
				codes[j] = maxCode - r.IntN(4)
			case r.IntN(2) == 0: // signed: the most negative or the most positive
				codes[j] = r.IntN(2)
			default:
				codes[j] = maxCode - r.IntN(2)
			}
		}
		q := wb[l.wsize-16:]
		switch l.bits {
		case 8:
			for j, c := range codes {
				wb[2+j] = byte(c - l.off)
			}
		default:
			var qh uint32
			for j := range 16 {
				q[j] = byte(codes[j]&15 | (codes[j+16]&15)<<4)
			}
			for j, c := range codes {
				qh |= uint32(c>>4&1) << j
			}
			if l.bits == 5 {
				binary.LittleEndian.PutUint32(wb[l.wsize-20:], qh)
			}
		}
		sign := 1 - 2*r.IntN(2)
		for _, x := range xs {
			xb := x[b*l.xsize:]
			binary.LittleEndian.PutUint16(xb, randF16(r))
			if l.xsize == 36 {
				binary.LittleEndian.PutUint16(xb[2:], randF16(r))
			}
			xq := xb[l.xsize-32:]
			for j := range 32 {
				var v int
				switch kind {
				case 0:
					v = l.minX + r.IntN(128-l.minX)
				case 1: // the weight's sign times sign: all products of one sign
					v = 100 + r.IntN(28)
					if (codes[j] < l.off) != (sign < 0) {
						v = max(l.minX, -v-r.IntN(2))
					}
				}
				xq[j] = byte(int8(v))
			}
		}
	}
	return w, xs
}

// TestSIMDQ32RawBlocks holds every ISA's single-row and four-row kernels
// for the 32-element block formats to the pure-Go twin's bits on blocks
// built byte by byte (see q32RawRows), for block counts that exercise the
// four-block loop, its tail and a single block, with activation rows at a
// stride longer than a row.
func TestSIMDQ32RawBlocks(t *testing.T) {
	isas := simdISAs()
	if len(isas) == 0 {
		t.Skip("no SIMD kernels on this CPU")
	}
	r := rand.New(rand.NewPCG(51, 52))
	for _, isa := range isas {
		kt := newKernelTable(isa)
		for _, typ := range []hal.DType{hal.Q4_0, hal.Q4_1, hal.Q5_0, hal.Q5_1, hal.Q8_0} {
			one, four := kt.dot[typ], kt.dot4[typ]
			if one == nil {
				continue
			}
			for _, nb := range []int{1, 2, 3, 4, 5, 7, 8, 9, 28, 33} {
				n := 32 * nb
				for trial := range 8 {
					w, xs := q32RawRows(r, typ, nb, 4)
					for m, x := range xs {
						got, want := one(n, w, x), vecDotRef(typ, n, w, x)
						if math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s %v nb=%d trial %d row %d: SIMD %g, reference %g", isa, typ, nb, trial, m, got, want)
						}
					}
					if four == nil {
						continue
					}
					stride := len(xs[0]) + 7
					xq := make([]byte, 4*stride)
					for m, x := range xs {
						copy(xq[m*stride:], x)
					}
					var o [4]float32
					four(n, w, xq, stride, &o)
					for m, x := range xs {
						if want := vecDotRef(typ, n, w, x); math.Float32bits(o[m]) != math.Float32bits(want) {
							t.Fatalf("%s %v nb=%d trial %d: 4-row kernel row %d %g, reference %g", isa, typ, nb, trial, m, o[m], want)
						}
					}
				}
			}
		}
	}
}
