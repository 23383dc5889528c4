package model

import (
	"fmt"
	"slices"
	"strings"
)

// An Arch is one model architecture: its names in GGUF and Hugging Face files, the keys of
// its config, the names and presence of its tensors, and where its forward pass departs
// from llama's. Each architecture is declared in a file of its own (arch_llama.go,
// arch_qwen2.go, …), which registers it at init; the loaders, the forward pass and modelgen
// read it from there, so adding one of llama's relatives touches that file and its tests.
// An Arch is read-only once registered.
type Arch struct {
	// Name is the architecture in GGUF files (general.architecture) and in Config.Arch.
	Name string
	// HFClasses are the entries of a Hugging Face config.json's "architectures" that load
	// as this architecture.
	HFClasses []string
	// GGUFKeys and HFKeys name the config's keys in the two formats.
	GGUFKeys GGUFKeys
	HFKeys   HFKeys
	// Tensors names the weights in the two formats.
	Tensors Tensors

	// The forward pass's differences, which the loaders turn into a Config and the tensors
	// a Layer has (a nil bias or norm is skipped).
	//
	// GGUFNeox: GGUF files of this architecture rotate NEOX-style pairs (i, i+d/2).
	// llama.cpp's converter permutes llama's q and k rows so that GGUF rotates adjacent
	// pairs, and stores qwen's as they are. Hugging Face checkpoints are never permuted:
	// they always rotate NEOX-style.
	GGUFNeox bool
	// QKVBias: biases of the q, k and v projections.
	QKVBias Presence
	// QKNorm: an RMSNorm over each head of q and of k before RoPE (qwen3).
	QKNorm Presence
	// Output: a matrix of its own for the logits; where a file has none (Optional), the
	// output is tied to the token embedding.
	Output Presence
}

// Presence says whether an architecture's files have a tensor (or group of tensors).
type Presence int

const (
	Absent   Presence = iota // never read
	Optional                 // read when a file has it
	Required                 // a file without it is refused
)

// GGUFKeys names an architecture's config in GGUF metadata: each key is under "<Name>.",
// as llama.cpp writes them.
type GGUFKeys struct {
	ContextLen, Embd, Layers, FFN, Heads, KVHeads, HeadDim, ValueDim string
	RopeBase, RopeDims, NormEps, VocabSize                           string
	RopeScalingType, RopeScalingFactor                               string
}

// HFKeys names an architecture's config in a Hugging Face config.json.
type HFKeys struct {
	Embd, Layers, Heads, KVHeads, HeadDim, FFN, VocabSize, ContextLen string
	NormEps, RopeBase, RopeScaling                                    string
}

// TensorName is a weight's name in a GGUF file and in a Hugging Face checkpoint. A layer's
// tensor has one %d in each, the layer's index.
type TensorName struct{ GGUF, HF string }

// Tensors names an architecture's weights. RopeFreqs is a GGUF file's llama3 rope scaling
// factors (a Hugging Face config computes them from rope_scaling instead).
type Tensors struct {
	Embedding, OutputNorm, Output TensorName
	RopeFreqs                     string

	AttnNorm, Q, K, V, O TensorName
	QBias, KBias, VBias  TensorName
	QNorm, KNorm         TensorName
	FFNNorm              TensorName
	Gate, Up, Down       TensorName
}

// TensorRole is what a weight is for.
type TensorRole int

const (
	RoleEmbedding TensorRole = iota
	RoleOutputNorm
	RoleOutput
	RoleAttnNorm
	RoleQ
	RoleK
	RoleV
	RoleQBias
	RoleKBias
	RoleVBias
	RoleQNorm
	RoleKNorm
	RoleO
	RoleFFNNorm
	RoleGate
	RoleUp
	RoleDown
)

// TensorSpec is one weight of a model of a given config: what it is for, its layer (-1 for
// the embedding, the output norm and the output), its names, its shape ([rows, cols] for a
// matrix, [n] for a vector) and whether a file may lack it.
type TensorSpec struct {
	Role     TensorRole
	Layer    int
	GGUF, HF string
	Shape    []int
	Optional bool
}

