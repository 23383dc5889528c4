package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"tandem/dtype"
)

// fill returns n bytes of a pattern that differs per seed.
func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// raw builds a file from a header and a data section of dataLen bytes.
func raw(header string, dataLen int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

func TestRoundTripAllDTypes(t *testing.T) {
	type tc struct {
		dtype string
		shape []int64
		typ   dtype.DType
	}
	var cases []tc
	for _, dt := range slices.Sorted(maps.Keys(dtypes)) {
		shape := []int64{3, 4}
		if dtypes[dt].bits < 8 { // sub-byte types need whole bytes
			shape = []int64{2, 4}
		}
		cases = append(cases, tc{dt, shape, dtypes[dt].typ})
	}
	cases = append(cases,
		tc{"F32", []int64{}, dtype.F32},       // scalar
		tc{"BF16", []int64{0, 5}, dtype.BF16}, // empty
		tc{"F16", []int64{1, 1, 2, 3}, dtype.F16},
	)
	want := map[string]dtype.DType{"F32": dtype.F32, "F16": dtype.F16, "BF16": dtype.BF16, "F64": dtype.F64,
		"I8": dtype.I8, "I16": dtype.I16, "I32": dtype.I32, "I64": dtype.I64}

	w := NewWriter()
	w.SetMetadata("format", "pt")
	w.SetMetadata("note", `quotes " and <html> & unicode ✓`)
	datas := map[string][]byte{}
	for i, c := range cases {
		name := fmt.Sprintf("t%02d.%s", i, c.dtype)
		size, err := byteSize(c.dtype, dtypes[c.dtype].bits, c.shape)
		if err != nil {
			t.Fatal(err)
		}
		d := fill(int(size), byte(i))
		datas[name] = d
		if err := w.Add(name, c.dtype, c.shape, d); err != nil {
			t.Fatalf("Add %s: %v", name, err)
		}
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(file); n%8 != 0 || file[8+n-1] != ' ' && file[8+n-1] != '}' {
		t.Errorf("header length %d not padded to 8", n)
	}

	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []*File{f, p} {
		if got.Metadata["format"] != "pt" || got.Metadata["note"] != `quotes " and <html> & unicode ✓` || len(got.Metadata) != 2 {
			t.Errorf("metadata = %v", got.Metadata)
		}
		if len(got.Tensors) != len(cases) {
			t.Fatalf("%d tensors, want %d", len(got.Tensors), len(cases))
		}
		for i, c := range cases {
			name := fmt.Sprintf("t%02d.%s", i, c.dtype)
			ti := &got.Tensors[i] // insertion order is offset order
			if ti.Name != name {
				t.Errorf("tensor %d is %q, want %q", i, ti.Name, name)
			}
			lk, ok := got.Tensor(name)
			if !ok || lk != ti {
				t.Errorf("Tensor(%q) = %v, %v", name, lk, ok)
			}
			if ti.DType != c.dtype || !slices.Equal(ti.Shape, c.shape) || ti.Shape == nil {
				t.Errorf("%s: dtype %s shape %v", name, ti.DType, ti.Shape)
			}
			wt, mapped := want[c.dtype]
			if ti.Supported() != mapped || (mapped && ti.Type != wt) || (!mapped && ti.Type != NoType) {
				t.Errorf("%s: Type %v Supported %v", name, ti.Type, ti.Supported())
			}
			if !mapped && ti.Type.Known() {
				t.Errorf("%s: unmapped type %v is Known", name, ti.Type)
			}
			if !bytes.Equal(got.TensorData(ti), datas[name]) {
				t.Errorf("%s: data differs", name)
			}
		}
	}
	if _, ok := f.Tensor("nope"); ok {
		t.Error("found a missing tensor")
	}
	if n := f.Tensors[0].NumElements(); n != 12 {
		t.Errorf("NumElements = %d", n)
	}
}

// The reference implementation's serializer output for the same input.
func TestReferenceBytes(t *testing.T) {
	data := make([]byte, 0, 24)
	for _, v := range []float32{0, 1, 2, 3, 4, 5} {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
	}
	w := NewWriter()
	if err := w.Add("attn.0", "F32", []int64{1, 2, 3}, data); err != nil {
		t.Fatal(err)
	}
	got, err := w.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	want := append(raw(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, 0), data...)
	if !bytes.Equal(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}

	got, _ = NewWriter().Bytes()
	if want := raw("{}      ", 0); !bytes.Equal(got, want) {
		t.Errorf("empty: got %q want %q", got, want)
	}
	w = NewWriter()
	w.SetMetadata("framework", "pt")
	got, _ = w.Bytes()
	if want := raw(`{"__metadata__":{"framework":"pt"}}     `, 0); !bytes.Equal(got, want) {
		t.Errorf("metadata: got %q want %q", got, want)
	}
	if _, err := Parse(got); err != nil {
		t.Error(err)
	}
}

func TestCorrupt(t *testing.T) {
	f32 := func(name string, shape string, b, e int) string {
		return fmt.Sprintf(`%q:{"dtype":"F32","shape":%s,"data_offsets":[%d,%d]}`, name, shape, b, e)
	}
	hugeLen := binary.LittleEndian.AppendUint64(nil, math.MaxUint64)
	overLimit := binary.LittleEndian.AppendUint64(nil, MaxHeaderSize+1)
	overLimit = append(overLimit, make([]byte, 64)...)
	cases := []struct {
		name string
		data []byte
		want string // in the message
	}{
		{"empty file", nil, "shorter than"},
		{"short file", []byte{1, 0, 0}, "shorter than"},
		{"header length past end", raw("{}", 0)[:9], "exceeds the 1 bytes"},
		{"header length u64 max", hugeLen, "exceeds the 100000000-byte limit"},
		{"header length over 100MB", overLimit, "limit"},
		{"zero header", raw("", 0), "start with '{'"},
		{"not an object", raw("[]", 0), "start with '{'"},
		{"leading space", raw(" {}", 0), "start with '{'"},
		{"invalid json", raw(`{"a":`, 0), "header JSON"},
		{"unclosed", raw(`{`, 0), "not closed"},
		{"trailing garbage", raw(`{}x`, 0), "trailing"},
		{"second object", raw(`{}{}`, 0), "trailing"},
		{"invalid utf8", raw("{\"\xff\":1}", 0), "UTF-8"},
		{"duplicate tensor", raw("{"+f32("a", "[1]", 0, 4)+","+f32("a", "[1]", 4, 8)+"}", 8), "duplicate"},
		{"duplicate via escape", raw("{"+f32("a", "[1]", 0, 4)+`,"\u0061":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "duplicate"},
		{"metadata number", raw(`{"__metadata__":{"a":1}}`, 0), "__metadata__"},
		{"metadata array", raw(`{"__metadata__":[]}`, 0), "__metadata__"},
		{"entry not object", raw(`{"w":[1,2]}`, 0), `"w": entry is not an object`},
		{"entry null", raw(`{"w":null}`, 0), `"w": entry is not an object`},
		{"missing dtype", raw(`{"w":{"shape":[1],"data_offsets":[0,4]}}`, 4), `"w": missing "dtype"`},
		{"missing shape", raw(`{"w":{"dtype":"F32","data_offsets":[0,4]}}`, 4), `"w": missing "shape"`},
		{"missing offsets", raw(`{"w":{"dtype":"F32","shape":[1]}}`, 4), `"w": missing "data_offsets"`},
		{"upper-case key", raw(`{"w":{"DTYPE":"F32","shape":[1],"data_offsets":[0,4]}}`, 4), `missing "dtype"`},
		{"null shape", raw(`{"w":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`, 4), `"w": dtype, shape`},
		{"null dtype", raw(`{"w":{"dtype":null,"shape":[1],"data_offsets":[0,4]}}`, 4), `"w": dtype, shape`},
		{"dtype number", raw(`{"w":{"dtype":3,"shape":[1],"data_offsets":[0,4]}}`, 4), `"w": bad "dtype"`},
		{"unknown dtype", raw(`{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,4]}}`, 4), `"w": unknown dtype "F128"`},
		{"lower-case dtype", raw(`{"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}`, 4), `unknown dtype`},
		{"one offset", raw(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}}`, 4), `"w": data_offsets has 1`},
		{"three offsets", raw(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}`, 4), `has 3`},
		{"offsets reversed", raw("{"+f32("w", "[0]", 4, 0)+"}", 4), `"w": data_offsets [4, 0] outside`},
		{"negative offset", raw("{"+f32("w", "[1]", -4, 0)+"}", 4), `"w": data_offsets [-4, 0]`},
		{"end past data", raw("{"+f32("w", "[2]", 0, 8)+"}", 4), `"w": data_offsets [0, 8] outside the 4-byte`},
		{"offset over int64", raw(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}}`, 4), `"w": bad "data_offsets"`},
		{"float offset", raw(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}`, 4), `"w": bad "data_offsets"`},
		{"size mismatch", raw("{"+f32("w", "[2]", 0, 4)+"}", 4), `"w": shape [2] of F32 needs 8 bytes`},
		{"negative dim", raw("{"+f32("w", "[-1,-4]", 0, 16)+"}", 16), `"w": negative dimension`},
		{"float dim", raw("{"+f32("w", "[1.5]", 0, 4)+"}", 4), `"w": bad "shape"`},
		{"dims overflow", raw("{"+f32("w", "[4294967296,4294967296]", 0, 4)+"}", 4), `"w": shape [4294967296 4294967296] overflows`},
		{"bytes overflow", raw("{"+f32("w", "[4611686018427387904]", 0, 4)+"}", 4), `"w": shape [4611686018427387904] of F32 overflows`},
		{"dims overflow before zero", raw("{"+f32("w", "[4294967296,4294967296,0]", 0, 0)+"}", 0), `overflows`},
		{"sub-byte partial", raw(`{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`, 1), `"w": shape [3] of F4 is not a whole number of bytes`},
		{"overlap", raw("{"+f32("a", "[2]", 0, 8)+","+f32("b", "[2]", 4, 12)+"}", 12), `"b": data_offsets [4, 12] overlaps tensor "a" [0, 8]`},
		{"same range", raw("{"+f32("a", "[2]", 0, 8)+","+f32("b", "[2]", 0, 8)+"}", 8), `overlaps tensor`},
		{"gap", raw("{"+f32("a", "[1]", 0, 4)+","+f32("b", "[1]", 8, 12)+"}", 12), `"b": data_offsets [8, 12] leaves a gap after tensor "a" [0, 4]`},
		{"not from zero", raw("{"+f32("a", "[1]", 4, 8)+"}", 8), `"a": data_offsets [4, 8]: the data section must start at 0`},
		{"trailing data", raw("{"+f32("a", "[1]", 0, 4)+"}", 5), `tensors cover 4 bytes of a 5-byte data section`},
		{"data without tensors", raw("{}", 1), `cover 0 bytes of a 1-byte`},
	}
	dir := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				if !errors.Is(err, ErrFormat) {
					t.Errorf("%s: %v does not wrap ErrFormat", what, err)
				}
				if !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: %q does not contain %q", what, err, c.want)
				}
			}
			f, err := Parse(c.data)
			if f != nil {
				t.Error("Parse returned a File with its error")
			}
			check("Parse", err)
			if len(c.data) >= 8 {
				n := binary.LittleEndian.Uint64(c.data)
				if n <= uint64(len(c.data)-8) {
					_, _, err := ParseHeader(c.data[8:8+n], int64(uint64(len(c.data))-8-n))
					check("ParseHeader", err)
				}
			}
			path := filepath.Join(dir, fmt.Sprintf("c%d.safetensors", i))
			if err := os.WriteFile(path, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = Open(path)
			check("Open", err)
			if err != nil && !strings.Contains(err.Error(), path) {
				t.Errorf("Open error %q does not name the file", err)
			}
		})
	}
}

