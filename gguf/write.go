package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"

	"tandem/dtype"
)

// Writer builds a GGUF v3 file from metadata and tensors held in memory.
// The zero value is not usable; call NewWriter.
type Writer struct {
	keys    []string
	kv      map[string]any
	tensors []TensorInfo
	data    [][]byte
	names   map[string]bool
	err     error // first SetKV error, reported by WriteTo
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{kv: map[string]any{}, names: map[string]bool{}}
}

// SetKV sets a metadata value, keeping the order keys were first set in and
// replacing an existing key's value in place. The GGUF type follows the Go
// type (see Get); an int becomes int32 if it fits, else int64, and []int
// likewise. general.alignment is stored as uint32, the type llama.cpp expects.
// Slices are retained, not copied, until WriteTo. An unsupported value makes
// WriteTo fail.
func (w *Writer) SetKV(key string, value any) {
	v, err := normalize(value, 0)
	if err == nil && key == alignmentKey {
		var a int
		if a, err = checkAlignment(v); err == nil {
			v = uint32(a)
		}
	}
	if err != nil {
		if w.err == nil {
			w.err = fmt.Errorf("gguf: key %q: %w", key, err)
		}
		return
	}
	if _, ok := w.kv[key]; !ok {
		w.keys = append(w.keys, key)
	}
	w.kv[key] = v
}

// AddTensor adds a tensor. data must hold exactly the bytes dims and typ
// call for; it is retained, not copied, until WriteTo.
func (w *Writer) AddTensor(name string, typ dtype.DType, dims []uint64, data []byte) error {
	if w.names[name] {
		return fmt.Errorf("gguf: tensor %q: duplicate tensor name", name)
	}
	size, err := tensorSize(typ, dims)
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	if int64(len(data)) != size {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, want %d for %v %v", name, len(data), size, typ, dims)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: typ, Size: size})
	w.data = append(w.data, data)
	return nil
}

// WriteTo writes the file: header, metadata, tensor infos, then each
// tensor's data at the next alignment boundary.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.err != nil {
		return 0, w.err
	}
	align := uint64(defaultAlignment)
	if v, ok := w.kv[alignmentKey]; ok {
		align = uint64(v.(uint32)) // checked by SetKV
	}
	var off uint64
	for i := range w.tensors {
		w.tensors[i].Offset = off
		off = pad(off+uint64(w.tensors[i].Size), align)
	}

	cw := &countWriter{w: out}
	e := &encoder{w: bufio.NewWriterSize(cw, 1<<16)}
	e.bytes([]byte(magic))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.keys)))
	for _, k := range w.keys {
		e.str(k)
		e.value(w.kv[k])
	}
	for _, t := range w.tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(t.Offset)
	}
	e.zeros(pad(e.n, align) - e.n)
	for i, t := range w.tensors {
		e.bytes(w.data[i])
		e.zeros(pad(uint64(t.Size), align) - uint64(t.Size))
	}
	if e.err == nil {
		e.err = e.w.Flush()
	}
	if e.err != nil {
		return cw.n, fmt.Errorf("gguf: write: %w", e.err)
	}
	return cw.n, nil
}

