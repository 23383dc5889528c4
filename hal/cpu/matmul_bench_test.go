package cpu

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"tandem/hal"
)

// benchWeight builds a rows×k weight of type typ by repeating a few
// quantized random rows (the contents do not matter for speed).
func benchWeight(typ hal.DType, rows, k int) *hal.Weight {
	r := rand.New(rand.NewPCG(31, 32))
	var uniq [][]byte
	for range 8 {
		uniq = append(uniq, testQuantize(typ, testRandRow(r, k)))
	}
	rb := len(uniq[0])
	data := make([]byte, rows*rb)
	for i := range rows {
		copy(data[i*rb:], uniq[i%8])
	}
	return &hal.Weight{Type: typ, Rows: rows, Cols: k, Data: data}
}

// BenchmarkMatMulDecode streams a weight far larger than the caches
// through one activation row, as a decode step does (GB/s of weights).
func BenchmarkMatMulDecode(b *testing.B) {
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0, hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q6_K, hal.F16, hal.BF16} {
		k := 896
		if typ.BlockSize() == 256 {
			k = 4864
		}
		rb, _ := typ.RowBytes(k)
		rows := (192 << 20) / rb
		w := benchWeight(typ, rows, k)
		x := testRandRow(rand.New(rand.NewPCG(1, 2)), k)
		out := make([]float32, rows)
		be := New(0)
		be.MatMul(hal.HostBuf(out), hal.HostBuf(x), 1, w) // packs w where its format is packed
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(len(w.Data)))
			b.ReportAllocs()
			for b.Loop() {
				be.MatMul(hal.HostBuf(out), hal.HostBuf(x), 1, w)
			}
		})
		be.Close()
	}
}

// BenchmarkMatMulBatch16 streams a weight far larger than the caches
// through 16 activation rows, as a batched decode step of 16 sequences
// does (GB/s of weights).
func BenchmarkMatMulBatch16(b *testing.B) {
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0, hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q6_K} {
		k := 896
		if typ.BlockSize() == 256 {
			k = 4864
		}
		rb, _ := typ.RowBytes(k)
		rows := (192 << 20) / rb
		w := benchWeight(typ, rows, k)
		x := testRandRow(rand.New(rand.NewPCG(1, 2)), 16*k)
		out := make([]float32, 16*rows)
		be := New(0)
		be.MatMul(hal.HostBuf(out), hal.HostBuf(x), 16, w)
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(len(w.Data)))
			for b.Loop() {
				be.MatMul(hal.HostBuf(out), hal.HostBuf(x), 16, w)
			}
		})
		be.Close()
	}
}

// BenchmarkMatMulPrompt: a 64-row batch against an FFN-sized weight.
func BenchmarkMatMulPrompt(b *testing.B) {
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0, hal.Q4_0, hal.Q4_1, hal.Q5_1, hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K, hal.F16, hal.BF16} {
		k, n, m := 896, 4864, 64
		if typ.BlockSize() == 256 {
			k, n = n, k
		}
		w := benchWeight(typ, n, k)
		x := testRandRow(rand.New(rand.NewPCG(1, 2)), m*k)
		out := make([]float32, m*n)
		be := New(0)
		be.MatMul(hal.HostBuf(out), hal.HostBuf(x), m, w)
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				be.MatMul(hal.HostBuf(out), hal.HostBuf(x), m, w)
			}
			b.ReportMetric(float64(2*k*n*m)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		be.Close()
	}
}

// BenchmarkKernelStream: one thread streams a large weight through the
// single-row and the two-row kernels (GB/s of weights).
func BenchmarkKernelStream(b *testing.B) {
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0} {
		const k = 896
		rb, _ := typ.RowBytes(k)
		for _, size := range []int{256 << 10, 128 << 20} {
			rows := size / rb &^ 1
			w := benchWeight(typ, rows, k)
			x := testQuantize(hal.Q8_0, testRandRow(rand.New(rand.NewPCG(1, 2)), k))
			dot, dot2 := kern.dot[typ], kern.dot2[typ]
			var sink float32
			b.Run(typ.String()+"/"+byteSize(size)+"/x1", func(b *testing.B) {
				b.SetBytes(int64(len(w.Data)))
				for b.Loop() {
					for j := range rows {
						sink += dot(k, w.Data[j*rb:(j+1)*rb], x)
					}
				}
			})
			if dot2 == nil {
				continue
			}
			b.Run(typ.String()+"/"+byteSize(size)+"/x2", func(b *testing.B) {
				b.SetBytes(int64(len(w.Data)))
				var o [2]float32
				for b.Loop() {
					for j := 0; j < rows; j += 2 {
						dot2(k, w.Data[j*rb:(j+2)*rb], rb, x, &o)
						sink += o[0]
					}
				}
			})
			_ = sink
		}
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprintf("%dK", n>>10)
}

// BenchmarkMatMulF16 runs the F16 shapes of Qwen2.5-0.5B's FFN (4864
// rows of 896) for a 512-row prompt, a 16-row batch and one row, a weight
// far larger than the caches for one row, and Llama-3.2-1B's FFN down
// projection (2048 rows of 8192) for a 512-row prompt, and 16 rows
// against a weight far larger than the caches, through each packed kernel
// variant, so that they compare side by side: "x4" the four-row and
// single-row kernels alone, "x8"… with a wide kernel of that many rows,
// "x8pf" one that also prefetches the next group; "x1" the single-row
// kernel.
func BenchmarkMatMulF16(b *testing.B) { benchMatMulFloat(b, hal.F16) }

// BenchmarkMatMulBF16 is BenchmarkMatMulF16 for the packed BF16 kernels.
func BenchmarkMatMulBF16(b *testing.B) { benchMatMulFloat(b, hal.BF16) }

// BenchmarkMatMulF32 is BenchmarkMatMulF16 for the packed F32 kernels.
func BenchmarkMatMulF32(b *testing.B) { benchMatMulFloat(b, hal.F32) }

func benchMatMulFloat(b *testing.B, typ hal.DType) {
	f := packFormatFor(kern.isa, typ)
	if f == nil {
		b.Skipf("no packed %v kernels for ISA %s on this CPU", typ, kern.isa)
	}
	variants := packVariants(f)
	for _, c := range []struct {
		name    string
		k, n, m int
	}{
		{"prompt", 896, 4864, 512}, {"batch16", 896, 4864, 16}, {"row", 896, 4864, 1},
		{"stream", 896, (192 << 20) / (2 * 896), 1},
		{"prompt-k8192", 8192, 2048, 512}, // Llama-3.2-1B's FFN down projection
		{"batch16-stream", 896, (192 << 20) / (2 * 896), 16},
	} {
		k, n, m := c.k, c.n, c.m
		w := benchWeight(typ, n, k)
		x := testRandRow(rand.New(rand.NewPCG(1, 2)), m*k)
		out := make([]float32, m*n)
		names := []string{"x1"}
		if m > 1 {
			names = slices.Sorted(maps.Keys(variants))
		}
		for _, name := range names {
			v := variants[name]
			if m == 1 {
				v = f
			}
			be := New(0)
			be.MatMul(hal.HostBuf(out), hal.HostBuf(x), m, w)
			be.packs.m[w].f = v
			b.Run(c.name+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					be.MatMul(hal.HostBuf(out), hal.HostBuf(x), m, w)
				}
				b.ReportMetric(float64(2*k*n*m)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				b.ReportMetric(float64(len(w.Data))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
			be.Close()
		}
	}
}
