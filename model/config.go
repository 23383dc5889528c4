// Package model holds the supported architectures (llama, mistral, qwen2, qwen3: a registry
// of them, one file each) as one forward pass over hal ops, and loads them from GGUF or HF files.
package model

import (
	"fmt"
	"math"
)

// Config is the shape and numerics of a decoder-only transformer.
type Config struct {
	Arch       string // a registered architecture (Archs): llama, mistral, qwen2, qwen3
	Name       string
	VocabSize  int
	Embd       int
	Layers     int
	Heads      int
	KVHeads    int
	HeadDim    int
	FFN        int
	ContextLen int
	NormEps    float32

	RopeBase    float64
	RopeDims    int
	RopeNeox    bool
	RopeScale   float32   // linear position scale (1/factor); 0 means none
	FreqFactors []float32 // llama3 scaling divisors, one per rotated pair

	// Pooling is how the model's metadata says to pool an embedding: "mean", "last",
	// "cls", … ("" when it says nothing): GGUF's <arch>.pooling_type, a sentence-
	// transformers directory's 1_Pooling/config.json.
	Pooling string
}

// ggufPoolings names llama.cpp's pooling types (LLAMA_POOLING_TYPE_*).
var ggufPoolings = map[uint64]string{0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}

func (c *Config) validate() error {
	if _, ok := LookupArch(c.Arch); !ok {
		return errUnsupportedArch(c.Arch)
	}
	switch {
	case c.Embd <= 0, c.Layers <= 0, c.Heads <= 0, c.FFN <= 0, c.VocabSize <= 0:
		return fmt.Errorf("model: %s: missing or invalid shape (embd %d, layers %d, heads %d, ffn %d, vocab %d)", c.Arch, c.Embd, c.Layers, c.Heads, c.FFN, c.VocabSize)
	case c.KVHeads <= 0 || c.Heads%c.KVHeads != 0:
		return fmt.Errorf("model: %d attention heads is not a multiple of %d KV heads", c.Heads, c.KVHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("model: invalid head size %d", c.HeadDim)
	case c.RopeDims <= 0 || c.RopeDims > c.HeadDim || c.RopeDims%2 != 0:
		return fmt.Errorf("model: invalid rotary dimension count %d for head size %d", c.RopeDims, c.HeadDim)
	case c.FreqFactors != nil && len(c.FreqFactors) != c.RopeDims/2:
		return fmt.Errorf("model: %d rope frequency factors, want %d", len(c.FreqFactors), c.RopeDims/2)
	case c.Layers > 1024 || c.Heads > 1024 || c.HeadDim > 4096:
		return fmt.Errorf("model: implausible shape (%d layers, %d heads, head size %d)", c.Layers, c.Heads, c.HeadDim)
	case c.RopeBase < 0 || math.IsNaN(c.RopeBase) || math.IsInf(c.RopeBase, 0):
		return fmt.Errorf("model: RoPE base (rope.freq_base, rope_theta) is %v; want a positive number", c.RopeBase)
	}
	if c.NormEps <= 0 {
		c.NormEps = 1e-5
	}
	if c.RopeBase <= 0 {
		c.RopeBase = 10000
	}
	if c.ContextLen <= 0 {
		c.ContextLen = 2048
	}
	return nil
}

// Llama3Scaling describes Llama 3.1's rope_scaling block.
type Llama3Scaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalContext                       int
}

// FreqFactors computes the per-pair frequency divisors the way the GGUF
// converter stores them in rope_freqs.weight, so HF and GGUF loads agree.
func (s Llama3Scaling) FreqFactors(base float64, dims int) []float32 {
	lowWavelen := float64(s.OriginalContext) / s.LowFreqFactor
	highWavelen := float64(s.OriginalContext) / s.HighFreqFactor
	out := make([]float32, dims/2)
	for i := range out {
		freq := 1 / math.Pow(base, float64(2*i)/float64(dims))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < highWavelen:
			out[i] = 1
		case wavelen > lowWavelen:
			out[i] = float32(s.Factor)
		default:
			smooth := (float64(s.OriginalContext)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/s.Factor + smooth))
		}
	}
	return out
}
