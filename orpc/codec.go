package orpc

import (
	"encoding/binary"
	"errors"
	"math"
)

// A Marshaler appends its encoding to an Encoder.
type Marshaler interface {
	MarshalORPC(e *Encoder)
}

// An Unmarshaler decodes itself from a Decoder. It should return d.Err() at the end.
type Unmarshaler interface {
	UnmarshalORPC(d *Decoder) error
}

// A Message can be both encoded and decoded.
type Message interface {
	Marshaler
	Unmarshaler
}

// Marshal encodes m into a fresh byte slice.
func Marshal(m Marshaler) []byte {
	if m == nil {
		return nil
	}
	var e Encoder
	m.MarshalORPC(&e)
	return e.buf
}

// Unmarshal decodes b into m. Trailing bytes are ignored (fields are appended by newer
// versions; see docs/orpc.md).
func Unmarshal(b []byte, m Unmarshaler) error {
	if m == nil {
		return nil
	}
	d := NewDecoder(b)
	if err := m.UnmarshalORPC(d); err != nil {
		return err
	}
	return d.Err()
}

// Bytes is a Message whose encoding is the bytes themselves, for raw payloads.
type Bytes []byte

// MarshalORPC appends b unchanged.
func (b Bytes) MarshalORPC(e *Encoder) { e.buf = append(e.buf, b...) }

// UnmarshalORPC takes all remaining bytes.
func (b *Bytes) UnmarshalORPC(d *Decoder) error {
	*b = append((*b)[:0], d.Rest()...)
	return d.Err()
}

// An Encoder appends values to a byte slice. The zero value is ready to use.
//
// Integers are varints (unsigned: LEB128 as encoding/binary; signed: zigzag), fixed-width
// numbers are little-endian, bytes and strings are a uvarint length followed by the bytes,
// and slices are a uvarint count followed by the elements.
type Encoder struct {
	buf []byte
}

// NewEncoder returns an Encoder that appends to buf[:0].
func NewEncoder(buf []byte) *Encoder { return &Encoder{buf: buf[:0]} }

// Bytes returns the encoded bytes.
func (e *Encoder) Bytes() []byte { return e.buf }

// Len returns the number of encoded bytes.
func (e *Encoder) Len() int { return len(e.buf) }

// Reset empties the Encoder, keeping its buffer.
func (e *Encoder) Reset() { e.buf = e.buf[:0] }

// Uvarint appends v as an unsigned varint.
func (e *Encoder) Uvarint(v uint64) { e.buf = binary.AppendUvarint(e.buf, v) }

// Varint appends v as a zigzag varint.
func (e *Encoder) Varint(v int64) { e.buf = binary.AppendVarint(e.buf, v) }

// Uint8 appends one byte.
func (e *Encoder) Uint8(v uint8) { e.buf = append(e.buf, v) }

// Bool appends 1 or 0.
func (e *Encoder) Bool(v bool) {
	if v {
		e.buf = append(e.buf, 1)
	} else {
		e.buf = append(e.buf, 0)
	}
}

// Uint32 appends v as 4 little-endian bytes.
func (e *Encoder) Uint32(v uint32) { e.buf = binary.LittleEndian.AppendUint32(e.buf, v) }

// Uint64 appends v as 8 little-endian bytes.
func (e *Encoder) Uint64(v uint64) { e.buf = binary.LittleEndian.AppendUint64(e.buf, v) }

// Float32 appends the IEEE 754 bits of v, little-endian.
func (e *Encoder) Float32(v float32) { e.Uint32(math.Float32bits(v)) }

// Float64 appends the IEEE 754 bits of v, little-endian.
func (e *Encoder) Float64(v float64) { e.Uint64(math.Float64bits(v)) }

// BytesField appends a length-prefixed byte string.
func (e *Encoder) BytesField(b []byte) {
	e.Uvarint(uint64(len(b)))
	e.buf = append(e.buf, b...)
}

// String appends a length-prefixed string.
func (e *Encoder) String(s string) {
	e.Uvarint(uint64(len(s)))
	e.buf = append(e.buf, s...)
}

