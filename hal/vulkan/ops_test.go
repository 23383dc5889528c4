package vulkan

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
)

// testBackend opens the backend, or skips the test where Vulkan cannot run
// it, unless TANDEM_VULKAN=required (CI installs lavapipe and sets it, so
// that a broken installation fails instead of skipping).
func testBackend(t testing.TB, opts Options) *Backend {
	t.Helper()
	b, err := New(opts)
	if errors.Is(err, ErrUnavailable) && os.Getenv("TANDEM_VULKAN") != "required" {
		t.Skipf("Vulkan unavailable here (mesa-vulkan-drivers provides lavapipe): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// backends are the configurations the op tests run on: memory the host
// maps (lavapipe's, an integrated GPU's) and memory reached only through
// staging buffers (a discrete GPU's).
var configs = []struct {
	name string
	opts Options
}{
	{"mapped", Options{Device: -1}},
	{"staged", Options{Device: -1, NoHostMapping: true}},
}

func upload(t testing.TB, b hal.Backend, v []float32) hal.Buf {
	t.Helper()
	buf, err := b.NewBuf(len(v))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteBuf(buf, v); err != nil {
		t.Fatal(err)
	}
	return buf
}

func download(t testing.TB, b hal.Backend, buf hal.Buf, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	if err := b.ReadBuf(out, buf); err != nil {
		t.Fatal(err)
	}
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// randWeight is a rows×cols weight of type t from random values, quantized
// with hal/cpu's quantizers.
func randWeight(r *rand.Rand, t hal.DType, rows, cols int) *hal.Weight {
	rb, err := t.RowBytes(cols)
	if err != nil {
		panic(err)
	}
	data := make([]byte, rb*rows)
	for i := range rows {
		cpu.QuantizeRow(t, randVec(r, cols, 0.5), data[i*rb:(i+1)*rb])
	}
	return &hal.Weight{Name: fmt.Sprintf("w-%v-%dx%d", t, rows, cols), Type: t, Rows: rows, Cols: cols, Data: data}
}

// matmulTol bounds |got − want| for one output: the conversions of the
// activations (a scale that differs in its last bit moves a quant at a
// tie by one step) and the order of the sums differ from hal/cpu's, each a
// small fraction of Σ|w·x|.
func matmulTol(w *hal.Weight, x []float32, m, n int) float64 {
	row := make([]float32, w.Cols)
	cpu.DequantizeRow(w.Type, w.Data[n*w.RowBytes():(n+1)*w.RowBytes()], row)
	s := 0.0
	for k, v := range row {
		s += math.Abs(float64(v) * float64(x[m*w.Cols+k]))
	}
	return 2e-3*s + 1e-6
}

func TestMatMul(t *testing.T) {
	ref := cpu.New(1)
	defer ref.Close()
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			b := testBackend(t, cfg.opts)
			r := rand.New(rand.NewPCG(1, 2))
			for _, c := range []struct {
				t          hal.DType
				rows, cols int
			}{
				{hal.F32, 5, 7}, {hal.F32, 33, 172}, {hal.F32, 130, 64},
				{hal.F16, 3, 9}, {hal.F16, 67, 96}, {hal.F16, 17, 1030},
				{hal.Q8_0, 1, 32}, {hal.Q8_0, 65, 96}, {hal.Q8_0, 9, 1088},
				{hal.Q4_K, 3, 256}, {hal.Q4_K, 37, 512}, {hal.Q4_K, 8, 2304},
				{hal.Q6_K, 3, 256}, {hal.Q6_K, 37, 512}, {hal.Q6_K, 8, 2304},
				{hal.BF16, 9, 40}, {hal.BF16, 33, 1030},
				// Converted to F32 at upload.
				{hal.Q4_0, 11, 64}, {hal.Q5_1, 6, 96}, {hal.Q5_K, 5, 256}, {hal.Q3_K, 4, 512},
			} {
				w := randWeight(r, c.t, c.rows, c.cols)
				for _, m := range []int{1, 2, 3, 8, 9, 20} {
					t.Run(fmt.Sprintf("%v/%dx%d/m%d", c.t, c.rows, c.cols, m), func(t *testing.T) {
						x := randVec(r, m*c.cols, 1)
						want := make([]float32, m*c.rows)
						ref.MatMul(hal.HostBuf(want), hal.HostBuf(x), m, w)
						_, converted := encodingOf(c.t)
						tol := matmulTol
						if converted {
							// Float activations against the exact weights, where
							// hal/cpu converts the activations (to Q8_0, Q8_1 or
							// Q8_K): the reference is the exact product.
							want = exactMatMul(w, x, m)
							tol = func(w *hal.Weight, x []float32, m, n int) float64 { return matmulTol(w, x, m, n) / 100 }
						}
						xb, out := upload(t, b, x), upload(t, b, make([]float32, m*c.rows))
						defer b.FreeBuf(xb)
						defer b.FreeBuf(out)
						b.MatMul(out, xb, m, w)
						got := download(t, b, out, m*c.rows)
						for i := range want {
							mi, ni := i/c.rows, i%c.rows
							if d := math.Abs(float64(got[i] - want[i])); !(d <= tol(w, x, mi, ni)) {
								t.Fatalf("out[%d][%d] = %g, reference %g (tolerance %.3g)", mi, ni, got[i], want[i], tol(w, x, mi, ni))
							}
						}
						// Batch invariance: each row alone, in every form,
						// gives the bits it has in the batch.
						logits := make([]float32, c.rows)
						defer func() { b.form = -1 }()
						for mi := range m {
							for form := range numForms {
								b.form = form
								b.Logits(logits, xb.Slice(mi*c.cols, (mi+1)*c.cols), 1, w)
								for ni, v := range logits {
									if math.Float32bits(v) != math.Float32bits(got[mi*c.rows+ni]) {
										t.Fatalf("row %d alone, form %d: out[%d] = %g, in a batch of %d %g", mi, form, ni, v, m, got[mi*c.rows+ni])
									}
								}
							}
						}
					})
				}
			}
			if conv := b.ConvertedWeights(); len(conv) != 4 || conv["bf16→f32"] != 0 || conv["q4_0→f32"] != 1 || conv["q5_k→f32"] != 1 {
				t.Errorf("converted weights %v, want one each of q4_0, q5_1, q5_k, q3_k", conv)
			}
		})
	}
}

// exactMatMul is x·Wᵀ with W dequantized, summed in float64.
func exactMatMul(w *hal.Weight, x []float32, m int) []float32 {
	out := make([]float32, m*w.Rows)
	row := make([]float32, w.Cols)
	for n := range w.Rows {
		cpu.DequantizeRow(w.Type, w.Data[n*w.RowBytes():(n+1)*w.RowBytes()], row)
		for i := range m {
			s := 0.0
			for k, v := range row {
				s += float64(v) * float64(x[i*w.Cols+k])
			}
			out[i*w.Rows+n] = float32(s)
		}
	}
	return out
}

// A matrix of more rows than 65535 workgroups take (the limit of one grid
// dimension) folds its grid into z: every output is written, and each is
// the bits of the other forms.
func TestMatMulFoldedGrid(t *testing.T) {
	b := testBackend(t, Options{Device: -1})
	r := rand.New(rand.NewPCG(15, 16))
	w := randWeight(r, hal.F32, 2*65535+70, 8)
	x := upload(t, b, randVec(r, 8, 1))
	want := exactMatMul(w, download(t, b, x, 8), 1)
	var first []float32
	for _, form := range []int{formVec2, formVec32} {
		b.form = form
		got := make([]float32, w.Rows)
		b.Logits(got, x, 1, w)
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5) {
				t.Fatalf("form %d: out[%d] = %g, want %g", form, i, got[i], want[i])
			}
			if first != nil && math.Float32bits(got[i]) != math.Float32bits(first[i]) {
				t.Fatalf("form %d: out[%d] = %g, form %d %g", form, i, got[i], formVec2, first[i])
			}
		}
		first = got
	}
	b.form = -1
}

