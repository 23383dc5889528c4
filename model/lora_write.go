package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"tandem/gguf"
	"tandem/hal"
	"tandem/safetensors"
)

// NewAdapter returns an adapter of m with the given per-layer updates (nil: none), for
// tools and tests that make adapters (tandem gen-lora): each update's In and Out must be
// its projection's and its slices the sizes they say; B's rows are in m's own order.
func NewAdapter(m *Model, layers []AdapterLayer) (*Adapter, error) {
	if len(layers) != m.Config.Layers {
		return nil, fmt.Errorf("model: an adapter of %d layers for a model of %d", len(layers), m.Config.Layers)
	}
	// Its ID hashes its values, as a file's hashes its bytes: two made adapters share KV
	// only where they compute the same.
	h := sha256.New()
	for _, ts := range projections(m) {
		if w := *layers[ts.Layer].update(ts.Role); w != nil {
			fmt.Fprintf(h, "%s %d %d %d %v;", ts.GGUF, w.Rank, w.In, w.Out, w.Scale)
			h.Write(f32LE(w.A))
			h.Write(f32LE(w.BT))
		}
	}
	a := newAdapter(m, "new", h.Sum(nil))
	for _, ts := range projections(m) {
		w := *layers[ts.Layer].update(ts.Role)
		if w == nil {
			continue
		}
		A := tensorF32{rows: w.Rank, cols: w.In, v: w.A}
		B := tensorF32{rows: w.Out, cols: w.Rank, v: make([]float32, w.Out*w.Rank)}
		if len(w.A) != w.Rank*w.In || len(w.BT) != w.Rank*w.Out {
			return nil, fmt.Errorf("model: the update of %s holds %d and %d values for rank %d", ts.GGUF, len(w.A), len(w.BT), w.Rank)
		}
		for i := range w.Rank {
			for j := range w.Out {
				B.v[j*w.Rank+i] = w.BT[i*w.Out+j]
			}
		}
		if err := a.set(ts, A, B, float64(w.Scale), m.Config.RopeNeox); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
	}
	if a.Rank == 0 {
		return nil, fmt.Errorf("model: an adapter without updates")
	}
	return a, nil
}