// Strings appends a count and the length-prefixed strings.
func (e *Encoder) Strings(v []string) {
	e.Uvarint(uint64(len(v)))
	for _, s := range v {
		e.String(s)
	}
}

// Int32s appends a count and zigzag varints (compact for token ids and small numbers).
func (e *Encoder) Int32s(v []int32) {
	e.Uvarint(uint64(len(v)))
	for _, x := range v {
		e.Varint(int64(x))
	}
}

// Uint32s appends a count and unsigned varints.
func (e *Encoder) Uint32s(v []uint32) {
	e.Uvarint(uint64(len(v)))
	for _, x := range v {
		e.Uvarint(uint64(x))
	}
}

// Int64s appends a count and zigzag varints.
func (e *Encoder) Int64s(v []int64) {
	e.Uvarint(uint64(len(v)))
	for _, x := range v {
		e.Varint(x)
	}
}

// FixedUint64s appends a count and 8-byte little-endian values (for hashes, which do not
// shrink as varints).
func (e *Encoder) FixedUint64s(v []uint64) {
	e.Uvarint(uint64(len(v)))
	for _, x := range v {
		e.Uint64(x)
	}
}

// Float32s appends a count and 4-byte little-endian floats.
func (e *Encoder) Float32s(v []float32) {
	e.Uvarint(uint64(len(v)))
	for _, x := range v {
		e.Float32(x)
	}
}

// BeginMessage starts a nested message written in place, without an Encoder of its own:
// write its fields, then call EndMessage with the mark returned. The result is the same as
// Message's.
func (e *Encoder) BeginMessage() (mark int) {
	e.buf = append(e.buf, 0) // its length's first byte, often its only one
	return len(e.buf)
}