// MatMuls gives each product MatMul's bits, with one conversion shared.
func TestMatMuls(t *testing.T) {
	b := testBackend(t, Options{Device: -1})
	r := rand.New(rand.NewPCG(3, 4))
	ws := []*hal.Weight{randWeight(r, hal.Q8_0, 40, 64), randWeight(r, hal.Q8_0, 24, 64), randWeight(r, hal.F16, 8, 64), randWeight(r, hal.Q4_K, 5, 256)}
	x := upload(t, b, randVec(r, 4*256, 1))
	for _, set := range [][]*hal.Weight{ws[:3], ws[3:]} {
		cols := set[0].Cols
		var ps []hal.MatMulOut
		var want [][]float32
		for _, w := range set {
			o := upload(t, b, make([]float32, 4*w.Rows))
			b.MatMul(o, x.Slice(0, 4*cols), 4, w)
			want = append(want, download(t, b, o, 4*w.Rows))
			ps = append(ps, hal.MatMulOut{Out: upload(t, b, make([]float32, 4*w.Rows)), W: w})
		}
		b.MatMuls(x.Slice(0, 4*cols), 4, ps)
		for i, p := range ps {
			got := download(t, b, p.Out, 4*p.W.Rows)
			for j := range got {
				if math.Float32bits(got[j]) != math.Float32bits(want[i][j]) {
					t.Fatalf("%s: MatMuls %g, MatMul %g at %d", p.W.Name, got[j], want[i][j], j)
				}
			}
		}
	}
}