// WriteFile writes the file to path, removing it again if writing fails.
func (w *Writer) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	_, err = w.WriteTo(f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("gguf: %w", cerr)
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

func pad(n, align uint64) uint64 { return (n + align - 1) / align * align }

// normalize checks that v has a supported Go type and converts the
// conveniences (int, []int) to their GGUF types.
func normalize(v any, depth int) (any, error) {
	switch x := v.(type) {
	case uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32, float64, bool, string,
		[]uint8, []int8, []uint16, []int16, []uint32, []int32, []uint64, []int64, []float32, []float64, []bool, []string:
		return v, nil
	case int:
		if x >= math.MinInt32 && x <= math.MaxInt32 {
			return int32(x), nil
		}
		return int64(x), nil
	case []int:
		if fitsInt32(x) {
			s := make([]int32, len(x))
			for i, n := range x {
				s[i] = int32(n)
			}
			return s, nil
		}
		s := make([]int64, len(x))
		for i, n := range x {
			s[i] = int64(n)
		}
		return s, nil
	case []any:
		if depth+1 >= maxArrayDepth {
			return nil, fmt.Errorf("arrays nested deeper than %d", maxArrayDepth)
		}
		s := make([]any, len(x))
		for i, el := range x {
			n, err := normalize(el, depth+1)
			if err != nil {
				return nil, err
			}
			if _, ok := elemType(n); !ok {
				return nil, fmt.Errorf("element %d of an array of arrays has type %T, want a slice", i, el)
			}
			s[i] = n
		}
		return s, nil
	}
	return nil, fmt.Errorf("unsupported value type %T", v)
}

func fitsInt32(s []int) bool {
	for _, n := range s {
		if n < math.MinInt32 || n > math.MaxInt32 {
			return false
		}
	}
	return true
}

// scalarType returns the GGUF type of a normalized scalar.
func scalarType(v any) (uint32, bool) {
	switch v.(type) {
	case uint8:
		return typeUint8, true
	case int8:
		return typeInt8, true
	case uint16:
		return typeUint16, true
	case int16:
		return typeInt16, true
	case uint32:
		return typeUint32, true
	case int32:
		return typeInt32, true
	case uint64:
		return typeUint64, true
	case int64:
		return typeInt64, true
	case float32:
		return typeFloat32, true
	case float64:
		return typeFloat64, true
	case bool:
		return typeBool, true
	case string:
		return typeString, true
	}
	return 0, false
}

// elemType returns the GGUF element type of a normalized array.
func elemType(v any) (uint32, bool) {
	switch v.(type) {
	case []uint8:
		return typeUint8, true
	case []int8:
		return typeInt8, true
	case []uint16:
		return typeUint16, true
	case []int16:
		return typeInt16, true
	case []uint32:
		return typeUint32, true
	case []int32:
		return typeInt32, true
	case []uint64:
		return typeUint64, true
	case []int64:
		return typeInt64, true
	case []float32:
		return typeFloat32, true
	case []float64:
		return typeFloat64, true
	case []bool:
		return typeBool, true
	case []string:
		return typeString, true
	case []any:
		return typeArray, true
	}
	return 0, false
}

// encoder writes little-endian fields, keeping the first error and a count
// of bytes so padding can be computed.
type encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
	buf [8]byte
}

func (e *encoder) bytes(p []byte) {
	if e.err != nil {
		return
	}
	var n int
	n, e.err = e.w.Write(p)
	e.n += uint64(n)
}

func (e *encoder) u32(v uint32) { e.bytes(binary.LittleEndian.AppendUint32(e.buf[:0], v)) }
func (e *encoder) u64(v uint64) { e.bytes(binary.LittleEndian.AppendUint64(e.buf[:0], v)) }

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err != nil {
		return
	}
	n, err := e.w.WriteString(s)
	e.n += uint64(n)
	e.err = err
}

func (e *encoder) zeros(n uint64) {
	var z [64]byte
	for n > 0 && e.err == nil {
		k := min(n, uint64(len(z)))
		e.bytes(z[:k])
		n -= k
	}
}

// value writes a normalized value with its type.
func (e *encoder) value(v any) {
	if t, ok := scalarType(v); ok {
		e.u32(t)
		e.payload(v)
		return
	}
	e.u32(typeArray)
	e.array(v)
}

// array writes a normalized array's element type, count and elements.
func (e *encoder) array(v any) {
	et, _ := elemType(v)
	e.u32(et)
	switch s := v.(type) {
	case []string:
		e.u64(uint64(len(s)))
		for _, x := range s {
			e.str(x)
		}
	case []any:
		e.u64(uint64(len(s)))
		for _, x := range s {
			e.array(x)
		}
	default:
		e.u64(uint64(binary.Size(v) / scalarSize[et]))
		e.payload(v)
	}
}

// payload writes a fixed-size scalar or slice of them, or a string.
func (e *encoder) payload(v any) {
	if s, ok := v.(string); ok {
		e.str(s)
		return
	}
	if e.err != nil {
		return
	}
	// binary.Write encodes bools as one byte 0/1, matching GGUF.
	e.err = binary.Write(e.w, binary.LittleEndian, v)
	e.n += uint64(binary.Size(v))
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
