package cpu

import (
	"encoding/binary"
	"math"
	"testing"

	"tandem/hal"
)

// TestSideF16SIMD: the packed F16 kernels' side row widens every FP16
// pattern to the float32 bits of the reference table (a NaN to a NaN), for
// row lengths that take the 64-wide loop, the 16-wide one and both.
func TestSideF16SIMD(t *testing.T) {
	if packFormatFor(kern.isa, hal.F16) == nil {
		t.Skipf("no packed F16 kernels for ISA %s", kern.isa)
	}
	xq := make([]byte, 2<<16)
	for h := range 1 << 16 {
		binary.LittleEndian.PutUint16(xq[2*h:], uint16(h))
	}
	for _, n := range []int{16, 48, 64, 80, 1 << 16} {
		for _, off := range []int{0, 16 * 1001} {
			if off+n > 1<<16 {
				off = 0
			}
			side := make([]int32, n+16)
			side[n] = 12345 // must stay: the row ends at n
			sideF16SIMD(side, xq[2*off:2*(off+n)], n/16, 0)
			if side[n] != 12345 {
				t.Fatalf("n=%d: wrote past the row", n)
			}
			for i := range n {
				h := uint16(off + i)
				got, want := math.Float32frombits(uint32(side[i])), fp16Table[h]
				if want != want {
					if got == got {
						t.Fatalf("FP16 %#04x: got %g, want a NaN", h, got)
					}
					continue
				}
				if math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("FP16 %#04x: got %#08x, table %#08x", h, math.Float32bits(got), math.Float32bits(want))
				}
			}
		}
	}
}

// sumsBF16Pairs reports whether f's kernels add BF16 products two at a
// time (VDPBF16PS), the arithmetic bf16PairSums models.
func sumsBF16Pairs(f *packFormat) bool { return f == packFormatBF16 }
