// Package safetensors reads Hugging Face safetensors weights, one file or a sharded set,
// with the tensor data mapped in place, and writes them for tests and tools.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"tandem/dtype"
)

// ErrFormat is wrapped by every error that reports malformed safetensors data
// (header, offsets, shapes, index), so callers can tell a bad file from an
// I/O failure with errors.Is.
var ErrFormat = errors.New("invalid safetensors file")

// MaxHeaderSize is the largest JSON header accepted, the reference
// implementation's limit (100 MB).
const MaxHeaderSize = 100_000_000

// NoType is the TensorInfo.Type of a tensor whose dtype has no dtype.DType
// (U8, BOOL, F8_E4M3, ...). It is not a known dtype.
const NoType = dtype.DType(math.MaxUint32)

const metadataKey = "__metadata__"

type dtypeInfo struct {
	bits int         // bits per element
	typ  dtype.DType // NoType when there is no ggml equivalent
}

// dtypes lists the reference implementation's dtype names.
var dtypes = map[string]dtypeInfo{
	"BOOL":    {8, NoType},
	"F4":      {4, NoType},
	"F6_E2M3": {6, NoType},
	"F6_E3M2": {6, NoType},
	"U8":      {8, NoType},
	"I8":      {8, dtype.I8},
	"F8_E5M2": {8, NoType},
	"F8_E4M3": {8, NoType},
	"F8_E8M0": {8, NoType},
	"I16":     {16, dtype.I16},
	"U16":     {16, NoType},
	"F16":     {16, dtype.F16},
	"BF16":    {16, dtype.BF16},
	"I32":     {32, dtype.I32},
	"U32":     {32, NoType},
	"F32":     {32, dtype.F32},
	"C64":     {64, NoType},
	"F64":     {64, dtype.F64},
	"I64":     {64, dtype.I64},
	"U64":     {64, NoType},
}

// DTypeBits returns the bits per element of a safetensors dtype name, and
// false for a name the format does not define.
func DTypeBits(dtype string) (int, bool) {
	info, ok := dtypes[dtype]
	return info.bits, ok
}

// TensorInfo describes one tensor of a file and where its bytes lie.
type TensorInfo struct {
	Name       string
	DType      string      // as in the file, e.g. "BF16"
	Type       dtype.DType // mapped from DType; NoType when there is no mapping (see Supported)
	Shape      []int64     // row-major, as in the file: Shape[len-1] is the fastest varying
	Begin, End int64       // data_offsets, relative to the start of the data section
}

// Supported reports whether the tensor's dtype maps to a dtype.DType: F32, F16,
// BF16, F64, I8, I16, I32 and I64. When false, Type is NoType.
func (t *TensorInfo) Supported() bool { return t.Type != NoType }

// NumElements is the product of the shape (1 for a scalar).
func (t *TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is one parsed safetensors file. The header is copied out; tensor data
// is not: TensorData returns slices of the (read-only) mapped file, valid
// until Close. A File is safe for concurrent reads; Close must not race them.
type File struct {
	Metadata map[string]string // "__metadata__"; nil when absent
	Tensors  []TensorInfo      // sorted by Begin

	path    string
	data    []byte // whole file; nil after Close
	dataOff int64  // start of the data section within data
	byName  map[string]int
	release func([]byte) error // unmaps; nil for Parse
}

// Open maps path and parses it. The file must be a complete, valid
// safetensors file: every byte after the header belongs to exactly one tensor.
// Truncating the file while it is open faults readers of its data.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors: %s: not a regular file", path)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors: %s: %w", path, formatErr("file is %d bytes, shorter than the 8-byte header length", size))
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("safetensors: %s: file of %d bytes does not fit in memory", path, size)
	}
	data, release, err := mapFile(fd, int(size))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f, err := parse(data)
	if err != nil {
		_ = release(data)
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f.path = path
	f.release = release
	return f, nil
}

// Parse parses a whole safetensors file held in data. The File refers to
// data, which must not change while it is used; Close is a no-op.
func Parse(data []byte) (*File, error) {
	f, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return f, nil
}

