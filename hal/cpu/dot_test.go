package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"tandem/hal"
)

var dotTestWeightTypes = []hal.DType{
	hal.F32, hal.F16, hal.BF16,
	hal.Q4_0, hal.Q4_1, hal.Q5_0, hal.Q5_1, hal.Q8_0,
	hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K,
}

func TestVecDotType(t *testing.T) {
	want := map[hal.DType]hal.DType{
		hal.F32: hal.F32, hal.F16: hal.F16, hal.BF16: hal.BF16,
		hal.Q4_0: hal.Q8_0, hal.Q5_0: hal.Q8_0, hal.Q8_0: hal.Q8_0,
		hal.Q4_1: hal.Q8_1, hal.Q5_1: hal.Q8_1,
		hal.Q2_K: hal.Q8_K, hal.Q3_K: hal.Q8_K, hal.Q4_K: hal.Q8_K, hal.Q5_K: hal.Q8_K, hal.Q6_K: hal.Q8_K,
	}
	for _, typ := range dotTestWeightTypes {
		if !SupportedWeight(typ) {
			t.Errorf("SupportedWeight(%v) = false", typ)
		}
		if got := VecDotType(typ); got != want[typ] {
			t.Errorf("VecDotType(%v) = %v, want %v", typ, got, want[typ])
		}
		if VecDotFunc(typ) == nil {
			t.Errorf("VecDotFunc(%v) = nil", typ)
		}
	}
	for _, typ := range []hal.DType{hal.Q8_1, hal.Q8_K, hal.I32, hal.F64} {
		if SupportedWeight(typ) {
			t.Errorf("SupportedWeight(%v) = true", typ)
		}
	}
}

// TestVecDotMatchesDequantized checks each kernel against the float64 dot
// product of the dequantized rows. The two agree up to float32 rounding of
// the per-block scale products and of the running sum, which proves the
// kernels read the same block layout as DequantizeRow.
func TestVecDotMatchesDequantized(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, typ := range dotTestWeightTypes {
		vt := VecDotType(typ)
		t.Run(typ.String(), func(t *testing.T) {
			for _, n := range []int{256, 1024, 4096} {
				for trial := range 3 {
					wf, xf := testRandRow(r, n), testRandRow(r, n)
					if trial == 2 { // offset rows exercise the min terms
						for i := range wf {
							wf[i] += 0.7
							xf[i] = xf[i]*0.5 - 0.3
						}
					}
					w, x := testQuantize(typ, wf), testQuantize(vt, xf)
					wd, xd := testDequantize(typ, w, n), testDequantize(vt, x, n)
					var ref, mag float64
					for i := range wd {
						p := float64(wd[i]) * float64(xd[i])
						ref += p
						mag += math.Abs(p)
					}
					if vt == hal.Q8_1 {
						// ggml's Q8_1 carries s = d·Σq rounded to FP16 and the
						// kernel multiplies the weight's min by that s, not by
						// the exact sum of the dequantized activations.
						ref += q8_1MinCorrection(typ, w, x)
					}
					got := VecDot(typ, n, w, x)
					if f := VecDotFunc(typ)(n, w, x); math.Float32bits(f) != math.Float32bits(got) {
						t.Fatalf("VecDotFunc gives %g, VecDot %g", f, got)
					}
					// Each block adds a few float32 roundings (~6e-8 relative).
					tol := 4e-7*mag + 1e-6
					if typ == hal.F32 {
						tol = 1e-7*mag + 1e-9 // products rounded to float32
					}
					if d := math.Abs(float64(got) - ref); d > tol {
						t.Errorf("n=%d trial %d: VecDot %g, dequantized dot %g (diff %g > %g)", n, trial, got, ref, d, tol)
					}
					// And it approximates the exact float dot product.
					var exact float64
					for i := range wf {
						exact += float64(wf[i]) * float64(xf[i])
					}
					if trial == 0 && n == 4096 {
						t.Logf("n=%d: VecDot %.5f, dequantized %.5f, exact %.5f (rel err %.2e)", n, got, ref, exact, math.Abs(float64(got)-exact)/mag)
					}
				}
			}
		})
	}
}

// TestVecDotBatchInvariant: the result depends only on the two rows, not on
// neighbouring data in the slices.
func TestVecDotBatchInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const n = 512
	for _, typ := range dotTestWeightTypes {
		vt := VecDotType(typ)
		w := testQuantize(typ, testRandRow(r, 2*n))
		x := testQuantize(vt, testRandRow(r, n))
		half := len(w) / 2
		a := VecDot(typ, n, w[:half], x)
		b := VecDot(typ, n, w[:half:half], append([]byte{}, x...))
		c := VecDot(typ, n, w, x) // longer slice, same first row
		if math.Float32bits(a) != math.Float32bits(b) || math.Float32bits(a) != math.Float32bits(c) {
			t.Errorf("%v: %g %g %g", typ, a, b, c)
		}
	}
}

func TestVecDotAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const n = 4096
	for _, typ := range dotTestWeightTypes {
		w := testQuantize(typ, testRandRow(r, n))
		x := testQuantize(VecDotType(typ), testRandRow(r, n))
		var sink float32
		if a := testing.AllocsPerRun(20, func() { sink += VecDot(typ, n, w, x) }); a != 0 {
			t.Errorf("VecDot(%v): %v allocs", typ, a)
		}
		_ = sink
	}
}

func BenchmarkVecDot(b *testing.B) {
	r := rand.New(rand.NewPCG(15, 16))
	const n = 4096
	for _, typ := range dotTestWeightTypes {
		w := testQuantize(typ, testRandRow(r, n))
		x := testQuantize(VecDotType(typ), testRandRow(r, n))
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(w)))
			var sink float32
			for b.Loop() {
				sink += VecDot(typ, n, w, x)
			}
			_ = sink
		})
	}
}

func BenchmarkDequantizeRow(b *testing.B) {
	r := rand.New(rand.NewPCG(17, 18))
	const n = 4096
	y := make([]float32, n)
	for _, typ := range dotTestWeightTypes {
		w := testQuantize(typ, testRandRow(r, n))
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				DequantizeRow(typ, w, y)
			}
		})
	}
}

// q8_1MinCorrection returns Σ_blocks m·(s − d·Σq): what the FP16 rounding
// of Q8_1's s adds to a Q4_1/Q5_1 dot product.
func q8_1MinCorrection(typ hal.DType, w, x []byte) float64 {
	ws := typ.TypeSize()
	var c float64
	for b := 0; b < len(x)/36; b++ {
		xb := x[36*b : 36*b+36]
		var sum int32
		for _, q := range xb[4:36] {
			sum += int32(int8(q))
		}
		m := float64(f16At(w[ws*b+2:]))
		c += m * (float64(f16At(xb[2:])) - float64(f16At(xb))*float64(sum))
	}
	return c
}
