package gguf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"tandem/dtype"
	"tandem/internal/fixtures"
)

func fixturesDir(t testing.TB) string { return fixtures.Dir(t) }

func fixture(t testing.TB, name string) string {
	return filepath.Join(fixturesDir(t), "models", name)
}

func openFixture(t testing.TB, name string) *File {
	t.Helper()
	f, err := Open(fixture(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func wantString(t *testing.T, f *File, key, want string) {
	t.Helper()
	if got, ok := f.String(key); !ok || got != want {
		t.Errorf("%s = %q, %v; want %q", key, got, ok, want)
	}
}

func wantUint(t *testing.T, f *File, key string, want uint64) {
	t.Helper()
	if got, ok := f.Uint(key); !ok || got != want {
		t.Errorf("%s = %d, %v; want %d", key, got, ok, want)
	}
}

func wantStrings(t *testing.T, f *File, key string, n int) []string {
	t.Helper()
	s, ok := f.Strings(key)
	if !ok || len(s) != n {
		t.Errorf("%s: %d strings, %v; want %d", key, len(s), ok, n)
	}
	return s
}

func wantTensor(t *testing.T, f *File, name string, typ dtype.DType, dims ...uint64) {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Errorf("tensor %s missing", name)
		return
	}
	if ti.Type != typ || (dims != nil && !reflect.DeepEqual(ti.Dims, dims)) {
		t.Errorf("tensor %s: %v %v, want %v %v", name, ti.Type, ti.Dims, typ, dims)
	}
}

func TestFixtures(t *testing.T) {
	tests := []struct {
		file  string
		check func(t *testing.T, f *File)
	}{
		{"stories260K-f32.gguf", func(t *testing.T, f *File) {
			wantString(t, f, "general.architecture", "llama")
			wantUint(t, f, "llama.embedding_length", 64)
			wantUint(t, f, "llama.block_count", 5)
			wantTensor(t, f, "token_embd.weight", dtype.F32, 64, 512)
			wantTensor(t, f, "output.weight", dtype.F32, 64, 512)
			tokens := wantStrings(t, f, "tokenizer.ggml.tokens", 512)
			if len(tokens) > 3 && tokens[1] != "<s>" {
				t.Errorf("token 1 = %q, want <s>", tokens[1])
			}
			if eps, ok := f.Float("llama.attention.layer_norm_rms_epsilon"); !ok || math.Abs(eps-1e-5) > 1e-9 {
				t.Errorf("rms eps = %v, %v", eps, ok)
			}
			if len(f.Tensors) != 3+5*9 {
				t.Errorf("%d tensors, want %d", len(f.Tensors), 3+5*9)
			}
		}},
		{"stories260K-f16.gguf", func(t *testing.T, f *File) {
			wantTensor(t, f, "token_embd.weight", dtype.F16, 64, 512)
			wantTensor(t, f, "blk.0.attn_q.weight", dtype.F16, 64, 64)
			wantTensor(t, f, "blk.0.attn_norm.weight", dtype.F32, 64)
		}},
		{"stories260K-q8_0.gguf", func(t *testing.T, f *File) {
			wantTensor(t, f, "blk.0.attn_q.weight", dtype.Q8_0, 64, 64)
			wantTensor(t, f, "blk.0.ffn_down.weight", dtype.F32, 172, 64)
			wantTensor(t, f, "output_norm.weight", dtype.F32, 64)
		}},
		{"rand-llama-tok512-f32.gguf", func(t *testing.T, f *File) {
			wantUint(t, f, "llama.attention.head_count_kv", 2)
			wantTensor(t, f, "output.weight", dtype.F32, 64, 512)
		}},
		{"rand-llama-tok512-f16.gguf", func(t *testing.T, f *File) {
			wantTensor(t, f, "token_embd.weight", dtype.F16, 64, 512)
			wantTensor(t, f, "output_norm.weight", dtype.F32, 64)
		}},
		{"rand-llama-tok512-bf16.gguf", func(t *testing.T, f *File) {
			wantTensor(t, f, "token_embd.weight", dtype.BF16, 64, 512)
			wantTensor(t, f, "blk.1.ffn_down.weight", dtype.BF16, 128, 64)
			wantTensor(t, f, "output_norm.weight", dtype.F32, 64)
		}},
		{"rand-llama-tok512-q8_0.gguf", func(t *testing.T, f *File) {
			wantTensor(t, f, "token_embd.weight", dtype.Q8_0, 64, 512)
			wantTensor(t, f, "blk.0.attn_norm.weight", dtype.F32, 64)
		}},
		{"rand-llama256-tok512-q4_k_m.gguf", func(t *testing.T, f *File) {
			wantTensor(t, f, "token_embd.weight", dtype.Q4_K, 256, 512)
			wantTensor(t, f, "output.weight", dtype.Q6_K, 256, 512)
			wantTensor(t, f, "blk.1.attn_v.weight", dtype.Q6_K, 256, 128)
			wantTensor(t, f, "blk.1.ffn_down.weight", dtype.Q6_K, 512, 256)
			wantTensor(t, f, "blk.0.attn_q.weight", dtype.Q4_K, 256, 256)
			wantTensor(t, f, "blk.0.ffn_norm.weight", dtype.F32, 256)
		}},
		{"rand-qwen2-tok512-f32.gguf", func(t *testing.T, f *File) {
			wantString(t, f, "general.architecture", "qwen2")
			wantTensor(t, f, "blk.0.attn_q.bias", dtype.F32, 64)
			if _, ok := f.Tensor("output.weight"); ok {
				t.Error("tied model has output.weight")
			}
		}},
		{"rand-qwen3-tok512-f32.gguf", func(t *testing.T, f *File) {
			wantString(t, f, "general.architecture", "qwen3")
			wantUint(t, f, "qwen3.attention.key_length", 32)
			wantTensor(t, f, "blk.0.attn_q_norm.weight", dtype.F32, 32)
		}},
		{"rand-llama-llama3vocab-f32.gguf", func(t *testing.T, f *File) {
			wantStrings(t, f, "tokenizer.ggml.tokens", 128256)
			wantStrings(t, f, "tokenizer.ggml.merges", 280147)
			wantUint(t, f, "tokenizer.ggml.bos_token_id", 128000)
			if b, ok := f.Bool("tokenizer.ggml.add_bos_token"); !ok || !b {
				t.Errorf("add_bos_token = %v, %v", b, ok)
			}
		}},
		{"rand-qwen2-qwen2vocab-f32.gguf", func(t *testing.T, f *File) {
			wantStrings(t, f, "tokenizer.ggml.tokens", 151936)
			wantStrings(t, f, "tokenizer.ggml.merges", 151387)
			wantString(t, f, "tokenizer.ggml.pre", "qwen2")
		}},
		{"vocab-gpt-2.gguf", func(t *testing.T, f *File) {
			wantString(t, f, "tokenizer.ggml.model", "gpt2")
			merges, _ := f.Strings("tokenizer.ggml.merges")
			if len(merges) == 0 || !strings.Contains(merges[0], " ") {
				t.Errorf("merges: %d, first %q", len(merges), merges[:min(1, len(merges))])
			}
			if len(f.Tensors) != 0 {
				t.Errorf("vocab-only file has %d tensors", len(f.Tensors))
			}
		}},
		{"vocab-llama-spm.gguf", func(t *testing.T, f *File) {
			wantString(t, f, "tokenizer.ggml.model", "llama")
			wantStrings(t, f, "tokenizer.ggml.tokens", 32000)
		}},
	}
	listed := map[string]bool{}
	for _, tt := range tests {
		listed[tt.file] = true
		t.Run(tt.file, func(t *testing.T) {
			f := openFixture(t, tt.file)
			checkLayout(t, f)
			tt.check(t, f)
		})
	}
	// Every fixture must at least open, including ones added later.
	all, _ := filepath.Glob(filepath.Join(fixturesDir(t), "models", "*.gguf"))
	for _, path := range all {
		if name := filepath.Base(path); !listed[name] {
			t.Run(name, func(t *testing.T) { checkLayout(t, openFixture(t, name)) })
		}
	}
}

// checkLayout checks what must hold for any parsed file.
func checkLayout(t *testing.T, f *File) {
	t.Helper()
	if f.Version != 3 && f.Version != 2 {
		t.Errorf("version %d", f.Version)
	}
	if len(f.Keys) == 0 {
		t.Error("no metadata")
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if ti.Offset%uint64(f.Alignment) != 0 {
			t.Errorf("%s: offset %d not aligned", ti.Name, ti.Offset)
		}
		want, err := ti.Type.RowBytes(int(ti.Elements()))
		if err != nil || int64(want) != ti.Size {
			t.Errorf("%s: size %d, want %d (%v)", ti.Name, ti.Size, want, err)
		}
		if got := f.TensorData(ti); int64(len(got)) != ti.Size {
			t.Errorf("%s: %d data bytes, want %d", ti.Name, len(got), ti.Size)
		}
		if got, ok := f.Tensor(ti.Name); !ok || got != ti {
			t.Errorf("Tensor(%q) does not find it", ti.Name)
		}
	}
}

// allValues holds one metadata value of every supported type.
func allValues() ([]string, map[string]any) {
	vals := map[string]any{
		"u8": uint8(200), "i8": int8(-100), "u16": uint16(60000), "i16": int16(-30000),
		"u32": uint32(4000000000), "i32": int32(-2000000000), "u64": uint64(math.MaxUint64), "i64": int64(math.MinInt64),
		"f32": float32(1.5e-5), "f64": math.Pi, "bool.t": true, "bool.f": false,
		"str": "héllo\x00world", "str.empty": "", "str.badutf8": "\xff\xfe",
		"a.u8": []uint8{0, 1, 255}, "a.i8": []int8{-128, 0, 127}, "a.u16": []uint16{1, 65535},
		"a.i16": []int16{-32768, 32767}, "a.u32": []uint32{7}, "a.i32": []int32{-1, 2, -3},
		"a.u64": []uint64{1 << 63}, "a.i64": []int64{-1 << 62}, "a.f32": []float32{0.5, float32(math.Inf(-1))},
		"a.f64": []float64{1e300, -0}, "a.bool": []bool{true, false, true}, "a.str": []string{"a", "", "ccc"},
		"a.empty":        []float32{},
		"a.nested":       []any{[]int32{1, 2}, []string{"x"}, []any{[]bool{true}, []any{}}, []uint8{}},
		"a.nested.empty": []any{},
	}
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	// Map order is random; sort for a deterministic file.
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys, vals
}

func knownTypes() []dtype.DType {
	var types []dtype.DType
	for i := range 64 {
		if t := dtype.DType(i); t.Known() {
			types = append(types, t)
		}
	}
	return types
}

func write(t testing.TB, w *Writer) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for _, align := range []int{0, 64, 1} {
		t.Run(fmt.Sprint("align", align), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(align)))
			keys, vals := allValues()
			w := NewWriter()
			if align != 0 {
				keys = append([]string{alignmentKey}, keys...)
				vals[alignmentKey] = uint32(align)
			}
			for _, k := range keys {
				w.SetKV(k, vals[k])
			}
			type tensor struct {
				name string
				typ  dtype.DType
				dims []uint64
				data []byte
			}
			var tensors []tensor
			for _, typ := range knownTypes() {
				for i, dims := range [][]uint64{{uint64(typ.BlockSize()) * 3}, {uint64(typ.BlockSize()), 3, 1, 2}, {0, 5}} {
					size, _ := typ.RowBytes(int((&TensorInfo{Dims: dims}).Elements()))
					data := make([]byte, size)
					for j := range data {
						data[j] = byte(rng.Uint32())
					}
					name := typ.String() + "." + string(rune('a'+i))
					tensors = append(tensors, tensor{name, typ, dims, data})
					if err := w.AddTensor(name, typ, dims, data); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := w.AddTensor("scalar", dtype.F32, nil, []byte{1, 2, 3, 4}); err != nil {
				t.Fatal(err)
			}
			tensors = append(tensors, tensor{"scalar", dtype.F32, []uint64{}, []byte{1, 2, 3, 4}})

			data := write(t, w)
			f, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			wantAlign := align
			if align == 0 {
				wantAlign = defaultAlignment
			}
			if f.Version != 3 || f.Alignment != wantAlign {
				t.Errorf("version %d alignment %d, want 3 %d", f.Version, f.Alignment, wantAlign)
			}
			if f.dataOffset%uint64(wantAlign) != 0 {
				t.Errorf("data section at %d, not aligned to %d", f.dataOffset, wantAlign)
			}
			if !reflect.DeepEqual(f.Keys, keys) {
				t.Errorf("keys %q, want %q", f.Keys, keys)
			}
			for _, k := range keys {
				got, _ := f.Get(k)
				if want := vals[k]; !reflect.DeepEqual(got, want) && !bothNaN(got, want) {
					t.Errorf("%s = %#v, want %#v", k, got, want)
				}
			}
			if len(f.Tensors) != len(tensors) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(tensors))
			}
			for i, want := range tensors {
				got := &f.Tensors[i]
				if got.Name != want.name || got.Type != want.typ || !reflect.DeepEqual(got.Dims, want.dims) {
					t.Errorf("tensor %d: %s %v %v, want %s %v %v", i, got.Name, got.Type, got.Dims, want.name, want.typ, want.dims)
				}
				if got.Offset%uint64(wantAlign) != 0 {
					t.Errorf("%s: offset %d not aligned to %d", got.Name, got.Offset, wantAlign)
				}
				if !bytes.Equal(f.TensorData(got), want.data) {
					t.Errorf("%s: data differs", got.Name)
				}
			}
		})
	}
}

