package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"tandem/gguf"
	"tandem/hal"
)

// quantTestTypes are the types QuantizeRow and DequantizeRow handle.
var quantTestTypes = []hal.DType{
	hal.F32, hal.F16, hal.BF16,
	hal.Q4_0, hal.Q4_1, hal.Q5_0, hal.Q5_1, hal.Q8_0, hal.Q8_1,
	hal.Q2_K, hal.Q3_K, hal.Q4_K, hal.Q5_K, hal.Q6_K, hal.Q8_K,
}

// testRandRow returns n N(0, 1) values with a few outliers, so blocks see
// skewed ranges as well as symmetric ones.
func testRandRow(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		if r.IntN(97) == 0 {
			x[i] *= 6
		}
	}
	return x
}

func testQuantize(t hal.DType, x []float32) []byte {
	nb, err := t.RowBytes(len(x))
	if err != nil {
		panic(err)
	}
	b := make([]byte, nb)
	QuantizeRow(t, x, b)
	return b
}

func testDequantize(t hal.DType, b []byte, n int) []float32 {
	y := make([]float32, n)
	DequantizeRow(t, b, y)
	return y
}

// TestQuantizeRoundTrip quantizes random rows and checks the error of the
// dequantized values: per element for the float types, against the largest
// magnitude in the block for the 32-blocks (their worst case is analytic),
// and as RMS error over RMS value for the K-quants.
func TestQuantizeRoundTrip(t *testing.T) {
	tests := []struct {
		t        hal.DType
		elemRel  float64 // |err| ≤ elemRel·|x| (float types)
		blockRel float64 // |err| ≤ blockRel·max|x| over the 32-block
		rmsRel   float64 // rms(err) ≤ rmsRel·rms(x)
	}{
		{t: hal.F32},
		{t: hal.F16, elemRel: 0x1p-11},
		{t: hal.BF16, elemRel: 0x1p-8},
		{t: hal.Q8_0, blockRel: (0.5 + 0x1p-11*127) / 127, rmsRel: 0.01},
		{t: hal.Q8_1, blockRel: (0.5 + 0x1p-11*127) / 127, rmsRel: 0.01},
		{t: hal.Q8_K, blockRel: 0.5/127 + 1e-6, rmsRel: 0.025},
		{t: hal.Q4_0, blockRel: 1.0/8 + 1e-3, rmsRel: 0.14},
		{t: hal.Q4_1, blockRel: 1.0/15 + 1e-3, rmsRel: 0.12},
		{t: hal.Q5_0, blockRel: 1.0/16 + 1e-3, rmsRel: 0.07},
		{t: hal.Q5_1, blockRel: 1.0/31 + 1e-3, rmsRel: 0.06},
		{t: hal.Q2_K, rmsRel: 0.42},
		{t: hal.Q3_K, rmsRel: 0.24},
		{t: hal.Q4_K, rmsRel: 0.11},
		{t: hal.Q5_K, rmsRel: 0.055},
		{t: hal.Q6_K, rmsRel: 0.03},
	}
	r := rand.New(rand.NewPCG(3, 4))
	const n = 8 * 256
	for _, tc := range tests {
		t.Run(tc.t.String(), func(t *testing.T) {
			float := !tc.t.Quantized()
			for trial := range 4 {
				x := testRandRow(r, n)
				if trial == 3 { // a row with zero blocks and tiny blocks
					clear(x[:256])
					for i := 256; i < 512; i++ {
						x[i] *= 1e-6
					}
				}
				y := testDequantize(tc.t, testQuantize(tc.t, x), n)
				var se, sx float64
				for i := range x {
					e := math.Abs(float64(y[i]) - float64(x[i]))
					se += e * e
					sx += float64(x[i]) * float64(x[i])
					// 2^-25: F16 subnormals have absolute, not relative, precision.
					if float && e > tc.elemRel*math.Abs(float64(x[i]))+0x1p-25 {
						t.Fatalf("element %d: %g -> %g, error %g", i, x[i], y[i], e)
					}
					if tc.blockRel > 0 {
						// Slack for FP16 scales of tiny blocks, which become
						// subnormal (absolute precision 2^-24).
						bs := tc.t.BlockSize()
						amax := float64(absMaxF32(x[i/bs*bs : i/bs*bs+bs]))
						if e > tc.blockRel*amax+128*0x1p-24 {
							t.Fatalf("element %d: %g -> %g, error %g exceeds %g of block max %g",
								i, x[i], y[i], e, tc.blockRel, amax)
						}
					}
				}
				for i := range 256 {
					if trial == 3 && y[i] != 0 {
						t.Fatalf("zero block element %d dequantized to %g", i, y[i])
					}
				}
				if rel := math.Sqrt(se / sx); !float && rel > tc.rmsRel {
					t.Errorf("trial %d: rms error %.4f of rms, want ≤ %.4f", trial, rel, tc.rmsRel)
				} else if trial == 0 {
					t.Logf("rms error %.4f of rms", rel)
				}
			}
		})
	}
}

