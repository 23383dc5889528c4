// Package modelgen writes random-weight models of real shapes as GGUF: the
// built-in demo model, and benchmark models in any tensor type.
package modelgen

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"tandem/gguf"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/model"
	"tandem/tokenizer"
)

// Spec is the shape and storage of a model to generate.
type Spec struct {
	Arch       string // a registered architecture (model.Archs): llama, mistral, qwen2, qwen3
	Name       string
	Embd       int
	Layers     int
	Heads      int
	KVHeads    int
	HeadDim    int
	FFN        int
	VocabSize  int // 0: the tokenizer's size
	ContextLen int
	RopeBase   float64
	NormEps    float32
	Tied       bool
	QKVBias    bool // q, k and v biases (always, for an architecture that requires them)
	// TextOnly makes a byte-level model write only printable ASCII, space
	// and newline, and never end on its own (the demo model; needs an untied
	// output). Hidden dimension 0 carries a constant through the residual
	// stream, and the output rows of every other token weigh it strongly
	// negative, so their logits sit far below the rest at any temperature.
	TextOnly bool
	// Llama3Rope adds llama3 rope scaling (factor 32, low 1, high 4, 8192),
	// as Llama 3.1/3.2 use, stored as rope_freqs.weight.
	Llama3Rope bool

	// Type is a file type: a tensor type name (f32, f16, bf16, q8_0, q4_0,
	// q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k) or a llama.cpp mix (q4_k_m, q4_k_s, q5_k_m).
	Type string
	Seed uint64

	// Vocab, when set, supplies every tokenizer.* key (a real tokenizer);
	// otherwise a byte-level vocabulary is written.
	Vocab *gguf.File
}

// Presets are real models' shapes.
var Presets = map[string]Spec{
	"qwen2.5-0.5b": {Arch: "qwen2", Name: "Qwen2.5-0.5B-shape (random)", Embd: 896, Layers: 24, Heads: 14, KVHeads: 2, HeadDim: 64, FFN: 4864,
		VocabSize: 151936, ContextLen: 32768, RopeBase: 1e6, NormEps: 1e-6, Tied: true, QKVBias: true},
	"llama3.2-1b": {Arch: "llama", Name: "Llama-3.2-1B-shape (random)", Embd: 2048, Layers: 16, Heads: 32, KVHeads: 8, HeadDim: 64, FFN: 8192,
		VocabSize: 128256, ContextLen: 131072, RopeBase: 500000, NormEps: 1e-5, Tied: true, Llama3Rope: true},
	"demo": Demo,
}

// Demo is the built-in demo model: small enough to generate at start-up in
// well under a second, byte-level so any text encodes.
var Demo = Spec{Arch: "llama", Name: "tandem-demo", Embd: 128, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 384,
	ContextLen: 4096, RopeBase: 10000, NormEps: 1e-5, Type: "f32", Seed: 42, TextOnly: true}

// llama.cpp's general.file_type numbers.
var fileTypes = map[string]uint32{
	"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
	"q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18, "bf16": 32, "q4_k": 14, "q5_k": 16,
	"q2_k": 10, "q3_k": 11, // as Q2_K and Q3_K_S
}

// FileTypes lists the accepted Type names.
func FileTypes() []string {
	return []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_s", "q4_k_m", "q5_k_m"}
}