func bothNaN(a, b any) bool {
	x, ok1 := a.(float64)
	y, ok2 := b.(float64)
	return ok1 && ok2 && math.IsNaN(x) && math.IsNaN(y)
}

func TestGetters(t *testing.T) {
	w := NewWriter()
	w.SetKV("i32.neg", int32(-5))
	w.SetKV("u64.big", uint64(math.MaxUint64))
	w.SetKV("u8", uint8(7))
	big := math.MaxInt // an int64 where int is 64 bits, else an int32
	w.SetKV("int", big)
	w.SetKV("f32", float32(0.25))
	w.SetKV("str", "s")
	w.SetKV("ints", []int{1, -2})
	w.SetKV("bigints", []int{1, big})
	f, err := Parse(write(t, w))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  any
		ok   bool
		want any
		wok  bool
	}{
		{"Uint neg", first(f.Uint("i32.neg")), second(f.Uint("i32.neg")), uint64(0), false},
		{"Int neg", first(f.Int("i32.neg")), second(f.Int("i32.neg")), int64(-5), true},
		{"Int too big", first(f.Int("u64.big")), second(f.Int("u64.big")), int64(0), false},
		{"Uint big", first(f.Uint("u64.big")), second(f.Uint("u64.big")), uint64(math.MaxUint64), true},
		{"Uint u8", first(f.Uint("u8")), second(f.Uint("u8")), uint64(7), true},
		{"Int int", first(f.Int("int")), second(f.Int("int")), int64(big), true},
		{"Float f32", first(f.Float("f32")), second(f.Float("f32")), 0.25, true},
		{"Float int", first(f.Float("i32.neg")), second(f.Float("i32.neg")), -5.0, true},
		{"Float u64", first(f.Float("u64.big")), second(f.Float("u64.big")), float64(math.MaxUint64), true},
		{"Float str", first(f.Float("str")), second(f.Float("str")), 0.0, false},
		{"String u8", first(f.String("u8")), second(f.String("u8")), "", false},
		{"Bool missing", first(f.Bool("nope")), second(f.Bool("nope")), false, false},
		{"Strings str", first(f.Strings("str")), second(f.Strings("str")), []string(nil), false},
	}
	for _, tt := range tests {
		if !reflect.DeepEqual(tt.got, tt.want) || tt.ok != tt.wok {
			t.Errorf("%s: got %v, %v; want %v, %v", tt.name, tt.got, tt.ok, tt.want, tt.wok)
		}
	}
	wantInt, wantBig := any(int64(big)), any([]int64{1, int64(big)})
	if big == math.MaxInt32 {
		wantInt, wantBig = int32(big), []int32{1, int32(big)}
	}
	for key, want := range map[string]any{"int": wantInt, "ints": []int32{1, -2}, "bigints": wantBig} {
		if got, _ := f.Get(key); !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", key, got, want)
		}
	}
}