// Matrix reports whether the tensor is a matrix (read in place) rather than a vector
// (converted to float32).
func (t *TensorSpec) Matrix() bool { return len(t.Shape) == 2 }

// TensorSpecs lists the weights a model of config c has, in the order the loaders read them
// and modelgen writes them: the embedding, the output norm and output, then layer by layer.
func (a *Arch) TensorSpecs(c *Config) []TensorSpec {
	t := &a.Tensors
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	var out []TensorSpec
	add := func(role TensorRole, layer int, n TensorName, p Presence, shape ...int) {
		if p == Absent {
			return
		}
		gg, hf := n.GGUF, n.HF
		if layer >= 0 {
			gg, hf = fmt.Sprintf(gg, layer), fmt.Sprintf(hf, layer)
		}
		out = append(out, TensorSpec{Role: role, Layer: layer, GGUF: gg, HF: hf, Shape: shape, Optional: p == Optional})
	}
	add(RoleEmbedding, -1, t.Embedding, Required, c.VocabSize, c.Embd)
	add(RoleOutputNorm, -1, t.OutputNorm, Required, c.Embd)
	add(RoleOutput, -1, t.Output, a.Output, c.VocabSize, c.Embd)
	for i := range c.Layers {
		add(RoleAttnNorm, i, t.AttnNorm, Required, c.Embd)
		add(RoleQ, i, t.Q, Required, qDim, c.Embd)
		add(RoleK, i, t.K, Required, kvDim, c.Embd)
		add(RoleV, i, t.V, Required, kvDim, c.Embd)
		add(RoleQBias, i, t.QBias, a.QKVBias, qDim)
		add(RoleKBias, i, t.KBias, a.QKVBias, kvDim)
		add(RoleVBias, i, t.VBias, a.QKVBias, kvDim)
		add(RoleQNorm, i, t.QNorm, a.QKNorm, c.HeadDim)
		add(RoleKNorm, i, t.KNorm, a.QKNorm, c.HeadDim)
		add(RoleO, i, t.O, Required, c.Embd, qDim)
		add(RoleFFNNorm, i, t.FFNNorm, Required, c.Embd)
		add(RoleGate, i, t.Gate, Required, c.FFN, c.Embd)
		add(RoleUp, i, t.Up, Required, c.FFN, c.Embd)
		add(RoleDown, i, t.Down, Required, c.Embd, c.FFN)
	}
	return out
}

// archs is the registry: written by the architectures' init functions, read-only after.
var archs = map[string]*Arch{}

// register adds a to the registry; a second architecture of the same name, or one that
// claims another's Hugging Face class, is a programming error.
func register(a *Arch) {
	if _, dup := archs[a.Name]; dup || a.Name == "" {
		panic(fmt.Sprintf("model: architecture %q registered twice (or unnamed)", a.Name))
	}
	for _, b := range archs {
		for _, c := range a.HFClasses {
			if slices.Contains(b.HFClasses, c) {
				panic(fmt.Sprintf("model: %s and %s both claim the Hugging Face class %s", a.Name, b.Name, c))
			}
		}
	}
	archs[a.Name] = a
}

// LookupArch returns the architecture registered under name (its GGUF name).
func LookupArch(name string) (*Arch, bool) {
	a, ok := archs[name]
	return a, ok
}

// Archs lists the registered architectures' names, sorted.
func Archs() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// archForHF returns the architecture of the first class of classes that one registers.
func archForHF(classes []string) (*Arch, bool) {
	for _, c := range classes {
		for _, a := range archs {
			if slices.Contains(a.HFClasses, c) {
				return a, true
			}
		}
	}
	return nil, false
}

// hfClasses lists every registered Hugging Face class, sorted.
func hfClasses() string {
	var all []string
	for _, a := range archs {
		all = append(all, a.HFClasses...)
	}
	slices.Sort(all)
	return strings.Join(all, ", ")
}

func errUnsupportedArch(name string) error {
	return fmt.Errorf("model: unsupported architecture %q (supported: %s)", name, strings.Join(Archs(), ", "))
}