// Build returns a GGUF writer holding the generated model. Its config keys and tensors, their
// names and shapes, are its architecture's (model.LookupArch), as the loader reads them back.
func Build(s Spec) (*gguf.Writer, error) {
	ftype, ok := fileTypes[strings.ToLower(s.Type)]
	if !ok {
		return nil, fmt.Errorf("modelgen: unknown type %q (known: %s)", s.Type, strings.Join(FileTypes(), ", "))
	}
	arch, ok := model.LookupArch(s.Arch)
	if !ok {
		return nil, fmt.Errorf("modelgen: unknown architecture %q (known: %s)", s.Arch, strings.Join(model.Archs(), ", "))
	}
	if s.Embd <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.FFN <= 0 {
		return nil, fmt.Errorf("modelgen: incomplete shape %+v", s)
	}
	bias := s.QKVBias || arch.QKVBias == model.Required
	switch {
	case s.QKVBias && arch.QKVBias == model.Absent:
		return nil, fmt.Errorf("modelgen: %s has no q, k and v biases", s.Arch)
	case s.Tied && arch.Output == model.Required:
		return nil, fmt.Errorf("modelgen: %s does not tie its output to the embedding", s.Arch)
	case !s.Tied && arch.Output == model.Absent:
		return nil, fmt.Errorf("modelgen: %s always ties its output to the embedding", s.Arch)
	case s.Llama3Rope && arch.Tensors.RopeFreqs == "":
		return nil, fmt.Errorf("modelgen: %s has no rope frequency factors", s.Arch)
	}
	w := gguf.NewWriter()
	w.SetKV("general.architecture", s.Arch)
	w.SetKV("general.name", s.Name)
	w.SetKV("general.file_type", ftype)
	vocab, err := writeVocab(w, s)
	if err != nil {
		return nil, err
	}
	if s.VocabSize == 0 {
		s.VocabSize = vocab
	}
	if s.VocabSize < vocab {
		return nil, fmt.Errorf("modelgen: vocab size %d is smaller than the tokenizer's %d tokens", s.VocabSize, vocab)
	}
	cfg := model.Config{Arch: s.Arch, Name: s.Name, VocabSize: s.VocabSize, Embd: s.Embd, Layers: s.Layers, Heads: s.Heads,
		KVHeads: s.KVHeads, HeadDim: s.HeadDim, FFN: s.FFN, ContextLen: s.ContextLen, NormEps: s.NormEps,
		RopeBase: s.RopeBase, RopeDims: s.HeadDim}
	if err := model.WriteGGUFConfig(w, &cfg); err != nil {
		return nil, fmt.Errorf("modelgen: %w", err)
	}

	g := &gen{w: w, rng: rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15)), mix: strings.ToLower(s.Type), layers: s.Layers}
	var embdFix, residualFix, outputFix func(int, []float32)
	if s.TextOnly {
		if s.Tied || s.Vocab != nil {
			return nil, fmt.Errorf("modelgen: TextOnly needs an untied output and the byte-level vocabulary")
		}
		embdFix = func(_ int, row []float32) { row[0] = 4 }
		residualFix = func(i int, row []float32) {
			if i == 0 {
				clear(row) // nothing writes to dimension 0
			}
		}
		outputFix = func(tok int, row []float32) {
			if tok < 256 && (tok == '\n' || tok >= ' ' && tok < 127) {
				row[0] = 0
			} else {
				clear(row)
				row[0] = -30
			}
		}
	}
	for _, ts := range arch.TensorSpecs(&cfg) {
		if ts.Layer == 0 && ts.Role == model.RoleAttnNorm && s.Llama3Rope {
			// After the model's own tensors, before the layers, as llama.cpp writes it.
			f := model.Llama3Scaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalContext: 8192}.FreqFactors(s.RopeBase, s.HeadDim)
			g.raw(arch.Tensors.RopeFreqs, hal.F32, []uint64{uint64(len(f))}, f32Bytes(f))
		}
		layer := max(ts.Layer, 0)
		var std float64
		if ts.Matrix() {
			std = 1 / math.Sqrt(float64(ts.Shape[1]))
		}
		switch ts.Role {
		case model.RoleEmbedding:
			g.matrix(ts, 0.3, embdRole(s.Tied), layer, embdFix)
		case model.RoleOutput:
			if !s.Tied {
				g.matrix(ts, 1.5/math.Sqrt(float64(ts.Shape[1])), roleOutput, layer, outputFix)
			}
		case model.RoleOutputNorm, model.RoleAttnNorm, model.RoleFFNNorm:
			g.vector(ts, 1, 0.1)
		case model.RoleQNorm, model.RoleKNorm:
			if arch.QKNorm == model.Required {
				g.vector(ts, 1, 0.1)
			}
		case model.RoleQBias, model.RoleKBias, model.RoleVBias:
			if bias {
				g.vector(ts, 0, 0.2)
			}
		case model.RoleV:
			g.matrix(ts, std, roleAttnV, layer, nil)
		case model.RoleO:
			g.matrix(ts, std, roleOther, layer, residualFix)
		case model.RoleDown:
			g.matrix(ts, std, roleFFNDown, layer, residualFix)
		default: // q, k, gate, up
			g.matrix(ts, std, roleOther, layer, nil)
		}
	}
	if g.err != nil {
		return nil, g.err
	}
	return w, nil
}

