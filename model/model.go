package model

import (
	"errors"
	"fmt"
	"io"
	"math"

	"tandem/hal"
	"tandem/tokenizer"
)

// Layer holds one transformer block's weights. Vectors are float32 copies;
// matrices stay in their file's format.
type Layer struct {
	AttnNorm   []float32
	Wq, Wk, Wv *hal.Weight
	Bq, Bk, Bv []float32 // nil when the architecture has no q/k/v bias
	QNorm      []float32 // per-head RMSNorm weights (qwen3), nil otherwise
	KNorm      []float32
	Wo         *hal.Weight
	FFNNorm    []float32
	Gate, Up   *hal.Weight
	Down       *hal.Weight
}

// Model is a loaded model: its config, tokenizer and weights.
type Model struct {
	Config    Config
	Tokenizer *tokenizer.Tokenizer
	// ChatTemplate is the model's own Jinja chat template, "" if it has none.
	ChatTemplate string

	Embedding  *hal.Weight
	Layers     []Layer
	OutputNorm []float32
	Output     *hal.Weight // the embedding itself when tied

	// FileType describes the weights' tensor types, e.g. "Q8_0" or "mixed".
	FileType string
	// WeightBytes is the size of the weights as stored.
	WeightBytes int64
	// KVType is the element type of the KV stores KVLayout describes: hal.F32 (the zero
	// value) or hal.F16, which halves KVBytesPerToken. A run-time choice, not the file's:
	// set it before building engines or stores.
	KVType hal.DType

	closers []io.Closer
}

// Close releases the model's mapped files.
func (m *Model) Close() error {
	var errs []error
	for _, c := range m.closers {
		errs = append(errs, c.Close())
	}
	m.closers = nil
	return errors.Join(errs...)
}

// tensorSource yields tensors by their GGUF name. shape is [rows, cols] for
// matrices and [n] for vectors. A tensor that is not there is errMissing.
type tensorSource interface {
	tensor(name string) (typ hal.DType, shape []int, data []byte, err error)
}

var errMissing = errors.New("missing tensor")

