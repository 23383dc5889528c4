package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"tandem/gguf"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/safetensors"
)

// archTestConfig is a small model of architecture a.
func archTestConfig(a *Arch) Config {
	return Config{Arch: a.Name, Name: "arch-test", VocabSize: 300, Embd: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		FFN: 96, ContextLen: 256, NormEps: 1e-5, RopeBase: 10000, RopeDims: 16, RopeNeox: a.GGUFNeox}
}

// archTestGGUF writes a GGUF file of random F32 weights for c: every tensor its
// architecture may have, but those skip names.
func archTestGGUF(t *testing.T, a *Arch, c *Config, skip ...string) []byte {
	t.Helper()
	w := gguf.NewWriter()
	w.SetKV("general.architecture", c.Arch)
	w.SetKV("general.name", c.Name)
	if err := WriteGGUFConfig(w, c); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(len(c.Arch)), 9))
	for _, ts := range a.TensorSpecs(c) {
		if slices.Contains(skip, ts.GGUF) {
			continue
		}
		n := 1
		for _, d := range ts.Shape {
			n *= d
		}
		data := make([]byte, 4*n)
		for i := range n {
			v := float32(r.NormFloat64() * 0.2)
			if !ts.Matrix() && ts.Role != RoleQBias && ts.Role != RoleKBias && ts.Role != RoleVBias {
				v += 1 // norm weights near 1
			}
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		}
		dims := make([]uint64, len(ts.Shape))
		for i, d := range ts.Shape {
			dims[len(dims)-1-i] = uint64(d)
		}
		if err := w.AddTensor(ts.GGUF, hal.F32, dims, data); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func archTestBuild(t *testing.T, data []byte, be hal.Backend) (*Model, error) {
	t.Helper()
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return build(cfg, ggufSource{f}, be)
}

// archTestHF writes m's weights as a Hugging Face checkpoint under the
// architecture's HF names and config keys, unpermuting q and k where its GGUF
// files rotate adjacent pairs.
func archTestHF(t *testing.T, a *Arch, m *Model, data []byte) string {
	t.Helper()
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	c := &m.Config
	sw := safetensors.NewWriter()
	for _, ts := range a.TensorSpecs(c) {
		ti, ok := f.Tensor(ts.GGUF)
		if !ok {
			continue
		}
		b := f.TensorData(ti)
		shape := make([]int64, len(ts.Shape))
		for i, d := range ts.Shape {
			shape[i] = int64(d)
		}
		heads := 0 // of the q and k rows and biases, which the GGUF converter permuted
		switch ts.Role {
		case RoleQ, RoleQBias:
			heads = c.Heads
		case RoleK, RoleKBias:
			heads = c.KVHeads
		}
		if !a.GGUFNeox && heads > 0 {
			b = unpermute(b, ts.Shape[0], len(b)/ts.Shape[0], heads)
		}
		if err := sw.Add(ts.HF, "F32", shape, b); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	if err := sw.WriteFile(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	k := a.HFKeys
	conf := map[string]any{
		"architectures": []string{"SomethingElse", a.HFClasses[0]},
		k.Embd:          c.Embd, k.Layers: c.Layers, k.Heads: c.Heads, k.KVHeads: c.KVHeads, k.HeadDim: c.HeadDim,
		k.FFN: c.FFN, k.VocabSize: c.VocabSize, k.ContextLen: c.ContextLen, k.NormEps: c.NormEps, k.RopeBase: c.RopeBase,
	}
	js, _ := json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestArchitectures holds every registered architecture to its declaration:
// its config round-trips through its GGUF keys, its tensors load by their
// names with the forward-pass differences it declares (biases, q/k norms,
// RoPE layout, tied output), a file without a required tensor is refused and
// one without an optional tensor is not, and the same weights under its
// Hugging Face names and config keys give the same logits.
func TestArchitectures(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	if got := Archs(); !slices.Equal(got, []string{"llama", "mistral", "qwen2", "qwen3"}) {
		t.Errorf("registered architectures %v", got)
	}
	for _, name := range Archs() {
		t.Run(name, func(t *testing.T) {
			a, _ := LookupArch(name)
			cfg := archTestConfig(a)
			data := archTestGGUF(t, a, &cfg)
			m, err := archTestBuild(t, data, be)
			if err != nil {
				t.Fatal(err)
			}
			got := m.Config
			got.Name = cfg.Name
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", cfg) {
				t.Errorf("config read back\n%+v\nwritten\n%+v", got, cfg)
			}
			l := &m.Layers[1]
			if (l.Bq != nil) != (a.QKVBias != Absent) || (l.Bk != nil) != (l.Bq != nil) || (l.Bv != nil) != (l.Bq != nil) {
				t.Errorf("biases loaded: %v, the architecture's %v", l.Bq != nil, a.QKVBias)
			}
			if (l.QNorm != nil) != (a.QKNorm != Absent) || (l.KNorm != nil) != (l.QNorm != nil) {
				t.Errorf("q/k norms loaded: %v, the architecture's %v", l.QNorm != nil, a.QKNorm)
			}
			if m.Output == m.Embedding {
				t.Error("an untied output was tied")
			}

			// Required and optional tensors.
			for _, ts := range a.TensorSpecs(&cfg) {
				if ts.Layer > 0 || ts.Role == RoleEmbedding {
					continue
				}
				_, err := archTestBuild(t, archTestGGUF(t, a, &cfg, ts.GGUF), be)
				switch {
				case ts.Optional && err != nil:
					t.Errorf("without the optional %s: %v", ts.GGUF, err)
				case !ts.Optional && (err == nil || !strings.Contains(err.Error(), ts.GGUF)):
					t.Errorf("without the required %s: %v, want an error naming it", ts.GGUF, err)
				}
			}
			if a.Output == Optional {
				tied, err := archTestBuild(t, archTestGGUF(t, a, &cfg, a.Tensors.Output.GGUF), be)
				if err != nil || tied.Output != tied.Embedding {
					t.Errorf("without an output matrix: %v, tied %v", err, err == nil && tied.Output == tied.Embedding)
				}
			}

			// The Hugging Face checkpoint of the same weights.
			hf, err := loadHFWeights(archTestHF(t, a, m, data), be)
			if err != nil {
				t.Fatal(err)
			}
			defer hf.Close()
			if hf.Config.Arch != name || !hf.Config.RopeNeox {
				t.Errorf("HF config: architecture %q, NEOX %v", hf.Config.Arch, hf.Config.RopeNeox)
			}
			tol := 0.0
			if !a.GGUFNeox {
				tol = 1e-4 // the permuted rows only reorder sums
			}
			ra, rb := newSeqRunner(t, m, be, 8), newSeqRunner(t, hf, be, 8)
			for i, tok := range []int32{1, 40, 7, 299, 3} {
				la, lb := ra.feed(t, []int32{tok}), rb.feed(t, []int32{tok})
				for j := range la {
					if d := math.Abs(float64(la[j] - lb[j])); d > tol*math.Max(1, maxAbs(la)) {
						t.Fatalf("position %d logit %d: GGUF %v, Hugging Face %v", i, j, la[j], lb[j])
					}
				}
			}
		})
	}
}

// TestArchRegistryErrors: files of an architecture nobody registered are
// refused naming it and the registered ones.
func TestArchRegistryErrors(t *testing.T) {
	w := gguf.NewWriter()
	w.SetKV("general.architecture", "falcon")
	var buf bytes.Buffer
	w.WriteTo(&buf)
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configFromGGUF(f); err == nil || !strings.Contains(err.Error(), `"falcon"`) || !strings.Contains(err.Error(), "llama, mistral, qwen2, qwen3") {
		t.Errorf("GGUF of an unregistered architecture: %v", err)
	}
	if err := WriteGGUFConfig(gguf.NewWriter(), &Config{Arch: "falcon"}); err == nil {
		t.Error("WriteGGUFConfig of an unregistered architecture: no error")
	}
	path := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(path, []byte(`{"architectures":["FalconForCausalLM"],"hidden_size":64}`), 0o644)
	if _, err := readHFConfig(path); err == nil || !strings.Contains(err.Error(), "FalconForCausalLM") || !strings.Contains(err.Error(), "Qwen3ForCausalLM") {
		t.Errorf("HF config of an unregistered class: %v", err)
	}
	os.WriteFile(path, []byte(`{"architectures":["LlamaForCausalLM"],"hidden_size":"wide"}`), 0o644)
	if _, err := readHFConfig(path); err == nil || !strings.Contains(err.Error(), "hidden_size") {
		t.Errorf("HF config with a string for a size: %v", err)
	}
}