// DemoGGUF returns the demo model's file bytes.
func DemoGGUF() ([]byte, error) {
	w, err := Build(Demo)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Demo chat template: ChatML, which the demo vocabulary has tokens for.
const demoChatTemplate = `{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

// writeVocab writes the tokenizer keys and returns the number of tokens.
func writeVocab(w *gguf.Writer, s Spec) (int, error) {
	if s.Vocab != nil {
		n := 0
		for _, key := range s.Vocab.Keys {
			if !strings.HasPrefix(key, "tokenizer.") {
				continue
			}
			v, _ := s.Vocab.Get(key)
			w.SetKV(key, v)
			if key == "tokenizer.ggml.tokens" {
				n = len(v.([]string))
			}
		}
		if n == 0 {
			return 0, fmt.Errorf("modelgen: vocabulary source has no tokenizer.ggml.tokens")
		}
		return n, nil
	}
	tokens := tokenizer.ByteLevelVocab()
	types := make([]int32, len(tokens))
	for i := range types {
		types[i] = 1
	}
	for _, sp := range []string{"<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"} {
		tokens = append(tokens, sp)
		types = append(types, 3)
	}
	for len(tokens) < s.VocabSize {
		tokens = append(tokens, fmt.Sprintf("[PAD%d]", len(tokens)))
		types = append(types, 5)
	}
	w.SetKV("tokenizer.ggml.model", "gpt2")
	w.SetKV("tokenizer.ggml.pre", "gpt2")
	w.SetKV("tokenizer.ggml.tokens", tokens)
	w.SetKV("tokenizer.ggml.token_type", types)
	w.SetKV("tokenizer.ggml.merges", []string{})
	w.SetKV("tokenizer.ggml.bos_token_id", uint32(256))
	w.SetKV("tokenizer.ggml.eos_token_id", uint32(257))
	w.SetKV("tokenizer.ggml.add_bos_token", true)
	w.SetKV("tokenizer.chat_template", demoChatTemplate)
	return len(tokens), nil
}

type role int

const (
	roleOther role = iota
	roleEmbd
	roleOutput
	roleAttnV
	roleFFNDown
)

func embdRole(tied bool) role {
	if tied {
		return roleOutput // llama.cpp quantizes a tied embedding as the output
	}
	return roleEmbd
}

type gen struct {
	w      *gguf.Writer
	rng    *rand.Rand
	mix    string
	layers int
	err    error
	row    []float32
}

// singleKQuants are the file types with one K-quant for every matrix but
// the output.
var singleKQuants = map[string]hal.DType{
	"q2_k": hal.Q2_K, "q3_k": hal.Q3_K, "q4_k": hal.Q4_K, "q4_k_s": hal.Q4_K, "q5_k": hal.Q5_K, "q5_k_s": hal.Q5_K,
}

// tensorType picks a matrix's type the way llama-quantize does for the
// file type: mixes give some tensors more bits, and K-quants fall back to
// 32-wide types when the row is not a multiple of 256.
func (g *gen) tensorType(r role, layer, cols int) hal.DType {
	var t hal.DType
	moreBits := layer < g.layers/8 || layer >= 7*g.layers/8 || (layer-g.layers/8)%3 == 2
	switch g.mix {
	case "q4_k_m", "q5_k_m":
		base := hal.Q4_K
		if g.mix == "q5_k_m" {
			base = hal.Q5_K
		}
		switch {
		case r == roleOutput:
			t = hal.Q6_K
		case (r == roleAttnV || r == roleFFNDown) && moreBits:
			t = hal.Q6_K
		default:
			t = base
		}
	default:
		if k, ok := singleKQuants[g.mix]; ok {
			t = k
			if r == roleOutput {
				t = hal.Q6_K // as llama-quantize keeps it for these files
			}
		} else {
			t, _ = hal.ParseDType(g.mix)
		}
	}
	if cols%t.BlockSize() != 0 {
		switch t {
		case hal.Q2_K, hal.Q3_K:
			t = hal.Q4_0 // llama.cpp takes IQ4_NL, 4.5 bits too
		case hal.Q4_K:
			t = hal.Q5_0
		case hal.Q5_K:
			t = hal.Q5_1
		case hal.Q6_K:
			t = hal.Q8_0
		}
		if cols%t.BlockSize() != 0 {
			t = hal.F16
		}
	}
	return t
}

// matrix writes the matrix ts of N(0, std²) values, each row passed
// through fix (if not nil) before it is quantized.
func (g *gen) matrix(ts model.TensorSpec, std float64, r role, layer int, fix func(row int, values []float32)) {
	if g.err != nil {
		return
	}
	name, rows, cols := ts.GGUF, ts.Shape[0], ts.Shape[1]
	t := g.tensorType(r, layer, cols)
	rb, err := t.RowBytes(cols)
	if err != nil {
		g.err = fmt.Errorf("modelgen: %s: %w", name, err)
		return
	}
	data := make([]byte, rows*rb)
	if cap(g.row) < cols {
		g.row = make([]float32, cols)
	}
	row := g.row[:cols]
	for i := 0; i < rows; i++ {
		for j := range row {
			row[j] = float32(g.rng.NormFloat64() * std)
		}
		if fix != nil {
			fix(i, row)
		}
		cpu.QuantizeRow(t, row, data[i*rb:(i+1)*rb])
	}
	g.raw(name, t, []uint64{uint64(cols), uint64(rows)}, data)
}

// vector writes the vector ts of N(mean, std²) values.
func (g *gen) vector(ts model.TensorSpec, mean, std float64) {
	v := make([]float32, ts.Shape[0])
	for i := range v {
		v[i] = float32(mean + g.rng.NormFloat64()*std)
	}
	g.raw(ts.GGUF, hal.F32, []uint64{uint64(len(v))}, f32Bytes(v))
}

func (g *gen) raw(name string, t hal.DType, dims []uint64, data []byte) {
	if g.err != nil {
		return
	}
	if err := g.w.AddTensor(name, t, dims, data); err != nil {
		g.err = fmt.Errorf("modelgen: %w", err)
	}
}

func f32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, f := range v {
		bits := math.Float32bits(f)
		out[4*i], out[4*i+1], out[4*i+2], out[4*i+3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
	}
	return out
}
