// Package gguf reads and writes GGUF, ggml's single-file weight format:
// metadata key/values, tensor descriptions, and the tensor data mapped in place.
package gguf

import (
	"errors"
	"math"
	"math/bits"

	"tandem/dtype"
)

// ErrFormat is wrapped by every error that reports malformed GGUF data, so
// callers can tell a bad file from an I/O failure with errors.Is.
var ErrFormat = errors.New("invalid GGUF file")

const (
	magic            = "GGUF"
	defaultAlignment = 32
	alignmentKey     = "general.alignment"
	maxDims          = 4  // GGML_MAX_DIMS
	maxArrayDepth    = 32 // nested arrays deeper than this are rejected rather than recursed into
	maxAlignment     = 1 << 30
)

// GGUF metadata value types, as numbered in the file.
const (
	typeUint8   uint32 = 0
	typeInt8    uint32 = 1
	typeUint16  uint32 = 2
	typeInt16   uint32 = 3
	typeUint32  uint32 = 4
	typeInt32   uint32 = 5
	typeFloat32 uint32 = 6
	typeBool    uint32 = 7
	typeString  uint32 = 8
	typeArray   uint32 = 9
	typeUint64  uint32 = 10
	typeInt64   uint32 = 11
	typeFloat64 uint32 = 12
)

// File is a parsed GGUF file. Metadata values are copied out of the file;
// tensor data is not: TensorData returns slices of the mapped bytes, which
// stay valid until Close.
type File struct {
	Version   uint32
	Alignment int          // general.alignment or 32
	Keys      []string     // metadata keys in file order
	Tensors   []TensorInfo // in file order

	kv         map[string]any
	byName     map[string]int
	data       []byte // whole file; nil after Close
	dataOffset uint64 // start of the tensor data section within data
	unmap      func() error
}

// TensorInfo describes one tensor and where its bytes lie.
type TensorInfo struct {
	Name   string
	Dims   []uint64 // ggml order: Dims[0] is the row length (fastest varying)
	Type   dtype.DType
	Offset uint64 // relative to the start of the tensor data section
	Size   int64  // bytes, computed from dims and type
}

// Elements returns the number of elements, the product of Dims (1 for a
// scalar with no dims).
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Close releases the mapping. Slices returned by TensorData must not be used
// afterwards. Close is idempotent.
func (f *File) Close() error {
	f.data = nil
	if f.unmap == nil {
		return nil
	}
	unmap := f.unmap
	f.unmap = nil
	return unmap()
}

// ReleaseMetadata drops the decoded metadata, which for a model's vocabulary
// runs to several megabytes of heap, once the caller has read what it needs.
// The tensor index and data stay; Keys is empty and every getter reports its
// key missing afterwards.
func (f *File) ReleaseMetadata() {
	f.Keys, f.kv = nil, nil
}

// Get returns the raw metadata value for key; see the package's value
// mapping (typed scalars, typed slices, []any for arrays of arrays).
func (f *File) Get(key string) (any, bool) {
	v, ok := f.kv[key]
	return v, ok
}

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	s, ok := f.kv[key].(string)
	return s, ok
}

// Uint returns a value of any integer type that is not negative.
func (f *File) Uint(key string) (uint64, bool) {
	return toUint(f.kv[key])
}

// Int returns a value of any integer type that fits in an int64.
func (f *File) Int(key string) (int64, bool) {
	switch v := f.kv[key].(type) {
	case uint64:
		if v > math.MaxInt64 {
			return 0, false
		}
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	}
	return 0, false
}

// Float returns a float32 or float64 value, or an integer converted to float64.
func (f *File) Float(key string) (float64, bool) {
	switch v := f.kv[key].(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	if i, ok := f.Int(key); ok {
		return float64(i), true
	}
	if u, ok := f.Uint(key); ok {
		return float64(u), true
	}
	return 0, false
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	b, ok := f.kv[key].(bool)
	return b, ok
}

// Strings returns an array-of-strings value.
func (f *File) Strings(key string) ([]string, bool) {
	s, ok := f.kv[key].([]string)
	return s, ok
}

// Tensor looks a tensor up by name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the bytes of t as a slice of the file, without copying.
// It returns nil after Close or for a TensorInfo whose range is not in this file.
func (f *File) TensorData(t *TensorInfo) []byte {
	if f.data == nil || t.Size < 0 {
		return nil
	}
	start := f.dataOffset + t.Offset
	end := start + uint64(t.Size)
	if start < f.dataOffset || end < start || end > uint64(len(f.data)) {
		return nil
	}
	return f.data[start:end:end]
}

func toUint(v any) (uint64, bool) {
	switch v := v.(type) {
	case uint8:
		return uint64(v), true
	case uint16:
		return uint64(v), true
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int8:
		if v < 0 {
			return 0, false
		}
		return uint64(v), true
	case int16:
		if v < 0 {
			return 0, false
		}
		return uint64(v), true
	case int32:
		if v < 0 {
			return 0, false
		}
		return uint64(v), true
	case int64:
		if v < 0 {
			return 0, false
		}
		return uint64(v), true
	}
	return 0, false
}

// tensorSize computes the byte size of a tensor, checking everything the
// dims and type can get wrong. Both the parser and the writer use it.
func tensorSize(typ dtype.DType, dims []uint64) (int64, error) {
	if !typ.Known() {
		return 0, formatErr("unknown tensor type %d", uint32(typ))
	}
	if len(dims) > maxDims {
		return 0, formatErr("%d dims, more than the maximum %d", len(dims), maxDims)
	}
	n := uint64(1)
	for _, d := range dims {
		if d > math.MaxInt64 {
			return 0, formatErr("dim %d too large", d)
		}
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, formatErr("dims %v overflow", dims)
		}
		n = lo
	}
	bs := uint64(typ.BlockSize())
	row := uint64(1)
	if len(dims) > 0 {
		row = dims[0]
	}
	if row%bs != 0 {
		return 0, formatErr("row length %d is not a multiple of the %v block size %d", row, typ, bs)
	}
	hi, lo := bits.Mul64(n/bs, uint64(typ.TypeSize()))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, formatErr("%v tensor with dims %v is too large", typ, dims)
	}
	return int64(lo), nil
}

// checkAlignment validates a general.alignment value.
func checkAlignment(v any) (int, error) {
	a, ok := toUint(v)
	if !ok {
		return 0, formatErr("%s has type %T, want an unsigned integer", alignmentKey, v)
	}
	if a == 0 || a > maxAlignment || a&(a-1) != 0 {
		return 0, formatErr("%s %d is not a power of two up to %d", alignmentKey, a, maxAlignment)
	}
	return int(a), nil
}
