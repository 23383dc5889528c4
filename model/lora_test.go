package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tandem/gguf"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
)

// loraFixtures are the F32 fixture models of every architecture family whose merged
// weights a test can write exactly: llama (trained, its GGUF q and k rows permuted), qwen2
// (q, k, v biases), qwen3 (q/k norms, q wider than the model).
var loraFixtures = []string{"stories260K-f32.gguf", "rand-llama-tok512-f32.gguf", "rand-qwen2-tok512-f32.gguf", "rand-qwen3-tok512-f32.gguf"}

// randomAdapter is RandomAdapter, failing the test on an error.
func randomAdapter(t testing.TB, m *Model, rank int, alpha float32, seed uint64, roles ...TensorRole) *Adapter {
	t.Helper()
	a, err := RandomAdapter(m, rank, alpha, seed, roles...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// writeMerged writes m's file with every update of a merged into its weight, W + s·B·A
// summed in float64 and stored as float32: the model the adapter makes, as a merge tool
// (peft's merge_and_unload, llama.cpp's llama-export-lora) writes it.
func writeMerged(t *testing.T, basePath string, m *Model, a *Adapter) string {
	t.Helper()
	f, err := gguf.Open(basePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := gguf.NewWriter()
	for _, k := range f.Keys {
		v, _ := f.Get(k)
		w.SetKV(k, v)
	}
	specs := projections(m)
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		data := f.TensorData(ti)
		if ts, ok := specs[ti.Name]; ok {
			if u := *a.Layers[ts.Layer].update(ts.Role); u != nil {
				if ti.Type != hal.F32 {
					t.Fatalf("%s is %s: merging needs F32 weights", ti.Name, ti.Type)
				}
				merged := make([]byte, len(data))
				for j := range u.Out {
					for k := range u.In {
						var d float64
						for r := range u.Rank {
							d += float64(u.BT[r*u.Out+j]) * float64(u.A[r*u.In+k])
						}
						x := float64(math.Float32frombits(binary.LittleEndian.Uint32(data[4*(j*u.In+k):])))
						binary.LittleEndian.PutUint32(merged[4*(j*u.In+k):], math.Float32bits(float32(x+float64(u.Scale)*d)))
					}
				}
				data = merged
			}
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "merged.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// promptLogits runs tokens through m in one step with adapter a (nil: none) and returns
// every position's logits.
func promptLogits(t *testing.T, m *Model, be hal.Backend, tokens []int32, a *Adapter) [][]float32 {
	t.Helper()
	var adapters []*Adapter
	if a != nil {
		adapters = []*Adapter{a}
	}
	return runAdaptedBatches(t, m, be, 16, [][]int32{tokens}, adapters, [][]int{{len(tokens)}})[0]
}

func fixturePrompt(m *Model, n int) []int32 {
	rng := rand.New(rand.NewPCG(11, uint64(n)))
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(rng.IntN(m.Config.VocabSize))
	}
	return p
}

// An adapter applied at run time, read from its GGUF file or from its PEFT directory, gives
// the logits of the model whose weights have it merged in, within the tolerance the F32
// fixtures meet llama.cpp's goldens with (1e-3), on every architecture family; and it
// moves them far more than that from the base model's.
func TestAdapterMatchesMergedWeights(t *testing.T) {
	be := cpu.New(2)
	defer be.Close()
	for _, name := range loraFixtures {
		t.Run(name, func(t *testing.T) {
			path := fixtures.Model(t, name)
			m := loadFixture(t, be, name)
			gen := randomAdapter(t, m, 8, 16, 1)
			dir := t.TempDir()
			ggufPath, peftDir := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "peft")
			if err := gen.WriteGGUF(ggufPath); err != nil {
				t.Fatal(err)
			}
			if err := gen.WritePEFT(peftDir); err != nil {
				t.Fatal(err)
			}
			merged, err := Load(writeMerged(t, path, m, gen), be)
			if err != nil {
				t.Fatal(err)
			}
			defer merged.Close()
			prompt := fixturePrompt(m, 40)
			want := promptLogits(t, merged, be, prompt, nil)
			base := promptLogits(t, m, be, prompt, nil)
			for _, src := range []string{ggufPath, peftDir} {
				a, err := LoadAdapter(src, m, be)
				if err != nil {
					t.Fatal(err)
				}
				if a.Rank != 8 || len(a.Targets) != 7 {
					t.Errorf("%s: rank %d, targets %v", src, a.Rank, a.Targets)
				}
				got := promptLogits(t, m, be, prompt, a)
				var maxDiff, moved float64
				for p := range got {
					for j := range got[p] {
						maxDiff = max(maxDiff, math.Abs(float64(got[p][j]-want[p][j])))
						moved = max(moved, math.Abs(float64(base[p][j]-want[p][j])))
					}
				}
				t.Logf("%s: max |adapter − merged| %.2g, the adapter moves logits by up to %.3g", filepath.Base(src), maxDiff, moved)
				if maxDiff > 1e-3 {
					t.Errorf("%s: logits with the adapter differ from the merged model's by %g (> 1e-3)", src, maxDiff)
				}
				if moved < 0.1 {
					t.Errorf("the adapter moves the logits by only %g: the test would not see a wrong update", moved)
				}
			}
		})
	}
}

// A file round trip keeps every value: the GGUF file and the PEFT directory (whose q and k
// rows are in Hugging Face's order, permuted on the way in for a llama GGUF model) load as
// the adapter that wrote them, bit for bit.
func TestAdapterFilesRoundTrip(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	for _, name := range []string{"stories260K-f32.gguf", "rand-qwen2-tok512-f32.gguf"} {
		m := loadFixture(t, be, name)
		gen := randomAdapter(t, m, 4, 4, 2, RoleQ, RoleK, RoleDown)
		dir := t.TempDir()
		if err := gen.WriteGGUF(filepath.Join(dir, "a.gguf")); err != nil {
			t.Fatal(err)
		}
		if err := gen.WritePEFT(filepath.Join(dir, "peft")); err != nil {
			t.Fatal(err)
		}
		for _, src := range []string{"a.gguf", "peft"} {
			a, err := LoadAdapter(filepath.Join(dir, src), m, be)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(a.Targets, ",") != "attn_k,attn_q,ffn_down" {
				t.Errorf("%s %s: targets %v", name, src, a.Targets)
			}
			for li := range gen.Layers {
				for _, role := range []TensorRole{RoleQ, RoleK, RoleV, RoleDown} {
					w, g := *a.Layers[li].update(role), *gen.Layers[li].update(role)
					if (w == nil) != (g == nil) {
						t.Fatalf("%s %s layer %d role %d: present %v, want %v", name, src, li, role, w != nil, g != nil)
					}
					if w == nil {
						continue
					}
					if w.Scale != g.Scale || fmt.Sprint(w.A) != fmt.Sprint(g.A) || fmt.Sprint(w.BT) != fmt.Sprint(g.BT) {
						t.Fatalf("%s %s layer %d role %d: the update read back differs", name, src, li, role)
					}
				}
			}
		}
	}
}

// Sequences with four different adapters and one without share each step, under chunked
// prefill and decode, and each gets the logits it gets alone, bit for bit.
func TestAdapterBatchInvariance(t *testing.T) {
	be := cpu.New(2)
	defer be.Close()
	for _, name := range []string{"rand-qwen3-tok512-f32.gguf", "rand-llama-tok512-q8_0.gguf", "rand-llama256-tok512-q4_k_m.gguf"} {
		t.Run(name, func(t *testing.T) {
			m := loadFixture(t, be, name)
			adapters := []*Adapter{
				randomAdapter(t, m, 8, 16, 10),
				nil,
				randomAdapter(t, m, 4, 8, 11, RoleQ, RoleV),
				randomAdapter(t, m, 16, 16, 12, RoleGate, RoleUp, RoleDown),
				randomAdapter(t, m, 2, 4, 13, RoleO, RoleK),
			}
			var seqs [][]int32
			for i := range adapters {
				seqs = append(seqs, fixturePrompt(m, 20+7*i))
			}
			for i, a := range adapters {
				alone := runAdaptedBatches(t, m, be, 16, [][]int32{seqs[i]}, []*Adapter{a}, [][]int{{len(seqs[i])}})[0]
				for cname, steps := range map[string][][]int{
					"one step":           {{20, 27, 34, 41, 48}},
					"chunks and decodes": {{5, 27, 1, 41, 3}, {15, 0, 33, 0, 40}, {0, 0, 0, 0, 5}},
				} {
					got := runAdaptedBatches(t, m, be, 16, seqs, adapters, steps)[i]
					for p := range alone {
						for j := range alone[p] {
							if math.Float32bits(alone[p][j]) != math.Float32bits(got[p][j]) {
								t.Fatalf("sequence %d (%s): position %d logit %d is %v alone, %v in the mixed batch", i, cname, p, j, alone[p][j], got[p][j])
							}
						}
					}
				}
			}
			// The adapters do change their sequences' logits.
			base := runAdaptedBatches(t, m, be, 16, [][]int32{seqs[0]}, nil, [][]int{{len(seqs[0])}})[0]
			adapted := runAdaptedBatches(t, m, be, 16, [][]int32{seqs[0]}, adapters[:1], [][]int{{len(seqs[0])}})[0]
			if fmt.Sprint(base[len(base)-1]) == fmt.Sprint(adapted[len(adapted)-1]) {
				t.Fatal("the adapter changed nothing")
			}
		})
	}
}

// Adapters that do not fit the model, or are not plain LoRA, are refused with the reason.
func TestAdapterRefusals(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	m := loadFixture(t, be, "stories260K-f32.gguf")
	other := loadFixture(t, be, "rand-qwen2-tok512-f32.gguf")
	dir := t.TempDir()
	qwen := filepath.Join(dir, "qwen.gguf")
	if err := randomAdapter(t, other, 4, 4, 3).WriteGGUF(qwen); err != nil {
		t.Fatal(err)
	}
	peft := filepath.Join(dir, "peft")
	if err := randomAdapter(t, m, 4, 4, 3).WritePEFT(peft); err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(filepath.Join(peft, PEFTConfigFile))
	writePEFTConfig := func(name, old, new string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		w, _ := os.ReadFile(filepath.Join(peft, PEFTWeightsFile))
		os.WriteFile(filepath.Join(d, PEFTWeightsFile), w, 0o644)
		os.WriteFile(filepath.Join(d, PEFTConfigFile), []byte(strings.Replace(string(cfg), old, new, 1)), 0o644)
		return d
	}
	for _, tc := range []struct{ path, want string }{
		{qwen, `an adapter for architecture "qwen2", the model is "llama"`},
		{fixtures.Model(t, "stories260K-f32.gguf"), "not an adapter"},
		{writePEFTConfig("dora", `"use_dora": false`, `"use_dora": true`), "DoRA"},
		{writePEFTConfig("bias", `"bias": "none"`, `"bias": "all"`), "biases"},
		{writePEFTConfig("ia3", `"peft_type": "LORA"`, `"peft_type": "IA3"`), "only LORA"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		_, err := LoadAdapter(tc.path, m, be)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", filepath.Base(tc.path), err, tc.want)
		}
	}
	// An adapter of one model in a batch of another is refused.
	a, err := LoadAdapter(qwen, other, be)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(m, be)
	kv, _ := be.NewKVStore(m.KVLayout(1, 16))
	b := &Batch{Tokens: []int32{1}, Attn: hal.AttnBatch{Pos: []int32{0}, SeqOf: []int32{0}, Blocks: [][]int32{{0}}}, Outputs: []int{0}, Adapters: []*Adapter{a}}
	if err := r.Forward(kv, b, make([]float32, m.Config.VocabSize)); err == nil || !strings.Contains(err.Error(), "another model") {
		t.Errorf("an adapter of another model: %v", err)
	}
}

// Whatever bytes an adapter file holds, loading it fails with an error or succeeds; it
// never panics or allocates without bound.
func FuzzLoadAdapterGGUF(f *testing.F) {
	be := cpu.New(1)
	defer be.Close()
	m := loadFixture(f, be, "stories260K-f32.gguf")
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.gguf")
	if err := randomAdapter(f, m, 2, 4, 1, RoleQ, RoleDown).WriteGGUF(seed); err != nil {
		f.Fatal(err)
	}
	data, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(data[:len(data)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "a.gguf")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if a, err := LoadAdapter(path, m, be); err == nil && a.Rank == 0 {
			t.Fatal("an adapter without updates loaded")
		}
	})
}

// An adapter's files apply alike to a model read from GGUF (llama's q and k rows permuted)
// and from a Hugging Face checkpoint (not): the loader matches B's rows to each model's
// layout, so both give the same logits (as the two models do without it).
func TestAdapterOnHFCheckpoint(t *testing.T) {
	be := cpu.New(2)
	defer be.Close()
	for _, name := range []string{"rand-llama-tok512-f32.gguf", "rand-qwen2-tok512-f32.gguf"} {
		t.Run(name, func(t *testing.T) {
			ref := loadFixture(t, be, name)
			hf, err := loadHFWeights(writeHF(t, fixtures.Model(t, name), 1), be)
			if err != nil {
				t.Fatal(err)
			}
			defer hf.Close()
			gen := randomAdapter(t, ref, 4, 8, 5)
			dir := t.TempDir()
			files := []string{filepath.Join(dir, "a.gguf"), filepath.Join(dir, "peft")}
			if err := gen.WriteGGUF(files[0]); err != nil {
				t.Fatal(err)
			}
			if err := gen.WritePEFT(files[1]); err != nil {
				t.Fatal(err)
			}
			prompt := fixturePrompt(ref, 24)
			for _, f := range files {
				ar, err := LoadAdapter(f, ref, be)
				if err != nil {
					t.Fatal(err)
				}
				ah, err := LoadAdapter(f, hf, be)
				if err != nil {
					t.Fatal(err)
				}
				want, got := promptLogits(t, ref, be, prompt, ar), promptLogits(t, hf, be, prompt, ah)
				base := promptLogits(t, ref, be, prompt, nil)
				var maxDiff, moved float64
				for p := range want {
					for j := range want[p] {
						maxDiff = max(maxDiff, math.Abs(float64(got[p][j]-want[p][j])))
						moved = max(moved, math.Abs(float64(base[p][j]-want[p][j])))
					}
				}
				if maxDiff > 1e-3 || moved < 0.1 {
					t.Errorf("%s: HF checkpoint with the adapter differs from GGUF by %g (the adapter moves logits by %g)", filepath.Base(f), maxDiff, moved)
				}
			}
		})
	}
}