// TestQ8Rounding pins the activation quantizers' rounding: ties go to even
// (x86 backend), and the scale is amax/127 stored as FP16 (Q8_0, Q8_1) or
// float32 (Q8_K, with the sign of the extreme element).
func TestQ8Rounding(t *testing.T) {
	// amax 127 makes the inverse scale exactly ±1, so x itself is rounded.
	x := make([]float32, 256)
	ties := []float32{0.5, 1.5, 2.5, -2.5, -3.5, 3.49, 126.5, -0.5}
	want := []int8{0, 2, 2, -2, -4, 3, 126, 0}
	copy(x, ties)
	x[31] = 127
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q8_1} {
		b := testQuantize(typ, x[:32])
		off := 2
		if typ == hal.Q8_1 {
			off = 4
		}
		if d := f16At(b); d != 1 {
			t.Errorf("%v: d = %g, want 1", typ, d)
		}
		var sum int32
		for i, w := range want {
			if got := int8(b[off+i]); got != w {
				t.Errorf("%v: x=%g quantized to %d, want %d", typ, ties[i], got, w)
			}
		}
		for i := range 32 {
			sum += int32(int8(b[off+i]))
		}
		if typ == hal.Q8_1 {
			if s := f16At(b[2:]); s != roundF16(float32(sum)) {
				t.Errorf("Q8_1 s = %g, want %d", s, sum)
			}
		}
	}
	// Q8_K: the extreme element is positive, so iscale = -127/127 = -1.
	b := testQuantize(hal.Q8_K, x)
	if d := math.Float32frombits(binary.LittleEndian.Uint32(b)); d != -1 {
		t.Errorf("Q8_K d = %g, want -1", d)
	}
	for i, w := range want {
		if got := int8(b[4+i]); got != -w {
			t.Errorf("Q8_K: x=%g quantized to %d, want %d", ties[i], got, -w)
		}
	}
	var s0 int32
	for i := range 16 {
		s0 += int32(int8(b[4+i]))
	}
	if got := int16(binary.LittleEndian.Uint16(b[260:])); int32(got) != s0 {
		t.Errorf("Q8_K bsums[0] = %d, want %d", got, s0)
	}
}

