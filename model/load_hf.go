package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"tandem/hal"
	"tandem/safetensors"
	"tandem/tokenizer"
)

// hfConfig is the part of a Hugging Face config.json the supported
// architectures use.
type hfConfig struct {
	Architectures         []string `json:"architectures"`
	ModelType             string   `json:"model_type"`
	HiddenSize            int      `json:"hidden_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	IntermediateSize      int      `json:"intermediate_size"`
	VocabSize             int      `json:"vocab_size"`
	MaxPositionEmbeddings *int     `json:"max_position_embeddings"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	RopeTheta             *float64 `json:"rope_theta"`
	HeadDim               int      `json:"head_dim"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	RopeScaling           *struct {
		RopeType                      string  `json:"rope_type"`
		Type                          string  `json:"type"`
		Factor                        float64 `json:"factor"`
		LowFreqFactor                 float64 `json:"low_freq_factor"`
		HighFreqFactor                float64 `json:"high_freq_factor"`
		OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings"`
	} `json:"rope_scaling"`
}

var hfArch = map[string]string{
	"LlamaForCausalLM":   "llama",
	"MistralForCausalLM": "mistral",
	"Qwen2ForCausalLM":   "qwen2",
	"Qwen3ForCausalLM":   "qwen3",
}

// LoadHF opens a Hugging Face model directory: config.json, safetensors
// weights (single or sharded), tokenizer.json and tokenizer_config.json.
func LoadHF(dir string, be hal.Backend) (*Model, error) {
	tok, err := tokenizer.FromHF(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %s: tokenizer: %w", dir, err)
	}
	m, err := loadHFWeights(dir, be)
	if err != nil {
		return nil, err
	}
	m.Tokenizer = tok
	m.ChatTemplate = tok.ChatTemplate()
	if tok.VocabSize() > m.Config.VocabSize {
		m.Close()
		return nil, fmt.Errorf("model: %s: tokenizer has %d tokens but the model only %d", dir, tok.VocabSize(), m.Config.VocabSize)
	}
	return m, nil
}

// loadHFWeights reads config.json and the safetensors weights alone.
func loadHFWeights(dir string, be hal.Backend) (*Model, error) {
	cfg, err := readHFConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m, err := build(cfg, newHFSource(set), be)
	if err != nil {
		set.Close()
		return nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	m.closers = append(m.closers, set)
	return m, nil
}

func readHFConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("model: %w", err)
	}
	var hc hfConfig
	if err := json.Unmarshal(data, &hc); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	arch := ""
	for _, a := range hc.Architectures {
		if arch = hfArch[a]; arch != "" {
			break
		}
	}
	if arch == "" {
		return Config{}, fmt.Errorf("model: %s: unsupported architecture %v (supported: %s)", path, hc.Architectures, strings.Join(sortedKeys(hfArch), ", "))
	}
	// Present but nonsensical, these loaded before and became a context of 2048 and a
	// RoPE base of 10000 without a word. (A rope_theta of 0 means the default, as absent.)
	if p := hc.MaxPositionEmbeddings; p != nil && *p <= 0 {
		return Config{}, fmt.Errorf("model: %s: max_position_embeddings is %d; want the context length, a positive number of tokens", path, *p)
	}
	if p := hc.RopeTheta; p != nil && (*p < 0 || math.IsNaN(*p) || math.IsInf(*p, 0)) {
		return Config{}, fmt.Errorf("model: %s: rope_theta is %v; want a positive RoPE base (or 0 or none for the default, 10000)", path, *p)
	}
	c := Config{
		Arch:       arch,
		Name:       filepath.Base(filepath.Dir(path)),
		VocabSize:  hc.VocabSize,
		Embd:       hc.HiddenSize,
		Layers:     hc.NumHiddenLayers,
		Heads:      hc.NumAttentionHeads,
		KVHeads:    hc.NumKeyValueHeads,
		HeadDim:    hc.HeadDim,
		FFN:        hc.IntermediateSize,
		ContextLen: deref(hc.MaxPositionEmbeddings),
		NormEps:    float32(hc.RMSNormEps),
		RopeBase:   deref(hc.RopeTheta),
		// HF checkpoints keep q and k unpermuted and rotate halves.
		RopeNeox: true,
		QKNorm:   arch == "qwen3",
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Embd / c.Heads
	}
	c.RopeDims = c.HeadDim
	if c.RopeBase == 0 {
		c.RopeBase = 10000
	}
	if rs := hc.RopeScaling; rs != nil {
		typ := rs.RopeType
		if typ == "" {
			typ = rs.Type
		}
		switch typ {
		case "llama3":
			s := Llama3Scaling{Factor: rs.Factor, LowFreqFactor: rs.LowFreqFactor, HighFreqFactor: rs.HighFreqFactor, OriginalContext: rs.OriginalMaxPositionEmbeddings}
			if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalContext <= 0 {
				return Config{}, fmt.Errorf("model: %s: invalid llama3 rope_scaling %+v", path, *rs)
			}
			c.FreqFactors = s.FreqFactors(c.RopeBase, c.RopeDims)
		case "linear":
			if rs.Factor <= 0 {
				return Config{}, fmt.Errorf("model: %s: invalid linear rope_scaling factor %v", path, rs.Factor)
			}
			c.RopeScale = float32(1 / rs.Factor)
		case "", "default":
		default:
			return Config{}, fmt.Errorf("model: %s: unsupported rope scaling %q", path, typ)
		}
	}
	return c, nil
}