// RandomAdapter makes an adapter of m of the given rank on the projections of the given
// roles (all seven when none), with scale alpha/rank and values drawn from seed: A's
// N(0, 1/in), B's N(0, 0.07²), large enough to move the logits well past any comparison's
// tolerance (a trained adapter's B starts at zero; tests need one that changes something).
// tandem gen-lora writes them for tests and benchmarks.
func RandomAdapter(m *Model, rank int, alpha float32, seed uint64, roles ...TensorRole) (*Adapter, error) {
	if rank < 1 || rank > 4096 {
		return nil, fmt.Errorf("model: adapter rank %d (want 1..4096)", rank)
	}
	if len(roles) == 0 {
		roles = []TensorRole{RoleQ, RoleK, RoleV, RoleO, RoleGate, RoleUp, RoleDown}
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	layers := make([]AdapterLayer, m.Config.Layers)
	arch, _ := LookupArch(m.Config.Arch)
	for _, ts := range arch.TensorSpecs(&m.Config) { // in file order: a seed makes one adapter
		if !ts.Matrix() || ts.Layer < 0 || !slices.Contains(roles, ts.Role) || layers[ts.Layer].update(ts.Role) == nil {
			continue
		}
		out, in := ts.Shape[0], ts.Shape[1]
		w := &hal.LowRank{Rank: rank, In: in, Out: out, A: make([]float32, rank*in), BT: make([]float32, rank*out), Scale: alpha / float32(rank)}
		for i := range w.A {
			w.A[i] = float32(rng.NormFloat64() / math.Sqrt(float64(in)))
		}
		for i := range w.BT {
			w.BT[i] = float32(rng.NormFloat64() * 0.07)
		}
		*layers[ts.Layer].update(ts.Role) = w
	}
	return NewAdapter(m, layers)
}

// fileB is the B matrix (Out × Rank, row-major) of update w of projection ts, its rows in
// the order of a file whose q and k rows rotate NEOX-style (neox) or not.
func (a *Adapter) fileB(ts TensorSpec, w *hal.LowRank, neox bool) []float32 {
	perm := a.model.qkPermutation(ts, neox)
	b := make([]float32, w.Out*w.Rank)
	for row := range w.Out {
		src := perm(row)
		for i := range w.Rank {
			b[row*w.Rank+i] = w.BT[i*w.Out+src]
		}
	}
	return b
}

// alpha is the LoRA alpha of every update of a (Scale·Rank), which a GGUF adapter file
// holds once; an adapter whose updates differ in it has none.
func (a *Adapter) alpha() (float64, bool) {
	alpha := math.NaN()
	for _, ts := range projections(a.model) {
		if w := *a.Layers[ts.Layer].update(ts.Role); w != nil {
			x := float64(w.Scale) * float64(w.Rank)
			if !math.IsNaN(alpha) && math.Abs(x-alpha) > 1e-6*math.Abs(alpha) {
				return 0, false
			}
			alpha = x
		}
	}
	return alpha, !math.IsNaN(alpha)
}

// WriteGGUF writes a as llama.cpp's GGUF LoRA adapter (F32 tensors): what
// convert_lora_to_gguf.py writes, and what llama.cpp's --lora and LoadAdapter read.
func (a *Adapter) WriteGGUF(path string) error {
	alpha, ok := a.alpha()
	if !ok {
		return fmt.Errorf("model: a GGUF adapter has one alpha; this adapter's updates differ in scale × rank")
	}
	arch, _ := LookupArch(a.model.Config.Arch)
	w := gguf.NewWriter()
	w.SetKV("general.architecture", a.model.Config.Arch)
	w.SetKV("general.type", "adapter")
	w.SetKV("adapter.type", "lora")
	w.SetKV("adapter.lora.alpha", float32(alpha))
	for _, ts := range arch.TensorSpecs(&a.model.Config) {
		if !ts.Matrix() || ts.Layer < 0 {
			continue
		}
		up := a.Layers[ts.Layer].update(ts.Role)
		if up == nil || *up == nil {
			continue
		}
		u := *up
		if err := w.AddTensor(ts.GGUF+".lora_a", hal.F32, []uint64{uint64(u.In), uint64(u.Rank)}, f32LE(u.A)); err != nil {
			return err
		}
		if err := w.AddTensor(ts.GGUF+".lora_b", hal.F32, []uint64{uint64(u.Rank), uint64(u.Out)}, f32LE(a.fileB(ts, u, arch.GGUFNeox))); err != nil {
			return err
		}
	}
	return w.WriteFile(path)
}

// WritePEFT writes a as a Hugging Face PEFT directory (adapter_config.json and
// adapter_model.safetensors, F32), creating dir.
func (a *Adapter) WritePEFT(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	arch, _ := LookupArch(a.model.Config.Arch)
	sw := safetensors.NewWriter()
	pc := map[string]any{"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none", "use_rslora": false, "use_dora": false,
		"fan_in_fan_out": false, "lora_dropout": 0.0, "r": a.Rank, "base_model_name_or_path": a.model.Config.Name}
	var targets []string
	alphas := map[string]float64{}
	first := math.NaN()
	for _, ts := range arch.TensorSpecs(&a.model.Config) {
		if !ts.Matrix() || ts.Layer < 0 {
			continue
		}
		up := a.Layers[ts.Layer].update(ts.Role)
		if up == nil || *up == nil {
			continue
		}
		u := *up
		module := strings.TrimSuffix(ts.HF, ".weight")
		if err := sw.Add("base_model.model."+module+".lora_A.weight", "F32", []int64{int64(u.Rank), int64(u.In)}, f32LE(u.A)); err != nil {
			return err
		}
		if err := sw.Add("base_model.model."+module+".lora_B.weight", "F32", []int64{int64(u.Out), int64(u.Rank)}, f32LE(a.fileB(ts, u, true))); err != nil {
			return err
		}
		short := module[strings.LastIndexByte(module, '.')+1:]
		if !slices.Contains(targets, short) {
			targets = append(targets, short)
		}
		alpha := float64(u.Scale) * float64(u.Rank)
		if math.IsNaN(first) {
			first = alpha
		}
		if alpha != first {
			alphas[module] = alpha
		}
	}
	pc["lora_alpha"], pc["target_modules"], pc["alpha_pattern"], pc["rank_pattern"] = first, targets, alphas, map[string]int{}
	js, err := json.MarshalIndent(pc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, PEFTConfigFile), js, 0o644); err != nil {
		return err
	}
	return sw.WriteFile(filepath.Join(dir, PEFTWeightsFile))
}

func f32LE(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
