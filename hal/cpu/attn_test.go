package cpu

import (
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
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

// TestSoftmaxSumAndMax: maxOf is the sequential max bit for bit (NaN, ±0 and
// −Inf included) and softmaxSum is within float64 rounding of the exact sum,
// tails of every length included.
func TestSoftmaxSumAndMax(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 78))
	negZero := float32(math.Copysign(0, -1))
	for n := range 40 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.Exp(r.NormFloat64() * 20))
		}
		for _, special := range [][]float32{nil, {negZero, 0}, {0, negZero}, {float32(math.NaN())}, {float32(math.Inf(-1))}} {
			w := append(slices.Clone(v), special...)
			r.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
			want := float32(math.Inf(-1))
			for _, x := range w {
				want = max(want, x)
			}
			if got := maxOf(w); math.Float32bits(got) != math.Float32bits(want) && !(math.IsNaN(float64(got)) && math.IsNaN(float64(want))) {
				t.Fatalf("maxOf(%v) = %v, sequential max %v", w, got, want)
			}
		}
		exact := new(big.Float).SetPrec(2000)
		for _, x := range v {
			exact.Add(exact, new(big.Float).SetFloat64(float64(x)))
		}
		want, _ := exact.Float64()
		if got := softmaxSum(v); math.Abs(got-want) > 1e-14*want {
			t.Fatalf("softmaxSum of %d values = %v, exact %v", n, got, want)
		}
	}
}
