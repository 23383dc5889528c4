package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"tandem/hal"
	"tandem/safetensors"
	"tandem/tokenizer"
)

// hfRopeScaling is config.json's rope_scaling block.
type hfRopeScaling struct {
	RopeType                      string  `json:"rope_type"`
	Type                          string  `json:"type"`
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor"`
	HighFreqFactor                float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings"`
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
	cfg.Pooling = hfPooling(dir)
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	arch, _ := LookupArch(cfg.Arch)
	m, err := build(cfg, newHFSource(set, arch.TensorSpecs(&cfg)), be)
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
	var js map[string]json.RawMessage
	if err := json.Unmarshal(data, &js); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	var classes []string
	if raw, ok := js["architectures"]; ok {
		if err := json.Unmarshal(raw, &classes); err != nil {
			return Config{}, fmt.Errorf("model: %s: architectures: %w", path, err)
		}
	}
	arch, ok := archForHF(classes)
	if !ok {
		return Config{}, fmt.Errorf("model: %s: unsupported architecture %v (supported: %s)", path, classes, hfClasses())
	}
	k := &arch.HFKeys
	// get decodes the value of key, if there is one, into v.
	var errs []error
	get := func(key string, v any) {
		if raw, ok := js[key]; ok && key != "" && string(raw) != "null" {
			if err := json.Unmarshal(raw, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", key, err))
			}
		}
	}
	var c Config
	var eps, theta float64
	var rs *hfRopeScaling
	get(k.VocabSize, &c.VocabSize)
	get(k.Embd, &c.Embd)
	get(k.Layers, &c.Layers)
	get(k.Heads, &c.Heads)
	get(k.KVHeads, &c.KVHeads)
	get(k.HeadDim, &c.HeadDim)
	get(k.FFN, &c.FFN)
	get(k.ContextLen, &c.ContextLen)
	get(k.NormEps, &eps)
	get(k.RopeBase, &theta)
	get(k.RopeScaling, &rs)
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	// Present but nonsensical, these loaded before and became a context of 2048 and a
	// RoPE base of 10000 without a word. (A rope_theta of 0 means the default, as absent.)
	if raw, ok := js[k.ContextLen]; ok && k.ContextLen != "" && string(raw) != "null" && c.ContextLen <= 0 {
		return Config{}, fmt.Errorf("model: %s: %s is %d; want the context length, a positive number of tokens", path, k.ContextLen, c.ContextLen)
	}
	if theta < 0 || math.IsNaN(theta) || math.IsInf(theta, 0) {
		return Config{}, fmt.Errorf("model: %s: %s is %v; want a positive RoPE base (or 0 or none for the default, 10000)", path, k.RopeBase, theta)
	}
	c.Arch, c.Name = arch.Name, filepath.Base(filepath.Dir(path))
	c.NormEps, c.RopeBase = float32(eps), theta
	// Hugging Face checkpoints keep q and k unpermuted and rotate halves, whatever the
	// architecture's GGUF files do.
	c.RopeNeox = true
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
	if rs != nil {
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

// hfSource yields a Hugging Face checkpoint's tensors by the GGUF names build asks for,
// through the architecture's table of both names.
type hfSource struct {
	set    *safetensors.Set
	byGGUF map[string]string
}

func newHFSource(set *safetensors.Set, specs []TensorSpec) hfSource {
	s := hfSource{set: set, byGGUF: make(map[string]string, len(specs))}
	for _, t := range specs {
		s.byGGUF[t.GGUF] = t.HF
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

// hfPooling reads a sentence-transformers directory's pooling (1_Pooling/config.json):
// "mean", "last" or "cls", "" when there is none.
func hfPooling(dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, "1_Pooling", "config.json"))
	if err != nil {
		return ""
	}
	var pc struct {
		Mean bool `json:"pooling_mode_mean_tokens"`
		Last bool `json:"pooling_mode_lasttoken"`
		CLS  bool `json:"pooling_mode_cls_token"`
	}
	if json.Unmarshal(data, &pc) != nil {
		return ""
	}
	switch {
	case pc.Last:
		return "last"
	case pc.Mean:
		return "mean"
	case pc.CLS:
		return "cls"
	}
	return ""
}