// Embed gives hal/cpu's bits for every type: the same float32 operations.
func TestEmbed(t *testing.T) {
	ref := cpu.New(1)
	defer ref.Close()
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			b := testBackend(t, cfg.opts)
			r := rand.New(rand.NewPCG(5, 6))
			for _, c := range []struct {
				t    hal.DType
				cols int
			}{{hal.F32, 7}, {hal.F16, 33}, {hal.Q8_0, 96}, {hal.Q4_K, 512}, {hal.Q6_K, 512}, {hal.BF16, 16}, {hal.Q4_1, 64}, {hal.Q2_K, 256}} {
				w := randWeight(r, c.t, 50, c.cols)
				ids := []int32{0, 49, 7, 7, 31}
				want := make([]float32, len(ids)*c.cols)
				ref.Embed(hal.HostBuf(want), w, ids)
				out := upload(t, b, make([]float32, len(want)))
				b.Embed(out, w, ids)
				got := download(t, b, out, len(want))
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%v: value %d: %g, hal/cpu %g", c.t, i, got[i], want[i])
					}
				}
			}
		})
	}
}

func closeTo(t *testing.T, what string, got, want []float32, rel, abs float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= abs+rel*math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %g, hal/cpu %g", what, i, got[i], want[i])
		}
	}
}

