package pipeline

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"tandem/hal"
)

// The link protocol (docs/pipeline.md): after the TLS handshake (ALPN tandem-stage/1) the
// upstream side sends frames, each a little-endian u32 length (of what follows), a u8 type
// and the payload. The first is a hello, answered by a hello reply; then steps, answered by
// results in the order the steps were sent. Steps may be sent before the earlier ones'
// results came back: that is how micro-batches keep every stage busy. KV operations (a KV
// transfer's block reads and writes, kvstore.go) travel between the steps, in the same order,
// and are answered by KV results.
const (
	frameHello      = 1
	frameHelloReply = 2
	frameStep       = 3
	frameResult     = 4
	frameKV         = 5
	frameKVResult   = 6
)

// Version is the link protocol's version, in the hello. 2: KV operations.
const Version = 2

// maxFrame bounds a frame's length, so that a corrupt or hostile length cannot make a
// stage allocate without limit: 1 GiB holds a step of 8192 tokens of a 32768-wide model.
const maxFrame = 1 << 30

var errFrame = errors.New("pipeline: malformed frame")

// A hello opens a link: the head's description of the replica, which every stage checks
// against its own before it takes a step.
type hello struct {
	Version   uint32
	Model     string // the served model name
	Shape     string // the model's shape (modelShape): architecture, layers, widths, file type
	Sizes     []int  // layers per stage, the whole split
	Index     int    // the stage the receiver must be
	BlockSize int    // KV positions per block
	Blocks    int    // KV blocks each stage allocates
	KVType    hal.DType
}

// A helloReply answers a hello: Err empty when the stages took it.
type helloReply struct {
	Err string
}

// A step is one forward step of the replica, as it travels from a stage to the next: the
// batch layout (the first stage alone reads the tokens, which do not travel) and the hidden
// states the previous stage wrote, len(Pos)×embd values.
type step struct {
	ID         uint64
	WantHidden bool   // the last stage returns the output rows' hidden states too
	Err        string // an earlier stage failed this step: the last answers it with Err
	Pos        []int32
	SeqOf      []int32
	Blocks     [][]int32
	Outputs    []int
	Hidden     []float32
}

// A result is the last stage's answer to a step: the logits of its outputs (and their
// hidden states when asked), or why it failed.
type result struct {
	ID     uint64
	Err    string
	Logits []float32
	Hidden []float32
}

// A kvOp reads or writes whole KV blocks in every stage after the head, each its layers'
// part of them, in order with the steps (kvstore.go).
type kvOp struct {
	ID     uint64
	Write  bool
	Format string // the head's KV store format: every stage's must be the same
	Err    string // an earlier stage failed the operation: the last answers it with Err
	Blocks []int32
	// Data, for a write: the parts of the stages from the receiver on, stage by stage, each
	// the stage's part of every block in order. Empty for a read.
	Data []byte
}

// A kvResult answers a kvOp: for a read, Data holds the parts of the stages from the one
// that answers back to stage 1, stage by stage, each its part of every block in order.
type kvResult struct {
	ID   uint64
	Err  string
	Data []byte
}

// encoder appends a frame to buf.
type encoder struct{ buf []byte }

func (e *encoder) begin(typ byte) { e.buf = append(e.buf[:0], 0, 0, 0, 0, typ) }
func (e *encoder) end() []byte {
	binary.LittleEndian.PutUint32(e.buf, uint32(len(e.buf)-4))
	return e.buf
}
func (e *encoder) u32(v uint32) { e.buf = binary.LittleEndian.AppendUint32(e.buf, v) }
func (e *encoder) u64(v uint64) { e.buf = binary.LittleEndian.AppendUint64(e.buf, v) }
func (e *encoder) str(s string) { e.u32(uint32(len(s))); e.buf = append(e.buf, s...) }

// putInts appends a count and the values as u32s (int32s and ints share the encoding).
func putInts[T ~int32 | ~int](e *encoder, v []T) {
	e.u32(uint32(len(v)))
	for _, x := range v {
		e.u32(uint32(x))
	}
}

func (e *encoder) f32s(v []float32) {
	e.u32(uint32(len(v)))
	e.buf = slices.Grow(e.buf, 4*len(v))
	for _, x := range v {
		e.buf = binary.LittleEndian.AppendUint32(e.buf, math.Float32bits(x))
	}
}

func (e *encoder) bytes(b []byte) { e.u32(uint32(len(b))); e.buf = append(e.buf, b...) }

func (e *encoder) kv(op *kvOp) []byte {
	e.kvFields(op)
	e.bytes(op.Data)
	return e.end()
}

// kvFields begins a KV operation's frame: every field but Data, which the caller appends.
func (e *encoder) kvFields(op *kvOp) {
	e.begin(frameKV)
	e.u64(op.ID)
	flags := uint32(0)
	if op.Write {
		flags |= 1
	}
	e.u32(flags)
	e.str(op.Format)
	e.str(op.Err)
	putInts(e, op.Blocks)
}

// kvResult encodes r with parts (when not empty) before r.Data: a middle stage's part of a
// read goes in front of the parts of the stages after it.
func (e *encoder) kvResult(r *kvResult, parts []byte) []byte {
	e.begin(frameKVResult)
	e.u64(r.ID)
	e.str(r.Err)
	e.u32(uint32(len(parts) + len(r.Data)))
	e.buf = append(append(e.buf, parts...), r.Data...)
	return e.end()
}

func (e *encoder) hello(h *hello) []byte {
	e.begin(frameHello)
	e.u32(h.Version)
	e.str(h.Model)
	e.str(h.Shape)
	putInts(e, h.Sizes)
	e.u32(uint32(h.Index))
	e.u32(uint32(h.BlockSize))
	e.u32(uint32(h.Blocks))
	e.u32(uint32(h.KVType))
	return e.end()
}

