package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tandem/gguf"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/safetensors"
)

// hfNames maps GGUF tensor names back to Hugging Face's, for writing test
// checkpoints.
func hfName(gg string) string {
	repl := []struct{ gguf, hf string }{
		{"token_embd.weight", "model.embed_tokens.weight"},
		{"output_norm.weight", "model.norm.weight"},
		{"output.weight", "lm_head.weight"},
		{".attn_norm.weight", ".input_layernorm.weight"},
		{".attn_q_norm.weight", ".self_attn.q_norm.weight"},
		{".attn_k_norm.weight", ".self_attn.k_norm.weight"},
		{".attn_q.", ".self_attn.q_proj."},
		{".attn_k.", ".self_attn.k_proj."},
		{".attn_v.", ".self_attn.v_proj."},
		{".attn_output.weight", ".self_attn.o_proj.weight"},
		{".ffn_norm.weight", ".post_attention_layernorm.weight"},
		{".ffn_gate.weight", ".mlp.gate_proj.weight"},
		{".ffn_up.weight", ".mlp.up_proj.weight"},
		{".ffn_down.weight", ".mlp.down_proj.weight"},
	}
	for _, r := range repl {
		if gg == r.gguf || (r.gguf[0] == '.' && strings.Contains(gg, r.gguf)) {
			gg = strings.Replace(gg, r.gguf, r.hf, 1)
			return strings.Replace(gg, "blk.", "model.layers.", 1)
		}
	}
	return ""
}

// unpermute undoes the GGUF converter's reordering of llama q/k rows, which
// lets GGUF rotate adjacent pairs where HF rotates halves.
func unpermute(data []byte, rows, rowBytes, heads int) []byte {
	out := make([]byte, len(data))
	hd := rows / heads
	for h := 0; h < heads; h++ {
		for half := 0; half < 2; half++ {
			for i := 0; i < hd/2; i++ {
				src := h*hd + 2*i + half
				dst := h*hd + half*hd/2 + i
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}

// writeHF writes the weights of a GGUF fixture as a Hugging Face checkpoint
// split into shards files.
func writeHF(t *testing.T, path string, shards int) string {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := configFromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writers := make([]*safetensors.Writer, shards)
	for i := range writers {
		writers[i] = safetensors.NewWriter()
	}
	tied := true
	for i, ti := range f.Tensors {
		name := hfName(ti.Name)
		if name == "" {
			continue
		}
		if ti.Name == "output.weight" {
			tied = false
		}
		data := f.TensorData(&ti)
		shape := make([]int64, len(ti.Dims))
		for j, d := range ti.Dims {
			shape[len(ti.Dims)-1-j] = int64(d)
		}
		if cfg.Arch == "llama" && len(shape) == 2 {
			rb := len(data) / int(shape[0])
			switch {
			case strings.HasSuffix(ti.Name, "attn_q.weight"):
				data = unpermute(data, int(shape[0]), rb, cfg.Heads)
			case strings.HasSuffix(ti.Name, "attn_k.weight"):
				data = unpermute(data, int(shape[0]), rb, cfg.KVHeads)
			}
		}
		if err := writers[i%shards].Add(name, ti.Type.String(), shape, data); err != nil {
			t.Fatal(err)
		}
	}
	if shards == 1 {
		if err := writers[0].WriteFile(filepath.Join(dir, "model.safetensors")); err != nil {
			t.Fatal(err)
		}
	} else if err := safetensors.WriteSharded(dir, writers); err != nil {
		t.Fatal(err)
	}
	archName := map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[cfg.Arch]
	conf := map[string]any{
		"architectures":           []string{archName},
		"hidden_size":             cfg.Embd,
		"num_hidden_layers":       cfg.Layers,
		"num_attention_heads":     cfg.Heads,
		"num_key_value_heads":     cfg.KVHeads,
		"head_dim":                cfg.HeadDim,
		"intermediate_size":       cfg.FFN,
		"vocab_size":              cfg.VocabSize,
		"max_position_embeddings": cfg.ContextLen,
		"rms_norm_eps":            cfg.NormEps,
		"rope_theta":              cfg.RopeBase,
		"tie_word_embeddings":     tied,
	}
	js, _ := json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSafetensorsMatchesGGUF loads HF checkpoints written from GGUF fixtures
// and holds their logits to the GGUF model's. Qwen layouts are identical, so
// bit for bit; llama's q/k rows are permuted, which only reorders sums.
func TestSafetensorsMatchesGGUF(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	cases := []struct {
		file   string
		shards int
		tol    float64
	}{
		{"rand-qwen2-tok512-f32.gguf", 1, 0},
		{"rand-qwen3-tok512-f32.gguf", 3, 0},
		{"rand-llama-tok512-f32.gguf", 2, 1e-4},
		{"rand-llama-tok512-f16.gguf", 1, 1e-4},
		{"rand-llama-tok512-bf16.gguf", 1, 1e-4},
		{"stories260K-f32.gguf", 1, 1e-4},
	}
	tokens := []int32{1, 403, 407, 261, 378, 300, 12, 77, 450, 31, 200}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			path := fixtures.Model(t, tc.file)
			ref := loadFixture(t, be, tc.file)
			hf, err := loadHFWeights(writeHF(t, path, tc.shards), be)
			if err != nil {
				t.Fatal(err)
			}
			defer hf.Close()
			if hf.FileType != ref.FileType && !strings.Contains(tc.file, "f32") {
				t.Errorf("file type %s, GGUF %s", hf.FileType, ref.FileType)
			}
			a := newSeqRunner(t, ref, be, len(tokens))
			b := newSeqRunner(t, hf, be, len(tokens))
			for i, tok := range tokens {
				la, lb := a.feed(t, []int32{tok}), b.feed(t, []int32{tok})
				for j := range la {
					if d := math.Abs(float64(la[j] - lb[j])); d > tc.tol*math.Max(1, maxAbs(la)) {
						t.Fatalf("position %d logit %d: GGUF %v, safetensors %v", i, j, la[j], lb[j])
					}
				}
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Load(filepath.Join(dir, "nope.gguf"), be); err == nil {
		t.Error("missing file: no error")
	}
	write("config.json", `{"architectures":["GPT2LMHeadModel"]}`)
	if _, err := loadHFWeights(dir, be); err == nil || !strings.Contains(err.Error(), "GPT2LMHeadModel") {
		t.Errorf("unsupported architecture: %v", err)
	}
	write("config.json", `{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":128,"vocab_size":512}`)
	if _, err := loadHFWeights(dir, be); err == nil || !strings.Contains(err.Error(), "model.safetensors") {
		t.Errorf("no weights: %v", err)
	}
	w := gguf.NewWriter()
	w.SetKV("general.architecture", "gptneox")
	p := filepath.Join(dir, "x.gguf")
	if err := w.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p, be); err == nil || !strings.Contains(err.Error(), `"gptneox"`) {
		t.Errorf("unsupported GGUF architecture: %v", err)
	}
}