func TestReleaseMetadata(t *testing.T) {
	w := NewWriter()
	w.SetKV("tokenizer.ggml.tokens", []string{"a", "b"})
	if err := w.AddTensor("t", dtype.F32, []uint64{2}, []byte{0, 0, 128, 63, 0, 0, 0, 64}); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(write(t, w))
	if err != nil {
		t.Fatal(err)
	}
	f.ReleaseMetadata()
	if _, ok := f.Strings("tokenizer.ggml.tokens"); ok || len(f.Keys) != 0 {
		t.Errorf("metadata still readable after ReleaseMetadata: keys %q", f.Keys)
	}
	ti, ok := f.Tensor("t")
	if !ok {
		t.Fatal("tensor index lost with the metadata")
	}
	if got := f.TensorData(ti); len(got) != 8 || got[3] != 63 {
		t.Errorf("tensor data = %v after ReleaseMetadata", got)
	}
}

func first[T any](v T, _ bool) T      { return v }
func second[T any](_ T, ok bool) bool { return ok }

func TestSetKVReplacesInPlace(t *testing.T) {
	w := NewWriter()
	w.SetKV("a", "1")
	w.SetKV("b", "2")
	w.SetKV("a", uint32(3))
	f, err := Parse(write(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Keys, []string{"a", "b"}) {
		t.Errorf("keys %q", f.Keys)
	}
	if v, _ := f.Get("a"); v != uint32(3) {
		t.Errorf("a = %#v", v)
	}
}

func TestWriterErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func(w *Writer) error
	}{
		{"short data", func(w *Writer) error { return w.AddTensor("t", dtype.F32, []uint64{4}, make([]byte, 15)) }},
		{"unknown type", func(w *Writer) error { return w.AddTensor("t", dtype.DType(99), []uint64{4}, nil) }},
		{"partial block", func(w *Writer) error { return w.AddTensor("t", dtype.Q8_0, []uint64{16}, make([]byte, 17)) }},
		{"5 dims", func(w *Writer) error { return w.AddTensor("t", dtype.I8, []uint64{1, 1, 1, 1, 1}, []byte{0}) }},
		{"overflow", func(w *Writer) error { return w.AddTensor("t", dtype.I8, []uint64{1 << 32, 1 << 32}, nil) }},
		{"duplicate", func(w *Writer) error {
			w.AddTensor("t", dtype.I8, []uint64{1}, []byte{0})
			return w.AddTensor("t", dtype.I8, []uint64{1}, []byte{0})
		}},
		{"bad value", func(w *Writer) error { w.SetKV("k", struct{}{}); _, err := w.WriteTo(io.Discard); return err }},
		{"nil value", func(w *Writer) error { w.SetKV("k", nil); _, err := w.WriteTo(io.Discard); return err }},
		{"scalar in []any", func(w *Writer) error { w.SetKV("k", []any{1}); _, err := w.WriteTo(io.Discard); return err }},
		{"bad alignment", func(w *Writer) error { w.SetKV(alignmentKey, 48); _, err := w.WriteTo(io.Discard); return err }},
		{"string alignment", func(w *Writer) error { w.SetKV(alignmentKey, "32"); _, err := w.WriteTo(io.Discard); return err }},
	}
	for _, tt := range tests {
		if err := tt.build(NewWriter()); err == nil {
			t.Errorf("%s: no error", tt.name)
		} else {
			t.Logf("%s: %v", tt.name, err)
		}
	}
}

