package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"tandem/internal/fixtures"
	"testing"
)

// FuzzParse checks that no input makes Parse panic, and that whatever Parse
// accepts survives a Writer round trip unchanged.
func FuzzParse(f *testing.F) {
	f.Add(smallFile(f))
	f.Add(deepArray(3).Bytes())
	// An 8-bit alignment key and a Q8_0 tensor.
	r := new(raw).header(3, 1, 1).str(alignmentKey).u32(typeUint8)
	r.WriteByte(64)
	f.Add(r.tensor("w", 8, 0, 32, 2).pad(200).Bytes())
	// Fixture headers, cut short: the fuzzer's mutations find the valid prefixes.
	all, _ := filepath.Glob(filepath.Join(fixtures.Root(), "models", "*.gguf"))
	for _, path := range all {
		if data, err := os.ReadFile(path); err == nil {
			f.Add(data[:min(len(data), 2048)])
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data)
		if err != nil {
			return
		}
		for _, k := range g.Keys {
			g.Get(k)
			g.String(k)
			g.Uint(k)
			g.Int(k)
			g.Float(k)
			g.Bool(k)
			g.Strings(k)
		}
		w := NewWriter()
		for _, k := range g.Keys {
			v, _ := g.Get(k)
			w.SetKV(k, v)
		}
		for i := range g.Tensors {
			ti := &g.Tensors[i]
			td := g.TensorData(ti)
			if int64(len(td)) != ti.Size {
				t.Fatalf("%s: %d data bytes, want %d", ti.Name, len(td), ti.Size)
			}
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, td); err != nil {
				t.Fatalf("parsed tensor rejected by the writer: %v", err)
			}
		}
		var out1 bytes.Buffer
		if _, err := w.WriteTo(&out1); err != nil {
			t.Fatalf("parsed file rejected by the writer: %v", err)
		}
		g2, err := Parse(out1.Bytes())
		if err != nil {
			t.Fatalf("rewritten file does not parse: %v", err)
		}
		if !reflect.DeepEqual(g.Keys, g2.Keys) {
			t.Fatalf("keys %q became %q", g.Keys, g2.Keys)
		}
		for i := range g.Tensors {
			a, b := g.Tensors[i], g2.Tensors[i]
			a.Offset, b.Offset = 0, 0 // the writer packs tensors afresh
			if !reflect.DeepEqual(a, b) || !bytes.Equal(g.TensorData(&g.Tensors[i]), g2.TensorData(&g2.Tensors[i])) {
				t.Fatalf("tensor %+v became %+v", a, b)
			}
		}
		// Values are compared through their encoding, which also holds for NaNs.
		w2 := NewWriter()
		for _, k := range g2.Keys {
			v, _ := g2.Get(k)
			w2.SetKV(k, v)
		}
		for i := range g2.Tensors {
			ti := &g2.Tensors[i]
			w2.AddTensor(ti.Name, ti.Type, ti.Dims, g2.TensorData(ti))
		}
		var out2 bytes.Buffer
		if _, err := w2.WriteTo(&out2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out1.Bytes(), out2.Bytes()) {
			t.Fatal("second rewrite differs from the first")
		}
	})
}
