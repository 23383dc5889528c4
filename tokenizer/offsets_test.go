package tokenizer

import (
	"math/rand/v2"
	"testing"
)

func TestOffsets(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		name      string
		sizes     func(i int) uint32
		n         int
		wantShift uint8
	}{
		{"empty", nil, 0, 8},
		{"small items", func(int) uint32 { return uint32(rng.IntN(20)) }, 1000, 8},
		{"exactly 256 items", func(int) uint32 { return 3 }, 256, 8},
		{"items of 1 KiB", func(int) uint32 { return 1 << 10 }, 600, 6}, // 64 items span 64 KiB - 1 KiB
		{"one item of 70 KiB", func(i int) uint32 { return map[bool]uint32{true: 70 << 10, false: 5}[i == 300] }, 700, 0},
		{"items of 40 KiB", func(int) uint32 { return 40 << 10 }, 10, 1}, // pairs
	} {
		t.Run(tc.name, func(t *testing.T) {
			starts := make([]uint32, tc.n+1)
			for i := range tc.n {
				starts[i+1] = starts[i] + tc.sizes(i)
			}
			o := newOffsets(starts)
			if o.shift != tc.wantShift {
				t.Errorf("shift %d, want %d", o.shift, tc.wantShift)
			}
			for i, s := range starts {
				if got := o.at(int32(i)); got != s {
					t.Fatalf("offset %d = %d, want %d", i, got, s)
				}
			}
		})
	}
}
