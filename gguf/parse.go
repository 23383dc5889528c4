package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"tandem/dtype"
)

// formatErr builds an error that wraps ErrFormat.
func formatErr(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrFormat)...)
}

// Parse parses a GGUF file held in memory. The File refers to data for its
// tensor bytes, so data must not change while the File is in use.
func Parse(data []byte) (*File, error) {
	f, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	return f, nil
}

// decoder reads little-endian GGUF fields. Every read checks the bytes left
// first, so a truncated or corrupt file yields an error rather than a panic.
type decoder struct {
	b   []byte
	off int
}

func (d *decoder) left() int { return len(d.b) - d.off }

func (d *decoder) take(n int) ([]byte, error) {
	if n > d.left() {
		return nil, formatErr("unexpected end of file at offset %d: need %d bytes, %d left", d.off, n, d.left())
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p, nil
}

func (d *decoder) u32() (uint32, error) {
	p, err := d.take(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p), nil
}

func (d *decoder) u64() (uint64, error) {
	p, err := d.take(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

func (d *decoder) str() (string, error) {
	n, err := d.u64()
	if err != nil {
		return "", err
	}
	if n > uint64(d.left()) {
		return "", formatErr("string of %d bytes at offset %d exceeds the %d bytes left", n, d.off, d.left())
	}
	p, _ := d.take(int(n))
	return string(p), nil // copies, so metadata outlives the mapping
}

func parse(data []byte) (*File, error) {
	d := &decoder{b: data}
	m, err := d.take(4)
	if err != nil {
		return nil, err
	}
	if string(m) != magic {
		return nil, formatErr("bad magic %q", m)
	}
	f := &File{Alignment: defaultAlignment}
	if f.Version, err = d.u32(); err != nil {
		return nil, err
	}
	switch f.Version {
	case 2, 3: // v2 and v3 share a layout; v3 only added big-endian files, flagged by the version bytes
	default:
		if v := f.Version; v>>24 != 0 && v&0xffffff == 0 {
			return nil, formatErr("unsupported version %d (a big-endian file?)", v)
		}
		return nil, formatErr("unsupported version %d, want 2 or 3", f.Version)
	}
	nTensors, err := d.u64()
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64()
	if err != nil {
		return nil, err
	}
	// Bound the counts by the smallest encoding of each entry before sizing
	// anything from them: a KV is at least a key length, a type and one byte;
	// a tensor info at least a name length, n_dims, type and offset.
	if nKV > uint64(d.left())/13 {
		return nil, formatErr("%d metadata entries cannot fit in the %d bytes left", nKV, d.left())
	}
	f.kv = make(map[string]any, nKV)
	f.Keys = make([]string, 0, nKV)
	for i := uint64(0); i < nKV; i++ {
		key, err := d.str()
		if err != nil {
			return nil, fmt.Errorf("metadata entry %d: key: %w", i, err)
		}
		if _, dup := f.kv[key]; dup {
			return nil, fmt.Errorf("key %q: %w", key, formatErr("duplicate key"))
		}
		typ, err := d.u32()
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		v, err := d.value(typ)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		f.kv[key] = v
		f.Keys = append(f.Keys, key)
	}
	if v, ok := f.kv[alignmentKey]; ok {
		if f.Alignment, err = checkAlignment(v); err != nil {
			return nil, err
		}
	}

	if nTensors > uint64(d.left())/24 {
		return nil, formatErr("%d tensors cannot fit in the %d bytes left", nTensors, d.left())
	}
	f.Tensors = make([]TensorInfo, 0, nTensors)
	f.byName = make(map[string]int, nTensors)
	for i := uint64(0); i < nTensors; i++ {
		t, err := d.tensorInfo()
		if err != nil {
			if t.Name != "" {
				return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
			}
			return nil, fmt.Errorf("tensor %d: %w", i, err)
		}
		if _, dup := f.byName[t.Name]; dup {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, formatErr("duplicate tensor name"))
		}
		f.byName[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}

	// The data section starts at the next alignment boundary. Files without
	// tensors may end before it, so only require it when there is data.
	align := uint64(f.Alignment)
	f.dataOffset = (uint64(d.off) + align - 1) / align * align
	if len(f.Tensors) > 0 && f.dataOffset > uint64(len(data)) {
		return nil, formatErr("tensor data section at offset %d is past the end of the file (%d bytes)", f.dataOffset, len(data))
	}
	var room uint64
	if f.dataOffset <= uint64(len(data)) {
		room = uint64(len(data)) - f.dataOffset
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Offset%align != 0 {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, formatErr("offset %d is not a multiple of the alignment %d", t.Offset, align))
		}
		if t.Offset > room || uint64(t.Size) > room-t.Offset {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, formatErr("data [%d, +%d) runs past the end of the %d-byte data section", t.Offset, t.Size, room))
		}
	}
	f.data = data
	return f, nil
}

// tensorInfo reads one tensor description. On error the returned info holds
// the name if it was read, for the error's context.
func (d *decoder) tensorInfo() (TensorInfo, error) {
	var t TensorInfo
	var err error
	if t.Name, err = d.str(); err != nil {
		return t, fmt.Errorf("name: %w", err)
	}
	n, err := d.u32()
	if err != nil {
		return t, err
	}
	if n > maxDims {
		return t, formatErr("%d dims, more than the maximum %d", n, maxDims)
	}
	t.Dims = make([]uint64, n)
	for j := range t.Dims {
		if t.Dims[j], err = d.u64(); err != nil {
			return t, err
		}
	}
	typ, err := d.u32()
	if err != nil {
		return t, err
	}
	t.Type = dtype.DType(typ)
	if t.Offset, err = d.u64(); err != nil {
		return t, err
	}
	if t.Size, err = tensorSize(t.Type, t.Dims); err != nil {
		return t, err
	}
	return t, nil
}

// scalarSize is the encoded size of each fixed-size value type, and the
// minimum encoded size of the variable ones (string: its length; array: its
// element type and count). Array counts are checked against it.
var scalarSize = map[uint32]int{
	typeUint8: 1, typeInt8: 1, typeUint16: 2, typeInt16: 2,
	typeUint32: 4, typeInt32: 4, typeFloat32: 4, typeBool: 1,
	typeString: 8, typeArray: 12, typeUint64: 8, typeInt64: 8, typeFloat64: 8,
}

func (d *decoder) value(typ uint32) (any, error) {
	if typ == typeArray {
		return d.array(0)
	}
	if typ == typeString {
		return d.str()
	}
	size, ok := scalarSize[typ]
	if !ok {
		return nil, formatErr("unknown value type %d", typ)
	}
	p, err := d.take(size)
	if err != nil {
		return nil, err
	}
	return scalar(typ, p), nil
}

// scalar decodes a fixed-size value of type typ from p.
func scalar(typ uint32, p []byte) any {
	le := binary.LittleEndian
	switch typ {
	case typeUint8:
		return p[0]
	case typeInt8:
		return int8(p[0])
	case typeUint16:
		return le.Uint16(p)
	case typeInt16:
		return int16(le.Uint16(p))
	case typeUint32:
		return le.Uint32(p)
	case typeInt32:
		return int32(le.Uint32(p))
	case typeFloat32:
		return math.Float32frombits(le.Uint32(p))
	case typeBool:
		return p[0] != 0
	case typeUint64:
		return le.Uint64(p)
	case typeInt64:
		return int64(le.Uint64(p))
	case typeFloat64:
		return math.Float64frombits(le.Uint64(p))
	}
	panic("gguf: scalar: not a fixed-size type")
}

// array reads an array's element type, count and elements.
func (d *decoder) array(depth int) (any, error) {
	if depth >= maxArrayDepth {
		return nil, formatErr("arrays nested deeper than %d", maxArrayDepth)
	}
	et, err := d.u32()
	if err != nil {
		return nil, err
	}
	count, err := d.u64()
	if err != nil {
		return nil, err
	}
	size, ok := scalarSize[et]
	if !ok {
		return nil, formatErr("array of unknown value type %d", et)
	}
	if count > uint64(d.left()/size) {
		return nil, formatErr("array of %d elements of type %d cannot fit in the %d bytes left", count, et, d.left())
	}
	n := int(count)
	switch et {
	case typeString:
		s := make([]string, n)
		for i := range s {
			if s[i], err = d.str(); err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
		}
		return s, nil
	case typeArray:
		s := make([]any, n)
		for i := range s {
			if s[i], err = d.array(depth + 1); err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
		}
		return s, nil
	}
	p, _ := d.take(n * size) // fits: checked above
	le := binary.LittleEndian
	switch et {
	case typeUint8:
		return append([]uint8{}, p...), nil
	case typeInt8:
		return fixed(p, 1, func(b []byte) int8 { return int8(b[0]) }), nil
	case typeUint16:
		return fixed(p, 2, le.Uint16), nil
	case typeInt16:
		return fixed(p, 2, func(b []byte) int16 { return int16(le.Uint16(b)) }), nil
	case typeUint32:
		return fixed(p, 4, le.Uint32), nil
	case typeInt32:
		return fixed(p, 4, func(b []byte) int32 { return int32(le.Uint32(b)) }), nil
	case typeFloat32:
		return fixed(p, 4, func(b []byte) float32 { return math.Float32frombits(le.Uint32(b)) }), nil
	case typeBool:
		return fixed(p, 1, func(b []byte) bool { return b[0] != 0 }), nil
	case typeUint64:
		return fixed(p, 8, le.Uint64), nil
	case typeInt64:
		return fixed(p, 8, func(b []byte) int64 { return int64(le.Uint64(b)) }), nil
	case typeFloat64:
		return fixed(p, 8, func(b []byte) float64 { return math.Float64frombits(le.Uint64(b)) }), nil
	}
	panic("gguf: array: unhandled type")
}

// fixed decodes len(p)/size elements of a fixed-size type.
func fixed[T any](p []byte, size int, get func([]byte) T) []T {
	s := make([]T, len(p)/size)
	for i := range s {
		s[i] = get(p[i*size:])
	}
	return s
}
