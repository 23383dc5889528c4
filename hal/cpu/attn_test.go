package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnKernelsBitEqual holds the SIMD attention kernels to the scalar
// loops: scores and weighted value sums bit for bit, for head sizes with
// and without a 64-wide chunk, position counts that do and do not fill
// the last block, one position, and blocks in scattered order.
func TestAttnKernelsBitEqual(t *testing.T) {
	const bs = 16
	r := rand.New(rand.NewPCG(51, 52))
	tested := false
	for _, hd := range []int{16, 48, 64, 80, 128} {
		ak := attnKernelsFor(kern.isa, hd, bs)
		if ak == nil {
			continue
		}
		tested = true
		const blocks = 9
		k := make([]float32, blocks*bs*hd)
		v := make([]float32, blocks*bs*hd)
		for i := range k {
			k[i] = float32(r.NormFloat64())
			v[i] = float32(r.NormFloat64())
		}
		q := make([]float32, hd)
		for i := range q {
			q[i] = float32(r.NormFloat64())
		}
		for _, n := range []int{1, 2, 15, 16, 17, 33, 64, 65, 100, blocks * bs} {
			nblk := (n + bs - 1) / bs
			offs := make([]int32, nblk)
			for i, p := range r.Perm(blocks)[:nblk] {
				offs[i] = int32(p * bs * hd)
			}
			got, want := make([]float32, nblk*bs), make([]float32, nblk*bs)
			ak.scores(q, k, offs, 0.125, got)
			attnScoresRef(q, k, offs, bs, 0.125, want)
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					t.Fatalf("hd=%d n=%d: score %d: SIMD %g, scalar %g", hd, n, j, got[j], want[j])
				}
			}
			w := make([]float32, n)
			for j := range w {
				w[j] = r.Float32()
			}
			og, ow := make([]float32, hd), make([]float32, hd)
			for i := range og {
				og[i] = 99 // overwritten, not accumulated into
			}
			ak.accumV(og, v, offs, w)
			attnAccumVRef(ow, v, offs, bs, w)
			for i := range ow {
				if math.Float32bits(og[i]) != math.Float32bits(ow[i]) {
					t.Fatalf("hd=%d n=%d: out %d: SIMD %g, scalar %g", hd, n, i, og[i], ow[i])
				}
			}
		}
	}
	if !tested {
		t.Skipf("no SIMD attention kernels for ISA %s", kern.isa)
	}
}
