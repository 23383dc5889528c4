package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

func randLowRank(rng *rand.Rand, rank, in, out int) *hal.LowRank {
	w := &hal.LowRank{Rank: rank, In: in, Out: out, A: make([]float32, rank*in), BT: make([]float32, rank*out), Scale: float32(rng.Float64()*2 + 0.1)}
	for i := range w.A {
		w.A[i] = float32(rng.NormFloat64())
	}
	for i := range w.BT {
		w.BT[i] = float32(rng.NormFloat64())
	}
	return w
}

func randRows(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * 3)
	}
	return v
}

// The kernels give the reference's bits for every width, with and without a tail past
// the 16 lanes, and extreme values (subnormals, large magnitudes, signed zeros).
func TestLowRankKernelsBitEqual(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, in := range []int{1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 288, 896} {
		for _, out := range []int{1, 5, 8, 9, 16, 64, 100, 172} {
			for _, rank := range []int{1, 3, 8, 16} {
				w := randLowRank(rng, rank, in, out)
				x := randRows(rng, in)
				if in > 4 {
					x[0], x[1], x[2], x[3] = float32(math.Copysign(0, -1)), 1e-40, 3e38, -3e38
				}
				base := randRows(rng, out)
				got, want := append([]float32(nil), base...), append([]float32(nil), base...)
				lowRankRow(got, x, w, make([]float32, rank), make([]float32, out))
				lowRankRowRef(want, x, w, make([]float32, rank), make([]float32, out))
				for j := range got {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) && !(got[j] != got[j] && want[j] != want[j]) {
						t.Fatalf("in %d out %d rank %d (%s kernels): out[%d] = %v, reference %v", in, out, rank, kern.isa, j, got[j], want[j])
					}
				}
			}
		}
	}
}

// The fold is the one hal.LowRanker writes down: not a sequential sum (a kernel that
// summed in order would fail TestLowRankKernelsBitEqual only if the reference were wrong
// too, so the reference is pinned here on values where the orders differ).
func TestDotLanes16Order(t *testing.T) {
	a := make([]float32, 32)
	x := make([]float32, 32)
	for i := range a {
		a[i], x[i] = 1, float32(int(1)<<uint(i%24))*1e-7
	}
	a[0], x[0] = 1, 1e8
	var lane [16]float32
	for k := range 32 {
		lane[k%16] += a[k] * x[k]
	}
	for s := 8; s >= 1; s /= 2 {
		for l := range s {
			lane[l] += lane[l+s]
		}
	}
	if got := dotLanes16Ref(a, x); got != lane[0] {
		t.Fatalf("dotLanes16Ref = %v, the lanes and fold give %v", got, lane[0])
	}
	if got := dotLanes16(a, x); got != lane[0] {
		t.Fatalf("dotLanes16 (%s) = %v, the lanes and fold give %v", kern.isa, got, lane[0])
	}
}

// AddLowRank updates exactly the spans' rows, each with its own adapter, giving each row
// the bits it gets alone, whether it runs inline or on the workers.
func TestAddLowRankSpans(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, threads := range []int{1, 2, 3} {
		b := New(threads)
		defer b.Close()
		for _, tc := range []struct{ in, out, rows, rank int }{{64, 64, 12, 8}, {896, 128, 40, 16}, {288, 768, 70, 32}} {
			ws := []*hal.LowRank{randLowRank(rng, tc.rank, tc.in, tc.out), randLowRank(rng, tc.rank/2, tc.in, tc.out), randLowRank(rng, 1, tc.in, tc.out)}
			x := randRows(rng, tc.rows*tc.in)
			base := randRows(rng, tc.rows*tc.out)
			spans := []hal.LowRankSpan{{Row: 1, Rows: 3, W: ws[0]}, {Row: 5, Rows: tc.rows - 9, W: ws[1]}, {Row: tc.rows - 2, Rows: 1, W: ws[0]}, {Row: tc.rows - 1, Rows: 1, W: ws[2]}}
			got := append([]float32(nil), base...)
			b.AddLowRank(hal.HostBuf(got), hal.HostBuf(x), spans)
			want := append([]float32(nil), base...)
			of := make([]*hal.LowRank, tc.rows)
			for _, s := range spans {
				for r := s.Row; r < s.Row+s.Rows; r++ {
					of[r] = s.W
				}
			}
			for r, w := range of {
				if w == nil {
					continue
				}
				lowRankRowRef(want[r*tc.out:(r+1)*tc.out], x[r*tc.in:(r+1)*tc.in], w, make([]float32, w.Rank), make([]float32, tc.out))
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("threads %d %+v: value %d (row %d) = %v, want %v", threads, tc, i, i/tc.out, got[i], want[i])
				}
			}
		}
	}
}

// The update allocates nothing once the workers' scratch has grown.
func TestAddLowRankAllocatesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	b := New(2)
	defer b.Close()
	w := randLowRank(rng, 16, 256, 256)
	x, out := randRows(rng, 64*256), randRows(rng, 64*256)
	spans := []hal.LowRankSpan{{Row: 0, Rows: 64, W: w}}
	one := []hal.LowRankSpan{{Row: 3, Rows: 1, W: w}}
	b.AddLowRank(hal.HostBuf(out), hal.HostBuf(x), spans)
	if n := testing.AllocsPerRun(20, func() {
		b.AddLowRank(hal.HostBuf(out), hal.HostBuf(x), spans)
		b.AddLowRank(hal.HostBuf(out), hal.HostBuf(x), one)
	}); n != 0 {
		t.Fatalf("%v allocations per update", n)
	}
}

func BenchmarkAddLowRank(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	be := New(1)
	defer be.Close()
	w := randLowRank(rng, 16, 896, 896)
	x, out := randRows(rng, 896), randRows(rng, 896)
	spans := []hal.LowRankSpan{{Row: 0, Rows: 1, W: w}}
	for b.Loop() {
		be.AddLowRank(hal.HostBuf(out), hal.HostBuf(x), spans)
	}
}