// TestQ8MatchesFormula checks the activation quantizers against a direct
// float64 statement of the same arithmetic on random data.
func TestQ8MatchesFormula(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := testRandRow(r, 4096)
	b0, b1, bk := testQuantize(hal.Q8_0, x), testQuantize(hal.Q8_1, x), testQuantize(hal.Q8_K, x)
	for blk := range len(x) / 32 {
		xs := x[32*blk : 32*blk+32]
		amax := absMaxF32(xs)
		d := amax / 127
		id := 127 / amax
		var sum int32
		for j, v := range xs {
			q := int8(math.RoundToEven(float64(v * id)))
			sum += int32(q)
			if got := int8(b0[34*blk+2+j]); got != q {
				t.Fatalf("Q8_0 block %d elem %d: %d, want %d", blk, j, got, q)
			}
			if got := int8(b1[36*blk+4+j]); got != q {
				t.Fatalf("Q8_1 block %d elem %d: %d, want %d", blk, j, got, q)
			}
		}
		if got := binary.LittleEndian.Uint16(b0[34*blk:]); got != FP32ToFP16(d) {
			t.Fatalf("Q8_0 block %d: d bits %#x, want %#x", blk, got, FP32ToFP16(d))
		}
		if got := binary.LittleEndian.Uint16(b1[36*blk+2:]); got != FP32ToFP16(float32(sum)*d) {
			t.Fatalf("Q8_1 block %d: s bits %#x", blk, got)
		}
	}
	for blk := range len(x) / 256 {
		xs := x[256*blk : 256*blk+256]
		m := signedAbsMax(xs)
		iscale := -127 / m
		for j, v := range xs {
			q := int8(min(127, math.RoundToEven(float64(iscale*v))))
			if got := int8(bk[292*blk+4+j]); got != q {
				t.Fatalf("Q8_K block %d elem %d: %d, want %d", blk, j, got, q)
			}
		}
		if got := math.Float32frombits(binary.LittleEndian.Uint32(bk[292*blk:])); got != 1/iscale {
			t.Fatalf("Q8_K block %d: d %g, want %g", blk, got, 1/iscale)
		}
	}
}

// TestBlockLayouts decodes hand-built blocks whose meaning follows from
// ggml's block structs, independently of the quantizers.
func TestBlockLayouts(t *testing.T) {
	one := binary.LittleEndian.AppendUint16(nil, 0x3c00) // FP16 1.0
	half := binary.LittleEndian.AppendUint16(nil, 0x3800)

	t.Run("Q4_0", func(t *testing.T) {
		b := append([]byte{}, one...)
		for j := range 16 {
			b = append(b, byte(j)|byte(15-j)<<4)
		}
		y := testDequantize(hal.Q4_0, b, 32)
		for j := range 16 {
			if y[j] != float32(j-8) || y[j+16] != float32(7-j) {
				t.Fatalf("j=%d: got %g, %g", j, y[j], y[j+16])
			}
		}
	})
	t.Run("Q4_1", func(t *testing.T) {
		b := append(append([]byte{}, half...), one...) // d 0.5, m 1
		for j := range 16 {
			b = append(b, byte(j)|byte(15-j)<<4)
		}
		y := testDequantize(hal.Q4_1, b, 32)
		for j := range 16 {
			if y[j] != 0.5*float32(j)+1 || y[j+16] != 0.5*float32(15-j)+1 {
				t.Fatalf("j=%d: got %g, %g", j, y[j], y[j+16])
			}
		}
	})
	t.Run("Q5_0 and Q5_1", func(t *testing.T) {
		// qh bit j (element j) set for even j; bit 16+j (element 16+j) for j%3==0.
		var qh uint32
		for j := range 16 {
			if j%2 == 0 {
				qh |= 1 << j
			}
			if j%3 == 0 {
				qh |= 1 << (16 + j)
			}
		}
		qs := make([]byte, 16)
		for j := range qs {
			qs[j] = byte(j) | byte(15-j)<<4
		}
		want := func(j int) (lo, hi int) {
			lo, hi = j, 15-j
			if j%2 == 0 {
				lo += 16
			}
			if j%3 == 0 {
				hi += 16
			}
			return
		}
		b0 := append(append(append([]byte{}, one...), binary.LittleEndian.AppendUint32(nil, qh)...), qs...)
		y := testDequantize(hal.Q5_0, b0, 32)
		b1 := append(append(append(append([]byte{}, one...), one...), binary.LittleEndian.AppendUint32(nil, qh)...), qs...)
		y1 := testDequantize(hal.Q5_1, b1, 32)
		for j := range 16 {
			lo, hi := want(j)
			if y[j] != float32(lo-16) || y[j+16] != float32(hi-16) {
				t.Fatalf("Q5_0 j=%d: got %g, %g want %d, %d", j, y[j], y[j+16], lo-16, hi-16)
			}
			if y1[j] != float32(lo+1) || y1[j+16] != float32(hi+1) {
				t.Fatalf("Q5_1 j=%d: got %g, %g", j, y1[j], y1[j+16])
			}
		}
	})
	t.Run("Q4_K scales", func(t *testing.T) {
		// Sub-block j gets scale 10+j and min j (6-bit values, some ≥ 16 so
		// the high bits of the packed form are used), all quants 1.
		b := make([]byte, 144)
		copy(b, one)
		copy(b[2:], half)
		s := b[4:16]
		for j := range 8 {
			ls, lm := byte(10+7*j), byte(9*j)
			if j < 4 {
				s[j], s[j+4] = ls, lm
			} else {
				s[j+4] = ls&15 | (lm&15)<<4
				s[j-4] |= ls >> 4 << 6
				s[j] |= lm >> 4 << 6
			}
		}
		for i := 16; i < 144; i++ {
			b[i] = 0x11
		}
		y := testDequantize(hal.Q4_K, b, 256)
		for e, v := range y {
			j := e / 32
			if want := float32(10+7*j) - 0.5*float32(9*j); v != want {
				t.Fatalf("element %d: %g, want %g", e, v, want)
			}
		}
	})
	t.Run("Q6_K", func(t *testing.T) {
		// Element e gets quant (e*7)%64 - 32 and its 16-group scale g-8.
		b := make([]byte, 210)
		q := func(e int) int { return (e * 7) % 64 }
		for e := range 256 {
			h, k, l := e/128, (e/32)%4, e%32
			v := byte(q(e))
			li := 64*h + 32*(k%2) + l
			if k >= 2 {
				b[li] |= (v & 15) << 4
			} else {
				b[li] |= v & 15
			}
			b[128+32*h+l] |= (v >> 4) << (2 * k)
		}
		for g := range 16 {
			b[192+g] = byte(int8(g - 8))
		}
		copy(b[208:], one)
		y := testDequantize(hal.Q6_K, b, 256)
		for e, v := range y {
			if want := float32((e/16 - 8) * (q(e) - 32)); v != want {
				t.Fatalf("element %d: %g, want %g", e, v, want)
			}
		}
	})
}

