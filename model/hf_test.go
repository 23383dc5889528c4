package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"tandem/gguf"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/safetensors"
	"tandem/tokenizer"
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
	// Nonsense that loaded before, as a context of 2048 and a RoPE base of 10000.
	for field, value := range map[string]string{"max_position_embeddings": "0", "rope_theta": "-1e6"} {
		for _, v := range []string{value, "-5"} {
			write("config.json", `{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":128,"vocab_size":512,"`+field+`":`+v+`}`)
			if _, err := loadHFWeights(dir, be); err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("%s %s: %v, want an error naming the field", field, v, err)
			}
		}
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

// writeHFTokenizer writes tokenizer.json, tokenizer_config.json and
// generation_config.json for a byte-level Qwen2 vocabulary taken from GGUF
// metadata, the way Qwen ships them.
func writeHFTokenizer(t *testing.T, path, dir string) {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tokens, _ := f.Strings("tokenizer.ggml.tokens")
	merges, _ := f.Strings("tokenizer.ggml.merges")
	typesAny, _ := f.Get("tokenizer.ggml.token_type")
	types := typesAny.([]int32)
	tmpl, _ := f.String("tokenizer.chat_template")
	vocab := map[string]int{}
	var added []map[string]any
	for id, s := range tokens {
		switch types[id] {
		case 3: // control
			added = append(added, map[string]any{"id": id, "content": s, "special": true})
		case 5: // unused padding: left out, as in Qwen's files
		default:
			vocab[s] = id
		}
	}
	const qwen2Split = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	files := map[string]any{
		"tokenizer.json": map[string]any{
			"version": "1.0", "added_tokens": added, "normalizer": map[string]any{"type": "NFC"},
			"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwen2Split}, "behavior": "Isolated", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
			}},
			"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
			"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": false},
		},
		"tokenizer_config.json":  map[string]any{"bos_token": nil, "eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": tmpl},
		"generation_config.json": map[string]any{"eos_token_id": []int{151645, 151643}},
	}
	for name, v := range files {
		js, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), js, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadHFDirectory loads a complete HF directory (weights, config,
// tokenizer, chat template, generation config) and compares it with the
// GGUF it was written from.
func TestLoadHFDirectory(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	path := fixtures.Model(t, "rand-qwen2-qwen2vocab-f32.gguf")
	dir := writeHF(t, path, 1)
	writeHFTokenizer(t, path, dir)
	hf, err := Load(dir, be)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	ref := loadFixture(t, be, "rand-qwen2-qwen2vocab-f32.gguf")
	for _, text := range []string{"Hello world", "  spaces\n\nand 12345 numbers", "<|im_start|>user\nhi<|im_end|>"} {
		a, b := ref.Tokenizer.Encode(text, true, true), hf.Tokenizer.Encode(text, true, true)
		if !slices.Equal(a, b) {
			t.Errorf("%q: GGUF tokens %v, HF %v", text, a, b)
		}
	}
	if !hf.Tokenizer.IsEOG(151645) || !hf.Tokenizer.IsEOG(151643) {
		t.Error("generation_config eos ids are not end-of-generation tokens")
	}
	msgs := []tokenizer.Message{{Role: "user", Content: "Hi"}}
	a, errA := ref.Tokenizer.ApplyChatTemplate(msgs, true)
	b, errB := hf.Tokenizer.ApplyChatTemplate(msgs, true)
	if errA != nil || errB != nil || a != b || !strings.Contains(b, "<|im_start|>assistant") {
		t.Errorf("chat template: GGUF %q (%v), HF %q (%v)", a, errA, b, errB)
	}
	prompt := ref.Tokenizer.Encode(a, false, true)
	la := newSeqRunner(t, ref, be, len(prompt)).feed(t, prompt)
	lb := newSeqRunner(t, hf, be, len(prompt)).feed(t, prompt)
	if !slices.Equal(la, lb) {
		t.Error("HF directory logits differ from the GGUF's")
	}
}