// EndMessage ends the nested message begun at mark: it writes the message's length
// before it.
func (e *Encoder) EndMessage(mark int) {
	n := len(e.buf) - mark
	if n < 0x80 {
		e.buf[mark-1] = byte(n)
		return
	}
	var l [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(l[:], uint64(n))
	e.buf = append(e.buf, l[:k-1]...)
	copy(e.buf[mark-1+k:], e.buf[mark:mark+n])
	copy(e.buf[mark-1:], l[:k])
}

// Message appends m as a length-prefixed nested message.
func (e *Encoder) Message(m Marshaler) {
	var sub Encoder
	if m != nil {
		m.MarshalORPC(&sub)
	}
	e.BytesField(sub.buf)
}

// ErrShortBuffer is the Decoder's error when the input ends inside a value, or a length or
// count promises more than the remaining bytes.
var ErrShortBuffer = errors.New("orpc: codec: truncated input")

// ErrOverflow is the Decoder's error for a varint longer than 64 bits or a value that does
// not fit the requested type.
var ErrOverflow = errors.New("orpc: codec: value overflows")

// A Decoder reads values from a byte slice. Errors are sticky: after the first error every
// method returns a zero value and Err reports the error. A Decoder never panics and never
// allocates more than the input's length for a length or count it reads.
type Decoder struct {
	buf []byte
	err error
}

// NewDecoder returns a Decoder over b. It does not copy b; byte slices it returns alias b.
func NewDecoder(b []byte) *Decoder { return &Decoder{buf: b} }

// DecoderOf is NewDecoder as a value, for a decoder that lives on its caller's stack (a
// nested message's, read with BytesField).
func DecoderOf(b []byte) Decoder { return Decoder{buf: b} }

// Err returns the first error met, or nil.
func (d *Decoder) Err() error { return d.err }

// Len returns the number of bytes not yet read (0 after an error). Decoders of messages that
// gained fields use it to read optional trailing fields.
func (d *Decoder) Len() int {
	if d.err != nil {
		return 0
	}
	return len(d.buf)
}

// Fail records err (if no error was recorded yet), for message-level validation.
func (d *Decoder) Fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Rest returns all remaining bytes and consumes them.
func (d *Decoder) Rest() []byte {
	if d.err != nil {
		return nil
	}
	b := d.buf
	d.buf = nil
	return b
}

func (d *Decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.buf) {
		d.err = ErrShortBuffer
		d.buf = nil
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	return b
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		if n == 0 {
			d.err = ErrShortBuffer
		} else {
			d.err = ErrOverflow
		}
		d.buf = nil
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// Varint reads a zigzag varint.
func (d *Decoder) Varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		if n == 0 {
			d.err = ErrShortBuffer
		} else {
			d.err = ErrOverflow
		}
		d.buf = nil
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// Uint8 reads one byte.
func (d *Decoder) Uint8() uint8 {
	b := d.take(1)
	if b == nil {
		return 0
	}
	return b[0]
}

// Bool reads a byte; any non-zero value is true.
func (d *Decoder) Bool() bool { return d.Uint8() != 0 }

// Uint32 reads 4 little-endian bytes.
func (d *Decoder) Uint32() uint32 {
	b := d.take(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

// Uint64 reads 8 little-endian bytes.
func (d *Decoder) Uint64() uint64 {
	b := d.take(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// Float32 reads a little-endian IEEE 754 float32.
func (d *Decoder) Float32() float32 { return math.Float32frombits(d.Uint32()) }

// Float64 reads a little-endian IEEE 754 float64.
func (d *Decoder) Float64() float64 { return math.Float64frombits(d.Uint64()) }

// length reads a uvarint length or count and checks that at least length*minSize bytes
// remain, so a hostile count cannot make the caller allocate more than the input.
func (d *Decoder) length(minSize int) int {
	v := d.Uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(len(d.buf)/minSize) {
		d.err = ErrShortBuffer
		d.buf = nil
		return 0
	}
	return int(v)
}

// BytesField reads a length-prefixed byte string. The result aliases the input; copy it to
// keep it past the input's lifetime.
func (d *Decoder) BytesField() []byte {
	n := d.length(1)
	if d.err != nil {
		return nil
	}
	return d.take(n)
}

// String reads a length-prefixed string.
func (d *Decoder) String() string { return string(d.BytesField()) }

// Strings reads a count and that many strings.
func (d *Decoder) Strings() []string {
	n := d.length(1)
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		v = append(v, d.String())
	}
	if d.err != nil {
		return nil
	}
	return v
}

// Int32s reads a count and zigzag varints; a value outside int32 is ErrOverflow.
func (d *Decoder) Int32s() []int32 {
	n := d.length(1)
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]int32, n)
	for i := range v {
		x := d.Varint()
		if x < math.MinInt32 || x > math.MaxInt32 {
			d.Fail(ErrOverflow)
		}
		if d.err != nil {
			return nil
		}
		v[i] = int32(x)
	}
	return v
}

// Uint32s reads a count and unsigned varints; a value outside uint32 is ErrOverflow.
func (d *Decoder) Uint32s() []uint32 {
	n := d.length(1)
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		x := d.Uvarint()
		if x > math.MaxUint32 {
			d.Fail(ErrOverflow)
		}
		if d.err != nil {
			return nil
		}
		v[i] = uint32(x)
	}
	return v
}

// Int64s reads a count and zigzag varints.
func (d *Decoder) Int64s() []int64 {
	n := d.length(1)
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]int64, n)
	for i := range v {
		v[i] = d.Varint()
		if d.err != nil {
			return nil
		}
	}
	return v
}

// FixedUint64s reads a count and 8-byte little-endian values.
func (d *Decoder) FixedUint64s() []uint64 {
	n := d.length(8)
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]uint64, n)
	for i := range v {
		v[i] = d.Uint64()
	}
	return v
}

// Float32s reads a count and 4-byte little-endian floats.
func (d *Decoder) Float32s() []float32 {
	n := d.length(4)
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = d.Float32()
	}
	return v
}

// Message reads a length-prefixed nested message into m.
func (d *Decoder) Message(m Unmarshaler) {
	b := d.BytesField()
	if d.err != nil {
		return
	}
	sub := NewDecoder(b)
	if err := m.UnmarshalORPC(sub); err != nil {
		d.Fail(err)
		return
	}
	d.Fail(sub.Err())
}
