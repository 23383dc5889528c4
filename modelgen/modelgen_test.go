package modelgen

import (
	"bytes"
	"path/filepath"
	"testing"

	"tandem/gguf"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/model"
)

func build(t *testing.T, s Spec) *gguf.File {
	t.Helper()
	w, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestDemoIsDeterministic(t *testing.T) {
	a, err := DemoGGUF()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := DemoGGUF()
	if !bytes.Equal(a, b) {
		t.Fatal("two builds of the demo model differ")
	}
	s := Demo
	s.Seed++
	w, _ := Build(s)
	var c bytes.Buffer
	w.WriteTo(&c)
	if bytes.Equal(a, c.Bytes()) {
		t.Fatal("another seed gave the same weights")
	}
}

// TestQ4KMMix checks llama-quantize's choices: K-quants where the row is a
// multiple of 256, their 32-wide fallbacks where it is not (896 wide), and
// more bits for attn_v/ffn_down in the first, last and every third layer.
func TestQ4KMMix(t *testing.T) {
	s := Spec{Arch: "qwen2", Embd: 896, Layers: 8, Heads: 14, KVHeads: 2, HeadDim: 64, FFN: 512, VocabSize: 300,
		ContextLen: 128, RopeBase: 1e6, NormEps: 1e-6, Tied: true, QKVBias: true, Type: "q4_k_m"}
	f := build(t, s)
	want := map[string]hal.DType{
		"token_embd.weight":        hal.Q8_0, // tied: quantized as the output, Q6_K → Q8_0 at 896
		"blk.0.attn_q.weight":      hal.Q5_0, // Q4_K → Q5_0 at 896
		"blk.0.attn_v.weight":      hal.Q8_0, // more bits: Q6_K → Q8_0
		"blk.1.attn_v.weight":      hal.Q5_0,
		"blk.0.ffn_down.weight":    hal.Q6_K, // 512 wide: a K-quant fits
		"blk.1.ffn_down.weight":    hal.Q4_K,
		"blk.7.ffn_down.weight":    hal.Q6_K,
		"blk.0.attn_norm.weight":   hal.F32,
		"blk.0.attn_q.bias":        hal.F32,
		"blk.4.ffn_gate.weight":    hal.Q5_0,
		"blk.4.attn_output.weight": hal.Q5_0,
	}
	// use_more_bits(i, 8): i < 1 || i >= 7 || (i-1)%3 == 2 → layers 0, 3, 6, 7.
	want["blk.2.ffn_down.weight"] = hal.Q4_K
	want["blk.3.ffn_down.weight"] = hal.Q6_K
	want["blk.6.attn_v.weight"] = hal.Q8_0
	for name, typ := range want {
		ti, ok := f.Tensor(name)
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if ti.Type != typ {
			t.Errorf("%s is %s, want %s", name, ti.Type, typ)
		}
	}
	if _, ok := f.Tensor("output.weight"); ok {
		t.Error("tied model has output.weight")
	}
}

// TestSingleKQuantTypes checks the one-type K-quant files: the type where
// the row is a multiple of 256 (ffn_down, 512 wide), its fallback where it
// is not (896 wide), and Q6_K (here → Q8_0) for the tied output.
func TestSingleKQuantTypes(t *testing.T) {
	for _, c := range []struct {
		typ            string
		ftype          uint32
		base, fallback hal.DType
	}{
		{"q2_k", 10, hal.Q2_K, hal.Q4_0},
		{"q3_k", 11, hal.Q3_K, hal.Q4_0},
		{"q4_k", 14, hal.Q4_K, hal.Q5_0},
		{"q5_k", 16, hal.Q5_K, hal.Q5_1},
	} {
		s := Spec{Arch: "qwen2", Embd: 896, Layers: 2, Heads: 14, KVHeads: 2, HeadDim: 64, FFN: 512, VocabSize: 300,
			ContextLen: 128, RopeBase: 1e6, NormEps: 1e-6, Tied: true, QKVBias: true, Type: c.typ}
		f := build(t, s)
		if ft, ok := f.Uint("general.file_type"); !ok || ft != uint64(c.ftype) {
			t.Errorf("%s: general.file_type %d, want %d", c.typ, ft, c.ftype)
		}
		for name, typ := range map[string]hal.DType{
			"token_embd.weight":     hal.Q8_0,
			"blk.0.ffn_down.weight": c.base,
			"blk.1.ffn_down.weight": c.base,
			"blk.0.attn_q.weight":   c.fallback,
			"blk.1.ffn_up.weight":   c.fallback,
		} {
			if ti, ok := f.Tensor(name); !ok || ti.Type != typ {
				t.Errorf("%s: %s is %v, want %s", c.typ, name, ti, typ)
			}
		}
	}
}

func TestBuildErrors(t *testing.T) {
	for name, s := range map[string]Spec{
		"unknown type":         {Arch: "llama", Embd: 64, Layers: 1, Heads: 2, KVHeads: 2, HeadDim: 32, FFN: 64, Type: "q3_x"},
		"no shape":             {Arch: "llama", Type: "f32"},
		"unknown architecture": {Arch: "gptneox", Embd: 64, Layers: 1, Heads: 2, KVHeads: 2, HeadDim: 32, FFN: 64, Type: "f32"},
		"text-only tied": {Arch: "llama", Embd: 64, Layers: 1, Heads: 2, KVHeads: 2, HeadDim: 32, FFN: 64, Type: "f32",
			Tied: true, TextOnly: true},
	} {
		if _, err := Build(s); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestEveryArchitectureLoads: a model of each registered architecture, tied
// and untied, loads with the shape it was made with and the tensors its
// architecture declares (biases where it requires them, q/k norms).
func TestEveryArchitectureLoads(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	for _, name := range model.Archs() {
		a, _ := model.LookupArch(name)
		for _, tied := range []bool{true, false} {
			s := Spec{Arch: name, Name: "every-arch", Embd: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FFN: 96,
				ContextLen: 256, RopeBase: 1e4, NormEps: 1e-5, Tied: tied, Type: "f32", Seed: 7}
			w, err := Build(s)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			path := filepath.Join(t.TempDir(), name+".gguf")
			if err := w.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			m, err := model.Load(path, be)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			c, l := m.Config, m.Layers[1]
			if c.Arch != name || c.Embd != 64 || c.Layers != 2 || c.KVHeads != 2 || c.HeadDim != 16 || c.RopeNeox != a.GGUFNeox ||
				(m.Output == m.Embedding) != tied || (l.Bq != nil) != (a.QKVBias == model.Required) ||
				(l.QNorm != nil) != (a.QKNorm == model.Required) {
				t.Errorf("%s tied=%v: loaded %+v (tied %v, biases %v, q/k norms %v)", name, tied, c, m.Output == m.Embedding, l.Bq != nil, l.QNorm != nil)
			}
			m.Close()
		}
	}
}