func TestNormRoPEElementwise(t *testing.T) {
	ref := cpu.New(1)
	defer ref.Close()
	b := testBackend(t, Options{Device: -1})
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 8, 63, 64, 65, 896, 4099} {
		for _, rows := range []int{1, 3, 17} {
			x, w := randVec(r, rows*n, 2), randVec(r, n, 1)
			want := make([]float32, rows*n)
			ref.RMSNorm(hal.HostBuf(want), hal.HostBuf(x), w, 1e-5)
			xb := upload(t, b, x)
			ob := upload(t, b, make([]float32, rows*n))
			b.RMSNorm(ob, xb, w, 1e-5)
			closeTo(t, fmt.Sprintf("rmsnorm %dx%d", rows, n), download(t, b, ob, rows*n), want, 1e-5, 1e-6)
			b.RMSNorm(xb, xb, w, 1e-5) // in place
			closeTo(t, "rmsnorm in place", download(t, b, xb, rows*n), want, 1e-5, 1e-6)
		}
	}
	for _, c := range []struct {
		name string
		rope hal.RoPE
	}{
		{"adjacent", hal.RoPE{Dims: 16, Base: 10000}},
		{"neox", hal.RoPE{Dims: 64, Base: 1e6, Neox: true}},
		{"partial neox", hal.RoPE{Dims: 32, Base: 500000, Neox: true, FreqScale: 0.25}},
		{"llama3 factors", hal.RoPE{Dims: 8, Base: 500000, FreqFactors: []float32{1, 1.5, 4, 8}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			headDim := max(c.rope.Dims, 64)
			heads := 3
			pos := []int32{0, 1, 17, 2047, 3000, 5}
			x := randVec(r, len(pos)*heads*headDim, 1)
			want := append([]float32(nil), x...)
			ref.RoPE(hal.HostBuf(want), heads, headDim, pos, &c.rope)
			xb := upload(t, b, x)
			b.RoPE(xb, heads, headDim, pos, &c.rope)
			closeTo(t, "rope", download(t, b, xb, len(x)), want, 1e-6, 1e-6)
		})
	}
	for _, n := range []int{1, 255, 256, 257, 100000} {
		g, u := randVec(r, n, 3), randVec(r, n, 1)
		want := append([]float32(nil), g...)
		ref.SiLUMul(hal.HostBuf(want), hal.HostBuf(u))
		gb, ub := upload(t, b, g), upload(t, b, u)
		b.SiLUMul(gb, ub)
		closeTo(t, "silu", download(t, b, gb, n), want, 1e-5, 1e-6)
		want = append([]float32(nil), g...)
		ref.Add(hal.HostBuf(want), hal.HostBuf(u))
		ab := upload(t, b, g)
		b.Add(ab, ub)
		closeTo(t, "add", download(t, b, ab, n), want, 0, 0)
	}
	x, bias := randVec(r, 5*12, 1), randVec(r, 12, 1)
	want := append([]float32(nil), x...)
	ref.AddBias(hal.HostBuf(want), bias)
	xb := upload(t, b, x)
	b.AddBias(xb, bias)
	closeTo(t, "bias", download(t, b, xb, len(x)), want, 0, 0)
	src := randVec(r, 6*10, 1)
	rows := []int{5, 0, 3, 3}
	want = make([]float32, len(rows)*10)
	ref.CopyRows(hal.HostBuf(want), hal.HostBuf(src), 10, rows)
	db := upload(t, b, make([]float32, len(want)))
	b.CopyRows(db, upload(t, b, src), 10, rows)
	closeTo(t, "copyrows", download(t, b, db, len(want)), want, 0, 0)
}

// Steps of more than 65535 tokens fold their rows into z: Embed and
// MatMul (through its activation conversion) reach every row.
func TestRowsFoldedGrid(t *testing.T) {
	ref := cpu.New(1)
	defer ref.Close()
	b := testBackend(t, Options{Device: -1})
	r := rand.New(rand.NewPCG(17, 18))
	const rows = 65535 + 300
	emb := randWeight(r, hal.F32, 10, 32)
	ids := make([]int32, rows)
	for i := range ids {
		ids[i] = int32(r.IntN(10))
	}
	x := upload(t, b, make([]float32, rows*32))
	b.Embed(x, emb, ids)
	w := randWeight(r, hal.Q8_0, 3, 32)
	out := upload(t, b, make([]float32, rows*3))
	b.MatMul(out, x, rows, w)
	got := download(t, b, out, rows*3)
	xs := make([]float32, rows*32)
	ref.Embed(hal.HostBuf(xs), emb, ids)
	want := make([]float32, rows*3)
	ref.MatMul(hal.HostBuf(want), hal.HostBuf(xs), rows, w)
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= matmulTol(w, xs, i/3, i%3)) {
			t.Fatalf("out[%d] = %g, hal/cpu %g", i, got[i], want[i])
		}
	}
}