// hfToGGUF maps Hugging Face tensor names to the GGUF names build reads.
var hfToGGUF = []struct {
	re   *regexp.Regexp
	gguf string
}{
	{regexp.MustCompile(`^model\.embed_tokens\.weight$`), "token_embd.weight"},
	{regexp.MustCompile(`^model\.norm\.weight$`), "output_norm.weight"},
	{regexp.MustCompile(`^lm_head\.weight$`), "output.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.input_layernorm\.weight$`), "blk.$1.attn_norm.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)$`), "blk.$1.attn_q.$2"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)$`), "blk.$1.attn_k.$2"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)$`), "blk.$1.attn_v.$2"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$`), "blk.$1.attn_output.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.q_norm\.weight$`), "blk.$1.attn_q_norm.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.k_norm\.weight$`), "blk.$1.attn_k_norm.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.post_attention_layernorm\.weight$`), "blk.$1.ffn_norm.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.gate_proj\.weight$`), "blk.$1.ffn_gate.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.up_proj\.weight$`), "blk.$1.ffn_up.weight"},
	{regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.down_proj\.weight$`), "blk.$1.ffn_down.weight"},
}

func ggufName(hf string) (string, bool) {
	for _, m := range hfToGGUF {
		if m.re.MatchString(hf) {
			return m.re.ReplaceAllString(hf, m.gguf), true
		}
	}
	return "", false
}

type hfSource struct {
	set    *safetensors.Set
	byGGUF map[string]string
}

func newHFSource(set *safetensors.Set) hfSource {
	s := hfSource{set: set, byGGUF: map[string]string{}}
	for _, name := range set.Names() {
		if g, ok := ggufName(name); ok {
			s.byGGUF[g] = name
		}
	}
	return s
}

func (s hfSource) tensor(name string) (hal.DType, []int, []byte, error) {
	hf, ok := s.byGGUF[name]
	if !ok {
		return 0, nil, nil, errMissing
	}
	ti, data, ok := s.set.Tensor(hf)
	if !ok {
		return 0, nil, nil, errMissing
	}
	if !ti.Supported() {
		return 0, nil, nil, fmt.Errorf("%s: unsupported tensor type %s", hf, ti.DType)
	}
	shape := make([]int, len(ti.Shape))
	for i, d := range ti.Shape {
		shape[i] = int(d)
	}
	return ti.Type, shape, data, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