func (e *encoder) helloReply(r *helloReply) []byte {
	e.begin(frameHelloReply)
	e.str(r.Err)
	return e.end()
}

func (e *encoder) step(s *step) []byte {
	e.begin(frameStep)
	e.u64(s.ID)
	flags := uint32(0)
	if s.WantHidden {
		flags |= 1
	}
	e.u32(flags)
	e.str(s.Err)
	putInts(e, s.Pos)
	putInts(e, s.SeqOf)
	e.u32(uint32(len(s.Blocks)))
	for _, b := range s.Blocks {
		putInts(e, b)
	}
	putInts(e, s.Outputs)
	e.f32s(s.Hidden)
	return e.end()
}

func (e *encoder) result(r *result) []byte {
	e.begin(frameResult)
	e.u64(r.ID)
	e.str(r.Err)
	e.f32s(r.Logits)
	e.f32s(r.Hidden)
	return e.end()
}

// decoder reads a frame's payload; the first malformed field sets err and zeroes the rest.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		d.err = errFrame
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}
func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}
func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}
func (d *decoder) int() int { return int(d.u32()) }
func (d *decoder) str() string {
	n := d.u32()
	return string(d.take(int(n)))
}

// count reads a length of elements of size bytes each, checking that they are there.
func (d *decoder) count(size int) int {
	n := int(d.u32())
	if d.err == nil && n > len(d.b)/size {
		d.err = errFrame
		return 0
	}
	return n
}

// getInts reads what putInts wrote into dst[:0]. T's conversion from the u32 is the
// decoding: an int32 gets its bits back, an int the u32's value.
func getInts[T ~int32 | ~int](d *decoder, dst []T) []T {
	n := d.count(4)
	dst = dst[:0]
	p := d.take(4 * n)
	for i := 0; i < len(p); i += 4 {
		dst = append(dst, T(binary.LittleEndian.Uint32(p[i:])))
	}
	return dst
}

func (d *decoder) f32s(dst []float32) []float32 {
	n := d.count(4)
	dst = dst[:0]
	p := d.take(4 * n)
	dst = slices.Grow(dst, n)
	for i := 0; i < len(p); i += 4 {
		dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(p[i:])))
	}
	return dst
}

// bytes reads a length and that many bytes, aliasing the payload.
func (d *decoder) bytes() []byte {
	n := d.count(1)
	return d.take(n)
}

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = errFrame
	}
	return d.err
}

func decodeHello(p []byte) (hello, error) {
	d := decoder{b: p}
	h := hello{Version: d.u32(), Model: d.str(), Shape: d.str(), Sizes: getInts(&d, []int(nil)), Index: d.int(),
		BlockSize: d.int(), Blocks: d.int(), KVType: hal.DType(d.u32())}
	return h, d.done()
}

func decodeHelloReply(p []byte) (helloReply, error) {
	d := decoder{b: p}
	r := helloReply{Err: d.str()}
	return r, d.done()
}

// decodeStep reads a step into s, reusing its slices.
func decodeStep(p []byte, s *step) error {
	d := decoder{b: p}
	s.ID = d.u64()
	s.WantHidden = d.u32()&1 != 0
	s.Err = d.str()
	s.Pos = getInts(&d, s.Pos)
	s.SeqOf = getInts(&d, s.SeqOf)
	n := d.count(4)
	for len(s.Blocks) < n {
		s.Blocks = append(s.Blocks, nil)
	}
	s.Blocks = s.Blocks[:n]
	for i := range s.Blocks {
		s.Blocks[i] = getInts(&d, s.Blocks[i])
	}
	s.Outputs = getInts(&d, s.Outputs)
	s.Hidden = d.f32s(s.Hidden)
	return d.done()
}

// decodeResult reads a result into r, reusing its slices.
func decodeResult(p []byte, r *result) error {
	d := decoder{b: p}
	r.ID = d.u64()
	r.Err = d.str()
	r.Logits = d.f32s(r.Logits)
	r.Hidden = d.f32s(r.Hidden)
	return d.done()
}

// decodeKV reads a KV operation into op, reusing its blocks; Data aliases p.
func decodeKV(p []byte, op *kvOp) error {
	d := decoder{b: p}
	op.ID = d.u64()
	op.Write = d.u32()&1 != 0
	op.Format = d.str()
	op.Err = d.str()
	op.Blocks = getInts(&d, op.Blocks)
	op.Data = d.bytes()
	return d.done()
}

// decodeKVResult reads a KV result into r; Data aliases p.
func decodeKVResult(p []byte, r *kvResult) error {
	d := decoder{b: p}
	r.ID = d.u64()
	r.Err = d.str()
	r.Data = d.bytes()
	return d.done()
}

// writeFrame writes a frame of type typ around payload p (a relayed frame, as it came).
func writeFrame(w *bufio.Writer, typ byte, p []byte) error {
	hdr := append(binary.LittleEndian.AppendUint32(w.AvailableBuffer(), uint32(len(p)+1)), typ)
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

// readFrame reads one frame into buf (grown as needed) and returns its type and payload.
func readFrame(r *bufio.Reader, buf []byte) (typ byte, payload, grown []byte, err error) {
	hdr, err := r.Peek(5) // the reader's own bytes: a header array would escape into io.ReadFull
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, buf, err
	}
	n, typ := binary.LittleEndian.Uint32(hdr), hdr[4]
	r.Discard(5)
	if n < 1 || n > maxFrame {
		return 0, nil, buf, fmt.Errorf("%w: a frame of %d bytes", errFrame, n)
	}
	if cap(buf) < int(n-1) {
		buf = make([]byte, n-1)
	}
	buf = buf[:n-1]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, buf, err
	}
	return typ, buf, buf, nil
}
