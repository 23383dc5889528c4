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
	name, ok := f.String("general.architecture")
	if !ok {
		return Config{}, fmt.Errorf("model: GGUF has no general.architecture")
	}
	arch, ok := LookupArch(name)
	if !ok {
		return Config{}, errUnsupportedArch(name)
	}
	k := &arch.GGUFKeys
	geti := func(key string) int {
		v, _ := f.Uint(name + "." + key)
		return int(v)
	}
	getf := func(key string) float64 {
		v, _ := f.Float(name + "." + key)
		return v
	}
	c := Config{
		Arch:       name,
		Embd:       geti(k.Embd),
		Layers:     geti(k.Layers),
		Heads:      geti(k.Heads),
		KVHeads:    geti(k.KVHeads),
		FFN:        geti(k.FFN),
		ContextLen: geti(k.ContextLen),
		VocabSize:  geti(k.VocabSize),
		HeadDim:    geti(k.HeadDim),
		RopeDims:   geti(k.RopeDims),
		NormEps:    float32(getf(k.NormEps)),
		RopeBase:   getf(k.RopeBase),
		RopeNeox:   arch.GGUFNeox,
	}
	c.Name, _ = f.String("general.name")
	if pt, ok := f.Uint(name + ".pooling_type"); ok {
		c.Pooling = ggufPoolings[pt]
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Embd / c.Heads
	}
	if vd := geti(k.ValueDim); vd != 0 && vd != c.HeadDim {
		return Config{}, fmt.Errorf("model: value heads of %d values and key heads of %d: unsupported (they must be equal)", vd, c.HeadDim)
	}
	if c.RopeDims == 0 {
		c.RopeDims = c.HeadDim
	}
	if c.VocabSize == 0 {
		if ti, ok := f.Tensor(arch.Tensors.Embedding.GGUF); ok && len(ti.Dims) == 2 {
			c.VocabSize = int(ti.Dims[1])
		}
	}
	if typ, _ := f.String(name + "." + k.RopeScalingType); typ == "linear" {
		if factor := getf(k.RopeScalingFactor); factor > 0 {
			c.RopeScale = float32(1 / factor)
		}
	} else if typ != "" && typ != "none" && typ != "llama3" {
		return Config{}, fmt.Errorf("model: unsupported rope scaling %q", typ)
	}
	if ti, ok := f.Tensor(arch.Tensors.RopeFreqs); arch.Tensors.RopeFreqs != "" && ok {
		if ti.Type != hal.F32 || len(ti.Dims) != 1 {
			return Config{}, fmt.Errorf("model: %s must be a 1-D F32 tensor", arch.Tensors.RopeFreqs)
		}
		data := f.TensorData(ti)
		c.FreqFactors = make([]float32, ti.Dims[0])
		for i := range c.FreqFactors {
			c.FreqFactors[i] = f32At(data, i)
		}
	}
	return c, nil
}

// WriteGGUFConfig sets the metadata keys of c's architecture on w (after general.*, which
// are the caller's), in the order llama.cpp's converter writes them: how modelgen writes the
// config the loader reads back.
func WriteGGUFConfig(w *gguf.Writer, c *Config) error {
	arch, ok := LookupArch(c.Arch)
	if !ok {
		return errUnsupportedArch(c.Arch)
	}
	k, a := &arch.GGUFKeys, c.Arch+"."
	w.SetKV(a+k.ContextLen, uint32(c.ContextLen))
	w.SetKV(a+k.Embd, uint32(c.Embd))
	w.SetKV(a+k.Layers, uint32(c.Layers))
	w.SetKV(a+k.FFN, uint32(c.FFN))
	w.SetKV(a+k.Heads, uint32(c.Heads))
	w.SetKV(a+k.KVHeads, uint32(c.KVHeads))
	w.SetKV(a+k.HeadDim, uint32(c.HeadDim))
	w.SetKV(a+k.ValueDim, uint32(c.HeadDim))
	w.SetKV(a+k.RopeBase, float32(c.RopeBase))
	w.SetKV(a+k.RopeDims, uint32(c.RopeDims))
	w.SetKV(a+k.NormEps, c.NormEps)
	w.SetKV(a+k.VocabSize, uint32(c.VocabSize))
	if c.RopeScale > 0 {
		w.SetKV(a+k.RopeScalingType, "linear")
		w.SetKV(a+k.RopeScalingFactor, float32(1/c.RopeScale))
	}
	return nil
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