// build reads every weight of cfg's architecture from src, checking shapes
// and that be has a kernel for each matrix type.
func build(cfg Config, src tensorSource, be hal.Backend) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Model{Config: cfg}
	types := map[hal.DType]bool{}
	matrix := func(name string, rows, cols int) (*hal.Weight, error) {
		typ, shape, data, err := src.tensor(name)
		if err != nil {
			return nil, fmt.Errorf("model: tensor %s: %w", name, err)
		}
		if len(shape) != 2 || shape[0] != rows || shape[1] != cols {
			return nil, fmt.Errorf("model: tensor %s has shape %v, want [%d %d]", name, shape, rows, cols)
		}
		if !be.SupportsWeight(typ) {
			return nil, fmt.Errorf("model: tensor %s: unsupported tensor type %s", name, typ)
		}
		rb, err := typ.RowBytes(cols)
		if err != nil {
			return nil, fmt.Errorf("model: tensor %s: %w", name, err)
		}
		if len(data) != rb*rows {
			return nil, fmt.Errorf("model: tensor %s: %d bytes, want %d", name, len(data), rb*rows)
		}
		types[typ] = true
		m.WeightBytes += int64(len(data))
		return &hal.Weight{Name: name, Type: typ, Rows: rows, Cols: cols, Data: data}, nil
	}
	vector := func(name string, n int, optional bool) ([]float32, error) {
		typ, shape, data, err := src.tensor(name)
		if errors.Is(err, errMissing) && optional {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("model: tensor %s: %w", name, err)
		}
		if len(shape) != 1 || shape[0] != n {
			return nil, fmt.Errorf("model: tensor %s has shape %v, want [%d]", name, shape, n)
		}
		switch typ {
		case hal.F32, hal.F16, hal.BF16:
		default:
			return nil, fmt.Errorf("model: tensor %s: unsupported type %s for a vector", name, typ)
		}
		if rb, _ := typ.RowBytes(n); len(data) != rb {
			return nil, fmt.Errorf("model: tensor %s: %d bytes, want %d", name, len(data), rb)
		}
		m.WeightBytes += int64(len(data))
		out := make([]float32, n)
		be.Dequantize(out, typ, data)
		return out, nil
	}

	c := &m.Config
	var err error
	if m.Embedding, err = matrix("token_embd.weight", c.VocabSize, c.Embd); err != nil {
		return nil, err
	}
	if m.OutputNorm, err = vector("output_norm.weight", c.Embd, false); err != nil {
		return nil, err
	}
	if _, _, _, err := src.tensor("output.weight"); !errors.Is(err, errMissing) {
		if m.Output, err = matrix("output.weight", c.VocabSize, c.Embd); err != nil {
			return nil, err
		}
	} else {
		m.Output = m.Embedding
	}
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	m.Layers = make([]Layer, c.Layers)
	for i := range m.Layers {
		l := &m.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		steps := []func() error{
			func() (err error) { l.AttnNorm, err = vector(p+"attn_norm.weight", c.Embd, false); return },
			func() (err error) { l.Wq, err = matrix(p+"attn_q.weight", qDim, c.Embd); return },
			func() (err error) { l.Wk, err = matrix(p+"attn_k.weight", kvDim, c.Embd); return },
			func() (err error) { l.Wv, err = matrix(p+"attn_v.weight", kvDim, c.Embd); return },
			func() (err error) { l.Bq, err = vector(p+"attn_q.bias", qDim, true); return },
			func() (err error) { l.Bk, err = vector(p+"attn_k.bias", kvDim, true); return },
			func() (err error) { l.Bv, err = vector(p+"attn_v.bias", kvDim, true); return },
			func() (err error) { l.QNorm, err = vector(p+"attn_q_norm.weight", c.HeadDim, !c.QKNorm); return },
			func() (err error) { l.KNorm, err = vector(p+"attn_k_norm.weight", c.HeadDim, !c.QKNorm); return },
			func() (err error) { l.Wo, err = matrix(p+"attn_output.weight", c.Embd, qDim); return },
			func() (err error) { l.FFNNorm, err = vector(p+"ffn_norm.weight", c.Embd, false); return },
			func() (err error) { l.Gate, err = matrix(p+"ffn_gate.weight", c.FFN, c.Embd); return },
			func() (err error) { l.Up, err = matrix(p+"ffn_up.weight", c.FFN, c.Embd); return },
			func() (err error) { l.Down, err = matrix(p+"ffn_down.weight", c.Embd, c.FFN); return },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, err
			}
		}
	}
	if len(types) == 1 {
		for t := range types {
			m.FileType = t.String()
		}
	} else {
		m.FileType = "mixed"
	}
	return m, nil
}

// RoPE is the rotary embedding the model's attention uses.
func (m *Model) RoPE() *hal.RoPE {
	c := &m.Config
	return &hal.RoPE{Dims: c.RopeDims, Base: c.RopeBase, Neox: c.RopeNeox, FreqFactors: c.FreqFactors, FreqScale: c.RopeScale}
}

// KVLayout is the KV store shape for this model with the given block count and size.
func (m *Model) KVLayout(blocks, blockSize int) hal.KVLayout {
	c := &m.Config
	return hal.KVLayout{Layers: c.Layers, Blocks: blocks, BlockSize: blockSize, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: m.KVType}
}

// KVBytesPerToken is the KV memory one position takes across all layers, in KVType.
func (m *Model) KVBytesPerToken() int64 {
	c := &m.Config
	return int64(c.Layers) * 2 * int64(c.KVHeads*c.HeadDim) * int64(m.KVLayout(0, 0).ElemBytes())
}

func attnScale(headDim int) float32 { return float32(1 / math.Sqrt(float64(headDim))) }