func parse(data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, formatErr("file is %d bytes, shorter than the 8-byte header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > MaxHeaderSize {
		return nil, formatErr("header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	rest := uint64(len(data) - 8)
	if n > rest {
		return nil, formatErr("header length %d exceeds the %d bytes after it", n, rest)
	}
	tensors, meta, err := parseHeader(data[8:8+n], int64(rest-n))
	if err != nil {
		return nil, err
	}
	f := &File{
		Metadata: meta,
		Tensors:  tensors,
		data:     data,
		dataOff:  int64(8 + n),
		byName:   make(map[string]int, len(tensors)),
	}
	for i := range tensors {
		f.byName[tensors[i].Name] = i
	}
	return f, nil
}

// Path is the file Open was given ("" for Parse).
func (f *File) Path() string { return f.path }

// Close unmaps the file. Slices from TensorData must not be used afterwards.
// Closing twice is harmless.
func (f *File) Close() error {
	var err error
	if f.release != nil && f.data != nil {
		err = f.release(f.data)
	}
	f.release = nil
	f.data = nil
	return err
}

// Tensor looks a tensor up by name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	if i, ok := f.index(name); ok {
		return &f.Tensors[i], true
	}
	return nil, false
}

func (f *File) index(name string) (int, bool) {
	if i, ok := f.byName[name]; ok && i < len(f.Tensors) && f.Tensors[i].Name == name {
		return i, true
	}
	// Tensors was reordered by the caller; fall back to a scan.
	for i := range f.Tensors {
		if f.Tensors[i].Name == name {
			return i, true
		}
	}
	return 0, false
}

// TensorData returns t's bytes: a read-only slice of the mapped file, valid
// until Close. It returns nil when the file is closed or t's offsets do not lie
// in this file's data section (t from another file).
func (f *File) TensorData(t *TensorInfo) []byte {
	if t == nil || f.data == nil || t.Begin < 0 || t.End < t.Begin || t.End > int64(len(f.data))-f.dataOff {
		return nil
	}
	b, e := f.dataOff+t.Begin, f.dataOff+t.End
	return f.data[b:e:e]
}

// readWhole reads the first size bytes of fd into memory: mapFile's
// fallback on systems without mmap support here.
func readWhole(fd *os.File, size int) ([]byte, func([]byte) error, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(io.NewSectionReader(fd, 0, int64(size)), data); err != nil {
		return nil, nil, err
	}
	return data, func([]byte) error { return nil }, nil
}

// formatErr builds an error that wraps ErrFormat.
func formatErr(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrFormat)...)
}

func tensorErr(name, format string, args ...any) error {
	return formatErr("tensor %q: "+format, append([]any{name}, args...)...)
}

// ParseHeader parses and checks the JSON header of a file whose data section
// (the bytes after the header) is dataLen long. It returns the tensors sorted
// by Begin and the "__metadata__" map (nil when absent). The tensors must
// cover the data section exactly, without gaps or overlaps, as the reference
// implementation requires.
func ParseHeader(header []byte, dataLen int64) ([]TensorInfo, map[string]string, error) {
	t, m, err := parseHeader(header, dataLen)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	return t, m, nil
}