// TestFixtureRoundTrip rewrites fixtures with Writer and checks that
// everything survives; llama.cpp lays files out the same way, so its files
// come back byte for byte.
func TestFixtureRoundTrip(t *testing.T) {
	for _, name := range []string{"stories260K-f32.gguf", "rand-llama256-tok512-q4_k_m.gguf", "rand-llama-tok512-bf16.gguf", "vocab-gpt-2.gguf"} {
		t.Run(name, func(t *testing.T) {
			orig := openFixture(t, name)
			w := NewWriter()
			for _, k := range orig.Keys {
				v, _ := orig.Get(k)
				w.SetKV(k, v)
			}
			for i := range orig.Tensors {
				ti := &orig.Tensors[i]
				if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, orig.TensorData(ti)); err != nil {
					t.Fatal(err)
				}
			}
			data := write(t, w)
			f, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(f.Keys, orig.Keys) || !reflect.DeepEqual(f.kv, orig.kv) {
				t.Error("metadata differs")
			}
			if !reflect.DeepEqual(f.Tensors, orig.Tensors) {
				t.Error("tensor infos differ")
			}
			for i := range f.Tensors {
				if !bytes.Equal(f.TensorData(&f.Tensors[i]), orig.TensorData(&orig.Tensors[i])) {
					t.Errorf("%s: data differs", f.Tensors[i].Name)
				}
			}
			if len(orig.Tensors) > 0 && !bytes.Equal(data, orig.data) {
				t.Errorf("rewritten file (%d bytes) is not identical to the original (%d bytes)", len(data), len(orig.data))
			}
		})
	}
}