func quantFixturesDir(t testing.TB) string {
	dir := os.Getenv("TANDEM_FIXTURES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "fixtures")
	}
	models := filepath.Join(dir, "models")
	if _, err := os.Stat(models); err != nil {
		abs, _ := filepath.Abs(models)
		t.Skipf("fixtures not found at %s (set TANDEM_FIXTURES): %v", abs, err)
	}
	return models
}

func quantOpenFixture(t *testing.T, name string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(filepath.Join(quantFixturesDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// quantTensorFloats dequantizes a whole tensor row by row.
func quantTensorFloats(t *testing.T, f *gguf.File, name string) (*gguf.TensorInfo, []float32) {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	data := f.TensorData(ti)
	n := int(ti.Elements())
	out := make([]float32, n)
	row := int(ti.Dims[0])
	rb, err := ti.Type.RowBytes(row)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < n/row; r++ {
		DequantizeRow(ti.Type, data[r*rb:(r+1)*rb], out[r*row:(r+1)*row])
	}
	return ti, out
}

// TestFixtureTwins compares tensors of llama-quantize's outputs with their
// F32 source: F16 and BF16 must be exactly the rounded F32 values, Q8_0 must
// be byte-identical to ggml's reference quantizer (and dequantize within
// half a quantization step).
func TestFixtureTwins(t *testing.T) {
	tensors := []string{"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "output.weight", "token_embd.weight"}
	for _, tw := range []struct {
		f32, other string
		typ        hal.DType
	}{
		{"rand-llama-tok512-f32.gguf", "rand-llama-tok512-f16.gguf", hal.F16},
		{"rand-llama-tok512-f32.gguf", "rand-llama-tok512-bf16.gguf", hal.BF16},
		{"rand-llama-tok512-f32.gguf", "rand-llama-tok512-q8_0.gguf", hal.Q8_0},
		{"stories260K-f32.gguf", "stories260K-f16.gguf", hal.F16},
		{"stories260K-f32.gguf", "stories260K-q8_0.gguf", hal.Q8_0},
	} {
		t.Run(tw.other, func(t *testing.T) {
			ref, other := quantOpenFixture(t, tw.f32), quantOpenFixture(t, tw.other)
			for _, name := range tensors {
				ti, ok := other.Tensor(name)
				if !ok || ti.Type != tw.typ {
					continue // e.g. stories260K's ffn_down stays F32
				}
				rti, want := quantTensorFloats(t, ref, name)
				if rti.Type != hal.F32 {
					t.Fatalf("%s: reference is %v", name, rti.Type)
				}
				_, got := quantTensorFloats(t, other, name)
				raw := other.TensorData(ti)
				// Requantizing the F32 source must reproduce the file's bytes.
				var requant []byte
				switch tw.typ {
				case hal.Q8_0:
					requant = make([]byte, len(raw))
					quantizeQ8_0Ref(want, requant)
				default:
					requant = testQuantize(tw.typ, want)
				}
				if string(requant) != string(raw) {
					t.Errorf("%s: requantized bytes differ from the file", name)
				}
				for i := range want {
					var ok bool
					switch tw.typ {
					case hal.F16:
						ok = got[i] == roundF16(want[i])
					case hal.BF16:
						ok = got[i] == BF16ToFP32(FP32ToBF16(want[i]))
					case hal.Q8_0:
						b := i / 32 * 32
						d := float64(f16At(raw[b/32*34:]))
						// Half a step, plus the FP16 rounding of d: 127·d·2^-11.
						ok = math.Abs(float64(got[i]-want[i])) <= (0.5+127*0x1p-11)*d*(1+1e-6)
					}
					if !ok {
						t.Fatalf("%s[%d]: %v gives %g, f32 %g", name, i, tw.typ, got[i], want[i])
					}
				}
				t.Logf("%s %v %v: ok", name, ti.Dims, ti.Type)
			}
		})
	}
}

// TestFixtureKQuants checks the Q4_K_M model's tensors by their statistics:
// its matrices were drawn from N(0, 0.1²) before llama-quantize.
func TestFixtureKQuants(t *testing.T) {
	f := quantOpenFixture(t, "rand-llama256-tok512-q4_k_m.gguf")
	seen := map[hal.DType]bool{}
	for _, name := range []string{
		"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_up.weight",
		"blk.1.attn_v.weight", "blk.1.ffn_down.weight", "blk.0.ffn_down.weight",
	} {
		ti, x := quantTensorFloats(t, f, name)
		seen[ti.Type] = true
		var s, s2 float64
		for _, v := range x {
			s += float64(v)
			s2 += float64(v) * float64(v)
		}
		n := float64(len(x))
		mean := s / n
		std := math.Sqrt(s2/n - mean*mean)
		t.Logf("%s %v %v: mean %.5f std %.5f", name, ti.Type, ti.Dims, mean, std)
		if math.Abs(mean) > 0.1*4/math.Sqrt(n)+1e-3 || math.Abs(std-0.1) > 0.004 {
			t.Errorf("%s (%v): mean %g std %g, want about 0 and 0.1", name, ti.Type, mean, std)
		}
	}
	if !seen[hal.Q4_K] || !seen[hal.Q6_K] {
		t.Errorf("expected Q4_K and Q6_K tensors, saw %v", seen)
	}
}

func TestQuantizeAllocs(t *testing.T) {
	x := testRandRow(rand.New(rand.NewPCG(7, 8)), 4096)
	for _, typ := range []hal.DType{hal.F32, hal.F16, hal.BF16, hal.Q8_0, hal.Q8_1, hal.Q8_K} {
		b := testQuantize(typ, x)
		if a := testing.AllocsPerRun(20, func() { QuantizeRow(typ, x, b) }); a != 0 {
			t.Errorf("QuantizeRow(%v): %v allocs", typ, a)
		}
	}
}

func BenchmarkQuantizeRow(b *testing.B) {
	x := testRandRow(rand.New(rand.NewPCG(7, 8)), 4096)
	for _, typ := range []hal.DType{hal.F16, hal.BF16, hal.Q8_0, hal.Q8_1, hal.Q8_K} {
		buf := testQuantize(typ, x)
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				QuantizeRow(typ, x, buf)
			}
		})
	}
}
