package model

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

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
	// Stage is the pipeline stage loaded (LoadStage): its layers alone have weights, and
	// the KV layout covers them alone. The zero Stage is the whole model.
	Stage Stage
	// Split is the layers of every stage of the pipeline Stage is one of (nil: whole).
	Split []int

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
	return buildStage(cfg, src, be, StageSpec{})
}

// buildStage is build for the weights stage sp loads.
func buildStage(cfg Config, src tensorSource, be hal.Backend, sp StageSpec) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	arch, _ := LookupArch(cfg.Arch)
	m := &Model{Config: cfg, Layers: make([]Layer, cfg.Layers)}
	if sp.Count > 1 {
		stages, err := sp.Stages(cfg.Layers)
		if err != nil {
			return nil, err
		}
		m.Stage = stages[sp.Index]
		for _, st := range stages {
			m.Split = append(m.Split, st.Layers())
		}
	}
	types := map[hal.DType]bool{}
	for _, ts := range arch.TensorSpecs(&m.Config) {
		if !m.Stage.Whole() && !m.Stage.wants(ts) {
			continue
		}
		typ, shape, data, err := src.tensor(ts.GGUF)
		if errors.Is(err, errMissing) && ts.Optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("model: tensor %s: %w", ts.GGUF, err)
		}
		if !slices.Equal(shape, ts.Shape) {
			return nil, fmt.Errorf("model: tensor %s has shape %v, want %v", ts.GGUF, shape, ts.Shape)
		}
		if ts.Matrix() {
			w, err := matrix(ts, typ, data, be)
			if err != nil {
				return nil, err
			}
			types[typ] = true
			*m.matrixOf(ts) = w
		} else {
			v, err := vector(ts, typ, data, be)
			if err != nil {
				return nil, err
			}
			*m.vectorOf(ts) = v
		}
		if ts.Role != RoleEmbedding || m.Stage.First() {
			m.WeightBytes += int64(len(data))
		}
	}
	if m.Output == nil && m.Stage.Last() {
		m.Output = m.Embedding // tied
		if !m.Stage.First() {
			m.WeightBytes += int64(len(m.Embedding.Data))
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

// matrix checks a matrix's type and size; its bytes stay where they are.
func matrix(ts TensorSpec, typ hal.DType, data []byte, be hal.Backend) (*hal.Weight, error) {
	rows, cols := ts.Shape[0], ts.Shape[1]
	if !be.SupportsWeight(typ) {
		return nil, fmt.Errorf("model: tensor %s: unsupported tensor type %s", ts.GGUF, typ)
	}
	rb, err := typ.RowBytes(cols)
	if err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", ts.GGUF, err)
	}
	if len(data) != rb*rows {
		return nil, fmt.Errorf("model: tensor %s: %d bytes, want %d", ts.GGUF, len(data), rb*rows)
	}
	return &hal.Weight{Name: ts.GGUF, Type: typ, Rows: rows, Cols: cols, Data: data}, nil
}

// vector converts a vector to float32.
func vector(ts TensorSpec, typ hal.DType, data []byte, be hal.Backend) ([]float32, error) {
	n := ts.Shape[0]
	switch typ {
	case hal.F32, hal.F16, hal.BF16:
	default:
		return nil, fmt.Errorf("model: tensor %s: unsupported type %s for a vector", ts.GGUF, typ)
	}
	if rb, _ := typ.RowBytes(n); len(data) != rb {
		return nil, fmt.Errorf("model: tensor %s: %d bytes, want %d", ts.GGUF, len(data), rb)
	}
	out := make([]float32, n)
	be.Dequantize(out, typ, data)
	return out, nil
}

// matrixOf is where the matrix ts is kept.
func (m *Model) matrixOf(ts TensorSpec) **hal.Weight {
	switch ts.Role {
	case RoleEmbedding:
		return &m.Embedding
	case RoleOutput:
		return &m.Output
	}
	l := &m.Layers[ts.Layer]
	switch ts.Role {
	case RoleQ:
		return &l.Wq
	case RoleK:
		return &l.Wk
	case RoleV:
		return &l.Wv
	case RoleO:
		return &l.Wo
	case RoleGate:
		return &l.Gate
	case RoleUp:
		return &l.Up
	case RoleDown:
		return &l.Down
	}
	panic(fmt.Sprintf("model: tensor role %d is not a matrix", ts.Role))
}

// vectorOf is where the vector ts is kept.
func (m *Model) vectorOf(ts TensorSpec) *[]float32 {
	if ts.Role == RoleOutputNorm {
		return &m.OutputNorm
	}
	l := &m.Layers[ts.Layer]
	switch ts.Role {
	case RoleAttnNorm:
		return &l.AttnNorm
	case RoleQBias:
		return &l.Bq
	case RoleKBias:
		return &l.Bk
	case RoleVBias:
		return &l.Bv
	case RoleQNorm:
		return &l.QNorm
	case RoleKNorm:
		return &l.KNorm
	case RoleFFNNorm:
		return &l.FFNNorm
	}
	panic(fmt.Sprintf("model: tensor role %d is not a vector", ts.Role))
}

// RoPE is the rotary embedding the model's attention uses.
func (m *Model) RoPE() *hal.RoPE {
	c := &m.Config
	return &hal.RoPE{Dims: c.RopeDims, Base: c.RopeBase, Neox: c.RopeNeox, FreqFactors: c.FreqFactors, FreqScale: c.RopeScale}
}

// KVLayout is the KV store shape for this model (a stage's layers alone) with the given
// block count and size.
func (m *Model) KVLayout(blocks, blockSize int) hal.KVLayout {
	c := &m.Config
	lo, hi := m.layerRange()
	return hal.KVLayout{Layers: hi - lo, Blocks: blocks, BlockSize: blockSize, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: m.KVType}
}

// KVBytesPerToken is the KV memory one position takes across the model's layers (a
// stage's alone), in KVType.
func (m *Model) KVBytesPerToken() int64 {
	c := &m.Config
	lo, hi := m.layerRange()
	return int64(hi-lo) * 2 * int64(c.KVHeads*c.HeadDim) * int64(m.KVLayout(0, 0).ElemBytes())
}

func attnScale(headDim int) float32 { return float32(1 / math.Sqrt(float64(headDim))) }