func TestParseHeaderArgs(t *testing.T) {
	if _, _, err := ParseHeader([]byte("{}"), -1); !errors.Is(err, ErrFormat) {
		t.Errorf("negative data length: %v", err)
	}
	// Valid oddities the reference accepts.
	ok := []struct {
		name, header string
		dataLen      int64
	}{
		{"padding", "{}   \n\t ", 0},
		{"null metadata", `{"__metadata__":null}`, 0},
		{"extra fields", `{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}}`, 2},
		{"empty name", `{"":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 2},
		{"zero-size tensors share an offset", `{"a":{"dtype":"U8","shape":[0],"data_offsets":[1,1]},"b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"c":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}}`, 1},
		{"F6 whole bytes", `{"w":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}`, 3},
	}
	for _, c := range ok {
		ts, _, err := ParseHeader([]byte(c.header), c.dataLen)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		for i := 1; i < len(ts); i++ {
			if ts[i].Begin < ts[i-1].Begin {
				t.Errorf("%s: not sorted by Begin", c.name)
			}
		}
	}
}

// validFile is a small file with several tensors and metadata.
func validFile(t testing.TB) []byte {
	w := NewWriter()
	w.SetMetadata("format", "pt")
	for i, dt := range []string{"F32", "BF16", "F16", "U8", "I64"} {
		n, _ := DTypeBits(dt)
		if err := w.Add(fmt.Sprintf("layer.%d.weight", i), dt, []int64{2, 3}, fill(6*n/8, byte(i))); err != nil {
			t.Fatal(err)
		}
	}
	b, err := w.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTruncation(t *testing.T) {
	full := validFile(t)
	if _, err := Parse(full); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for n := 0; n < len(full); n++ {
		if f, err := Parse(full[:n]); err == nil || f != nil || !errors.Is(err, ErrFormat) {
			t.Fatalf("Parse of %d of %d bytes: %v", n, len(full), err)
		}
		path := filepath.Join(dir, fmt.Sprintf("t%d", n))
		if err := os.WriteFile(path, full[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(path); err == nil || !errors.Is(err, ErrFormat) {
			t.Fatalf("Open of %d of %d bytes: %v", n, len(full), err)
		}
	}
	if _, err := Parse(append(slices.Clone(full), 0)); !errors.Is(err, ErrFormat) {
		t.Errorf("one byte too many: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
}

func TestTensorDataBounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(path, validFile(t), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Path() != path {
		t.Errorf("Path = %q", f.Path())
	}
	ti := f.Tensors[0]
	d := f.TensorData(&ti)
	if len(d) != 24 || cap(d) != 24 {
		t.Errorf("len %d cap %d", len(d), cap(d))
	}
	for _, bad := range []TensorInfo{{Begin: -1, End: 2}, {Begin: 4, End: 2}, {Begin: 0, End: 1 << 40}} {
		if f.TensorData(&bad) != nil {
			t.Errorf("TensorData(%+v) not nil", bad)
		}
	}
	if f.TensorData(nil) != nil {
		t.Error("TensorData(nil) not nil")
	}
	// A reordered Tensors slice still finds tensors by name.
	slices.Reverse(f.Tensors)
	if got, ok := f.Tensor(ti.Name); !ok || got.Name != ti.Name {
		t.Errorf("lookup after reorder: %v %v", got, ok)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if f.TensorData(&ti) != nil {
		t.Error("TensorData after Close not nil")
	}
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	if err := w.Add("a", "F32", []int64{2}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, tname, dtype string
		shape              []int64
		n                  int
		want               string
	}{
		{"short data", "b", "F32", []int64{2}, 7, "needs 8 bytes, got 7"},
		{"long data", "b", "BF16", []int64{2}, 5, "needs 4 bytes, got 5"},
		{"unknown dtype", "b", "Q4_0", []int64{2}, 2, "unknown dtype"},
		{"duplicate", "a", "F32", []int64{2}, 8, "added twice"},
		{"reserved", "__metadata__", "F32", []int64{2}, 8, "reserved"},
		{"negative", "b", "F32", []int64{-2}, 0, "negative dimension"},
		{"overflow", "b", "F64", []int64{1 << 62}, 0, "overflows"},
		{"bad utf8", "\xff", "F32", []int64{2}, 8, "UTF-8"},
		{"partial byte", "b", "F4", []int64{1}, 0, "whole number of bytes"},
	}
	for _, c := range cases {
		err := w.Add(c.tname, c.dtype, c.shape, make([]byte, c.n))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if w.DataSize() != 8 {
		t.Errorf("DataSize = %d after failed adds", w.DataSize())
	}
	w.SetMetadata("k", "\xff")
	if _, err := w.Bytes(); err == nil {
		t.Error("invalid UTF-8 metadata written")
	}
	if err := w.WriteFile(filepath.Join(t.TempDir(), "x")); err == nil {
		t.Error("WriteFile with invalid metadata succeeded")
	}
	if err := NewWriter().WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
}

func BenchmarkOpen(b *testing.B) {
	// A header the size of a 7B model's shard: ~300 tensors.
	w := NewWriter()
	w.SetMetadata("format", "pt")
	for l := range 30 {
		for _, p := range []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "input_layernorm", "post_attention_layernorm", "rotary_emb"} {
			if err := w.Add(fmt.Sprintf("model.layers.%d.%s.weight", l, p), "BF16", []int64{32, 64}, make([]byte, 32*64*2)); err != nil {
				b.Fatal(err)
			}
		}
	}
	path := filepath.Join(b.TempDir(), "model.safetensors")
	if err := w.WriteFile(path); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// The plain-read fallback used where mmap is not.
func TestReadWhole(t *testing.T) {
	want := validFile(t)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	got, release, err := readWhole(fd, len(want))
	if err != nil || !bytes.Equal(got, want) || release(got) != nil {
		t.Fatalf("readWhole: %v", err)
	}
	if _, _, err := readWhole(fd, len(want)+1); err == nil {
		t.Error("reading past the end succeeded")
	}
}