// smallFile is a valid file with metadata of several types and two tensors,
// the last one ending exactly at the end of the file.
func smallFile(t testing.TB) []byte {
	w := NewWriter()
	w.SetKV("general.architecture", "llama")
	w.SetKV("n", uint32(3))
	w.SetKV("toks", []string{"a", "bc"})
	w.SetKV("scores", []float32{1, 2})
	w.SetKV("nested", []any{[]int8{1}, []any{[]string{"z"}}})
	if err := w.AddTensor("a", dtype.F16, []uint64{3}, make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("b", dtype.Q8_0, []uint64{32, 1}, make([]byte, 34)); err != nil {
		t.Fatal(err)
	}
	return write(t, w)
}

func TestTruncated(t *testing.T) {
	data := smallFile(t)
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	last := f.Tensors[len(f.Tensors)-1]
	end := int(f.dataOffset + last.Offset + uint64(last.Size))
	for n := range end {
		if _, err := Parse(data[:n:n]); !errors.Is(err, ErrFormat) {
			t.Fatalf("truncated to %d of %d bytes: err = %v, want ErrFormat", n, end, err)
		}
	}
	// Only trailing padding lies past the last tensor.
	for n := end; n <= len(data); n++ {
		if _, err := Parse(data[:n]); err != nil {
			t.Errorf("truncated to %d (data ends at %d): %v", n, end, err)
		}
	}

	// A real file: every length through the metadata and tensor infos, then
	// a spread through the data.
	f = openFixture(t, "stories260K-q8_0.gguf")
	last = f.Tensors[len(f.Tensors)-1]
	end = int(f.dataOffset + last.Offset + uint64(last.Size))
	for n := 0; n < end; n++ {
		if n > int(f.dataOffset) {
			n += 997
			n = min(n, end-1)
		}
		if _, err := Parse(f.data[:n:n]); !errors.Is(err, ErrFormat) {
			t.Fatalf("fixture truncated to %d of %d bytes: err = %v, want ErrFormat", n, end, err)
		}
	}
}

// raw builds hand-made GGUF bytes for corrupt-file cases.
type raw struct{ bytes.Buffer }

func (r *raw) u32(v uint32) *raw {
	r.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
	return r
}
func (r *raw) u64(v uint64) *raw { r.u32(uint32(v)); return r.u32(uint32(v >> 32)) }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.WriteString(s); return r }
func (r *raw) header(version uint32, tensors, kvs uint64) *raw {
	r.WriteString("GGUF")
	return r.u32(version).u64(tensors).u64(kvs)
}
func (r *raw) tensor(name string, typ uint32, offset uint64, dims ...uint64) *raw {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(typ).u64(offset)
}
func (r *raw) pad(n int) *raw { r.Write(make([]byte, n)); return r }

