package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Writer collects tensors and writes them as one safetensors file: the
// header padded with spaces to a multiple of 8 bytes, then the tensors'
// bytes in the order they were added. Add keeps data without copying it.
type Writer struct {
	meta    map[string]string
	tensors []wtensor
	names   map[string]bool
	size    int64
}

type wtensor struct {
	name, dtype string
	shape       []int64
	data        []byte
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{names: make(map[string]bool)}
}

// SetMetadata sets a "__metadata__" entry.
func (w *Writer) SetMetadata(key, value string) {
	if w.meta == nil {
		w.meta = make(map[string]string)
	}
	w.meta[key] = value
}

// Add appends a tensor. It checks the dtype is known, the dimensions are not
// negative and len(data) is what shape and dtype call for.
func (w *Writer) Add(name, dtype string, shape []int64, data []byte) error {
	if name == metadataKey {
		return fmt.Errorf("safetensors: tensor name %q is reserved", name)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("safetensors: tensor name %q is not valid UTF-8", name)
	}
	if w.names[name] {
		return fmt.Errorf("safetensors: tensor %q added twice", name)
	}
	nbits, ok := DTypeBits(dtype)
	if !ok {
		return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", name, dtype)
	}
	size, err := byteSize(dtype, nbits, shape)
	if err != nil {
		return fmt.Errorf("safetensors: tensor %q: %w", name, err)
	}
	if int64(len(data)) != size {
		return fmt.Errorf("safetensors: tensor %q: shape %v of %s needs %d bytes, got %d", name, shape, dtype, size, len(data))
	}
	if w.size+size < w.size {
		return fmt.Errorf("safetensors: tensor %q: total size overflows", name)
	}
	w.names[name] = true
	w.size += size
	w.tensors = append(w.tensors, wtensor{name, dtype, slices.Clone(shape), data})
	return nil
}

// DataSize is the total bytes of the tensors added so far.
func (w *Writer) DataSize() int64 { return w.size }

// header builds the JSON header, padded with spaces to a multiple of 8.
func (w *Writer) header() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			b.WriteByte(',')
		}
		first = false
	}
	if w.meta != nil {
		for k, v := range w.meta {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, fmt.Errorf("safetensors: metadata %q: not valid UTF-8", k)
			}
		}
		sep()
		b.WriteString(`"__metadata__":`)
		m, err := marshal(w.meta) // map keys come out sorted
		if err != nil {
			return nil, err
		}
		b.Write(m)
	}
	var off int64
	for _, t := range w.tensors {
		sep()
		name, err := marshal(t.name)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteString(`:{"dtype":`)
		b.WriteString(strconv.Quote(t.dtype)) // a known dtype name: plain ASCII
		b.WriteString(`,"shape":[`)
		for i, d := range t.shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		end := off + int64(len(t.data))
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	if b.Len() > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors: header of %d bytes exceeds the %d-byte limit", b.Len(), MaxHeaderSize)
	}
	return b.Bytes(), nil
}

// marshal is json.Marshal without HTML escaping and without the newline.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// WriteTo writes the whole file to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	h, err := w.header()
	if err != nil {
		return 0, err
	}
	var n int64
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(h)))
	for _, chunk := range append([][]byte{lenBuf[:], h}, w.datas()...) {
		m, err := out.Write(chunk)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (w *Writer) datas() [][]byte {
	d := make([][]byte, len(w.tensors))
	for i, t := range w.tensors {
		d[i] = t.data
	}
	return d
}

// Bytes returns the whole file.
func (w *Writer) Bytes() ([]byte, error) {
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteFile writes the file to path, through a temporary file renamed into
// place, so a failed write leaves no partial file behind.
func (w *Writer) WriteFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	bw := bufio.NewWriterSize(tmp, 1<<20)
	err = tmp.Chmod(0o644) // CreateTemp makes it 0600
	if err == nil {
		_, err = w.WriteTo(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	return nil
}

// IndexName is the file that maps tensor names to shards in a sharded set.
const IndexName = "model.safetensors.index.json"

// SingleName is the file of an unsharded set.
const SingleName = "model.safetensors"

// ShardName is the Hugging Face name of shard i (1-based) of n.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n)
}

type index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// WriteSharded writes one shard per writer, model-0000i-of-0000n.safetensors,
// and model.safetensors.index.json mapping every tensor to its shard, with
// "total_size" (bytes of tensor data) in its metadata. Tensor names must be
// unique across the writers.
func WriteSharded(dir string, ws []*Writer) error {
	if len(ws) == 0 {
		return errors.New("safetensors: WriteSharded: no shards")
	}
	idx := index{WeightMap: make(map[string]string)}
	var total int64
	for i, w := range ws {
		shard := ShardName(i+1, len(ws))
		for _, t := range w.tensors {
			if prev, dup := idx.WeightMap[t.name]; dup {
				return fmt.Errorf("safetensors: WriteSharded: tensor %q in both %s and %s", t.name, prev, shard)
			}
			idx.WeightMap[t.name] = shard
		}
		total += w.size
	}
	idx.Metadata = map[string]any{"total_size": total}
	for i, w := range ws {
		if err := w.WriteFile(filepath.Join(dir, ShardName(i+1, len(ws)))); err != nil {
			return err
		}
	}
	js, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexName), append(js, '\n'), 0o666); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}
