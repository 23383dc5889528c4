package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"tandem/gguf"
	"tandem/hal"
	"tandem/tokenizer"
)

// Load opens a model from a GGUF file or a Hugging Face model directory.
func Load(path string, be hal.Backend) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if st.IsDir() {
		return LoadHF(path, be)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	m, err := FromGGUF(f, be)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	// The tensors stay mapped for the model's life; the metadata (the
	// vocabulary above all) now lives in the tokenizer and config.
	f.ReleaseMetadata()
	m.closers = append(m.closers, f)
	return m, nil
}

// FromGGUF builds a model over the tensors of an open GGUF file, which must
// stay open as long as the model is used.
func FromGGUF(f *gguf.File, be hal.Backend) (*Model, error) {
	cfg, err := configFromGGUF(f)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("model: tokenizer: %w", err)
	}
	if cfg.VocabSize == 0 {
		cfg.VocabSize = tok.VocabSize()
	}
	m, err := build(cfg, ggufSource{f}, be)
	if err != nil {
		return nil, err
	}
	if m.Tokenizer = tok; tok.VocabSize() > cfg.VocabSize {
		return nil, fmt.Errorf("model: tokenizer has %d tokens but the model only %d", tok.VocabSize(), cfg.VocabSize)
	}
	m.ChatTemplate = tok.ChatTemplate()
	return m, nil
}

func configFromGGUF(f *gguf.File) (Config, error) {
	arch, ok := f.String("general.architecture")
	if !ok {
		return Config{}, fmt.Errorf("model: GGUF has no general.architecture")
	}
	neox, ok := supportedArch[arch]
	if !ok {
		return Config{}, fmt.Errorf("model: unsupported architecture %q (supported: llama, mistral, qwen2, qwen3)", arch)
	}
	geti := func(key string) int {
		v, _ := f.Uint(arch + "." + key)
		return int(v)
	}
	getf := func(key string) float64 {
		v, _ := f.Float(arch + "." + key)
		return v
	}
	c := Config{
		Arch:       arch,
		Embd:       geti("embedding_length"),
		Layers:     geti("block_count"),
		Heads:      geti("attention.head_count"),
		KVHeads:    geti("attention.head_count_kv"),
		FFN:        geti("feed_forward_length"),
		ContextLen: geti("context_length"),
		VocabSize:  geti("vocab_size"),
		HeadDim:    geti("attention.key_length"),
		RopeDims:   geti("rope.dimension_count"),
		NormEps:    float32(getf("attention.layer_norm_rms_epsilon")),
		RopeBase:   getf("rope.freq_base"),
		RopeNeox:   neox,
		QKNorm:     arch == "qwen3",
	}
	c.Name, _ = f.String("general.name")
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Embd / c.Heads
	}
	if c.RopeDims == 0 {
		c.RopeDims = c.HeadDim
	}
	if c.VocabSize == 0 {
		if ti, ok := f.Tensor("token_embd.weight"); ok && len(ti.Dims) == 2 {
			c.VocabSize = int(ti.Dims[1])
		}
	}
	if typ, _ := f.String(arch + ".rope.scaling.type"); typ == "linear" {
		if factor := getf("rope.scaling.factor"); factor > 0 {
			c.RopeScale = float32(1 / factor)
		}
	} else if typ != "" && typ != "none" && typ != "llama3" {
		return Config{}, fmt.Errorf("model: unsupported rope scaling %q", typ)
	}
	if ti, ok := f.Tensor("rope_freqs.weight"); ok {
		if ti.Type != hal.F32 || len(ti.Dims) != 1 {
			return Config{}, fmt.Errorf("model: rope_freqs.weight must be a 1-D F32 tensor")
		}
		data := f.TensorData(ti)
		c.FreqFactors = make([]float32, ti.Dims[0])
		for i := range c.FreqFactors {
			c.FreqFactors[i] = f32At(data, i)
		}
	}
	return c, nil
}

type ggufSource struct{ f *gguf.File }

func (s ggufSource) tensor(name string) (hal.DType, []int, []byte, error) {
	ti, ok := s.f.Tensor(name)
	if !ok {
		return 0, nil, nil, errMissing
	}
	shape := make([]int, len(ti.Dims))
	for i, d := range ti.Dims {
		shape[len(ti.Dims)-1-i] = int(d)
	}
	return ti.Type, shape, s.f.TensorData(ti), nil
}

func f32At(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}