func TestCorrupt(t *testing.T) {
	h := func(tensors, kvs uint64) *raw { return new(raw).header(3, tensors, kvs) }
	tests := []struct {
		name string
		data *raw
		want string // substring of the error
	}{
		{"empty", new(raw), "end of file"},
		{"bad magic", new(raw).pad(24), "magic"},
		{"v1", new(raw).header(1, 0, 0), "version 1"},
		{"v4", new(raw).header(4, 0, 0), "version 4"},
		{"big-endian", new(raw).header(3<<24, 0, 0), "big-endian"},
		{"huge kv count", h(0, 1<<62), "metadata entries"},
		{"huge tensor count", h(1<<62, 0), "tensors cannot fit"},
		{"huge key length", h(0, 1).u64(1 << 62).pad(8), "string of"},
		{"huge string", h(0, 1).str("k").u32(typeString).u64(1 << 40), "string of"},
		{"unknown value type", h(0, 1).str("k").u32(13).pad(8), "unknown value type 13"},
		{"huge array", h(0, 1).str("k").u32(typeArray).u32(typeUint32).u64(1 << 61).pad(16), "cannot fit"},
		{"huge string array", h(0, 1).str("k").u32(typeArray).u32(typeString).u64(3).pad(16), "cannot fit"},
		{"array of unknown", h(0, 1).str("k").u32(typeArray).u32(99).u64(0), "unknown value type 99"},
		{"duplicate key", h(0, 2).str("k").u32(typeUint8).pad(1).str("k").u32(typeUint8).pad(1), `"k": duplicate key`},
		{"bad alignment", h(0, 1).str(alignmentKey).u32(typeUint32).u32(48), "power of two"},
		{"zero alignment", h(0, 1).str(alignmentKey).u32(typeUint32).u32(0), "power of two"},
		{"float alignment", h(0, 1).str(alignmentKey).u32(typeFloat32).u32(0), "unsigned integer"},
		{"5 dims", h(1, 0).tensor("w", 0, 0, 1, 1, 1, 1, 1).pad(64), "5 dims"},
		{"unknown tensor type", h(1, 0).tensor("w", 99, 0, 4).pad(64), `tensor "w": unknown tensor type 99`},
		{"dims overflow", h(1, 0).tensor("w", 0, 0, 1<<32, 1<<32).pad(64), "overflow"},
		{"negative dim", h(1, 0).tensor("w", 0, 0, 1<<63).pad(64), "too large"},
		{"size overflow", h(1, 0).tensor("w", 0, 0, 1<<62).pad(64), "too large"},
		{"partial block", h(1, 0).tensor("w", uint32(dtype.Q4_K), 0, 255).pad(512), "block size"},
		{"misaligned offset", h(1, 0).tensor("w", 0, 4, 1).pad(64), "not a multiple of the alignment"},
		{"data past end", h(1, 0).tensor("w", 0, 0, 64).pad(64), "past the end"},
		{"offset past end", h(1, 0).tensor("w", 0, 1<<63, 1).pad(64), "past the end"},
		{"data section past end", h(1, 0).tensor("w", 0, 0, 0), "past the end of the file"},
		{"duplicate tensor", h(2, 0).tensor("w", 0, 0, 1).tensor("w", 0, 32, 1).pad(64), `"w": duplicate tensor name`},
		{"deep nesting", deepArray(maxArrayDepth + 1), "nested deeper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.data.Bytes())
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("err = %v, want ErrFormat", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func deepArray(depth int) *raw {
	r := new(raw).header(3, 0, 1).str("k").u32(typeArray)
	for range depth - 1 {
		r.u32(typeArray).u64(1)
	}
	return r.u32(typeUint8).u64(0)
}

func TestNestingLimit(t *testing.T) {
	// The deepest nesting the parser accepts round-trips through the writer.
	var v any = []uint8{1}
	for range maxArrayDepth - 1 {
		v = []any{v}
	}
	w := NewWriter()
	w.SetKV("k", v)
	f, err := Parse(write(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Get("k"); !reflect.DeepEqual(got, v) {
		t.Error("nested value differs")
	}
	w.SetKV("k2", []any{v})
	if _, err := w.WriteTo(io.Discard); err == nil {
		t.Error("writer accepted nesting the parser rejects")
	}
}

func TestOpenClose(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "small.gguf")
	data := smallFile(t)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ti, _ := f.Tensor("b")
	if got := f.TensorData(ti); len(got) != 34 {
		t.Errorf("TensorData: %d bytes", len(got))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := f.TensorData(ti); got != nil {
		t.Error("TensorData after Close is not nil")
	}
	if got, _ := f.String("general.architecture"); got != "llama" {
		t.Errorf("metadata after Close: %q", got)
	}

	if _, err := Open(filepath.Join(dir, "missing.gguf")); err == nil || errors.Is(err, ErrFormat) {
		t.Errorf("missing file: err = %v", err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	os.WriteFile(empty, nil, 0o644)
	if _, err := Open(empty); !errors.Is(err, ErrFormat) {
		t.Errorf("empty file: err = %v", err)
	}
	if err := os.WriteFile(path, data[:40], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), path) {
		t.Errorf("truncated file: err = %v", err)
	}

	// WriteFile writes the same bytes as WriteTo.
	w := NewWriter()
	w.SetKV("x", "y")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, write(t, w)) {
		t.Error("WriteFile and WriteTo differ")
	}
}

func BenchmarkOpen(b *testing.B) {
	for _, name := range []string{"stories260K-f32.gguf", "rand-llama-llama3vocab-f32.gguf"} {
		path := fixture(b, name)
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				f, err := Open(path)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}