func parseHeader(header []byte, dataLen int64) ([]TensorInfo, map[string]string, error) {
	if dataLen < 0 {
		return nil, nil, formatErr("negative data length %d", dataLen)
	}
	if len(header) > MaxHeaderSize {
		return nil, nil, formatErr("header length %d exceeds the %d-byte limit", len(header), MaxHeaderSize)
	}
	if len(header) == 0 || header[0] != '{' {
		return nil, nil, formatErr("header does not start with '{'")
	}
	if !utf8.Valid(header) {
		return nil, nil, formatErr("header is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	if _, err := dec.Token(); err != nil { // the '{' checked above
		return nil, nil, formatErr("header JSON: %v", err)
	}
	var (
		meta    map[string]string
		tensors []TensorInfo
		seen    = make(map[string]bool)
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, formatErr("header JSON: %v", err)
		}
		key, ok := tok.(string)
		if !ok { // cannot happen for a valid object, but never trust
			return nil, nil, formatErr("header JSON: unexpected %v", tok)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, formatErr("header JSON at %q: %v", key, err)
		}
		if seen[key] {
			return nil, nil, formatErr("header JSON: duplicate key %q", key)
		}
		seen[key] = true
		if key == metadataKey {
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, formatErr("__metadata__ is not an object of strings: %v", err)
			}
			continue
		}
		t, err := parseTensor(key, raw, dataLen)
		if err != nil {
			return nil, nil, err
		}
		tensors = append(tensors, t)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, nil, formatErr("header JSON: object not closed")
	}
	if trailing := bytes.TrimLeft(header[dec.InputOffset():], " \t\r\n"); len(trailing) != 0 {
		return nil, nil, formatErr("header JSON: %d bytes of trailing data after the object", len(trailing))
	}

	slices.SortFunc(tensors, func(a, b TensorInfo) int {
		if a.Begin != b.Begin {
			return cmpInt(a.Begin, b.Begin)
		}
		if a.End != b.End {
			return cmpInt(a.End, b.End)
		}
		return strings.Compare(a.Name, b.Name)
	})
	var pos int64
	for i := range tensors {
		t := &tensors[i]
		if t.Begin != pos {
			if i == 0 {
				return nil, nil, tensorErr(t.Name, "data_offsets [%d, %d]: the data section must start at 0", t.Begin, t.End)
			}
			p := &tensors[i-1]
			what := "leaves a gap after"
			if t.Begin < pos {
				what = "overlaps"
			}
			return nil, nil, tensorErr(t.Name, "data_offsets [%d, %d] %s tensor %q [%d, %d]", t.Begin, t.End, what, p.Name, p.Begin, p.End)
		}
		pos = t.End
	}
	if pos != dataLen {
		return nil, nil, formatErr("tensors cover %d bytes of a %d-byte data section", pos, dataLen)
	}
	return tensors, meta, nil
}

func cmpInt(a, b int64) int {
	if a < b {
		return -1
	}
	return 1
}

type rawTensor struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

func parseTensor(name string, raw json.RawMessage, dataLen int64) (TensorInfo, error) {
	// Decode field by exact key: encoding/json matches struct fields without
	// regard to case, which would accept "DTYPE".
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return TensorInfo{}, tensorErr(name, "entry is not an object")
	}
	var r rawTensor
	for _, f := range [...]struct {
		key string
		dst any
	}{{"dtype", &r.DType}, {"shape", &r.Shape}, {"data_offsets", &r.DataOffsets}} {
		v, ok := fields[f.key]
		if !ok {
			return TensorInfo{}, tensorErr(name, "missing %q", f.key)
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			return TensorInfo{}, tensorErr(name, "bad %q: %v", f.key, err)
		}
	}
	if r.DType == nil || r.Shape == nil || r.DataOffsets == nil {
		return TensorInfo{}, tensorErr(name, "dtype, shape and data_offsets must not be null")
	}
	info, ok := dtypes[*r.DType]
	if !ok {
		return TensorInfo{}, tensorErr(name, "unknown dtype %q", *r.DType)
	}
	offs := *r.DataOffsets
	if len(offs) != 2 {
		return TensorInfo{}, tensorErr(name, "data_offsets has %d elements, want 2", len(offs))
	}
	begin, end := offs[0], offs[1]
	if begin < 0 || end < begin || end > dataLen {
		return TensorInfo{}, tensorErr(name, "data_offsets [%d, %d] outside the %d-byte data section", begin, end, dataLen)
	}
	shape := *r.Shape
	size, err := byteSize(*r.DType, info.bits, shape)
	if err != nil {
		return TensorInfo{}, tensorErr(name, "%v", err)
	}
	if size != end-begin {
		return TensorInfo{}, tensorErr(name, "shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d", shape, *r.DType, size, begin, end, end-begin)
	}
	if shape == nil {
		shape = []int64{}
	}
	return TensorInfo{Name: name, DType: *r.DType, Type: info.typ, Shape: shape, Begin: begin, End: end}, nil
}

// byteSize is the bytes a tensor of the given shape takes, checking for
// negative dimensions, overflow and sub-byte types that end mid-byte.
func byteSize(dtype string, nbits int, shape []int64) (int64, error) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("shape %v overflows", shape)
		}
		n = lo
	}
	hi, lo := bits.Mul64(n, uint64(nbits))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("shape %v of %s overflows", shape, dtype)
	}
	if lo%8 != 0 {
		return 0, fmt.Errorf("shape %v of %s is not a whole number of bytes", shape, dtype)
	}
	return int64(lo / 8), nil
}
