package orpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Version is the ORPC wire version, sent in the HELLO frame of every connection.
const Version = 1

// ALPN protocol names. ALPNJoin connections carry only the join call (no client certificate).
const (
	ALPN     = "orpc/1"
	ALPNJoin = "orpc-join/1"
)

// DefaultMaxFrameSize bounds a frame's payload unless an Option says otherwise.
const DefaultMaxFrameSize = 16 << 20

// frameHeaderLen is the u32 payload length plus the u8 type.
const frameHeaderLen = 5

// Frame types.
const (
	frameHello   byte = 0x01
	frameRequest byte = 0x02
	frameMessage byte = 0x03
	frameEnd     byte = 0x04
	frameCancel  byte = 0x05
)

// maxHeaderFrame bounds control frames (HELLO, REQUEST, END, CANCEL), whatever the message
// frame limit is.
const maxHeaderFrame = 64 << 10

// Limits inside control frames.
const (
	maxMethodLen    = 256
	maxMetadataKeys = 64
)

// A frameError is a malformed or unexpected frame: the stream it arrived on is closed with an
// error, the connection and other streams carry on.
type frameError struct {
	msg      string
	tooLarge bool
}

func (e *frameError) Error() string { return "orpc: malformed frame: " + e.msg }

func malformed(format string, args ...any) error {
	return &frameError{msg: fmt.Sprintf(format, args...)}
}

func isFrameError(err error) bool {
	_, ok := errors.AsType[*frameError](err)
	return ok
}

// frame is one decoded frame. payload is owned by the caller.
type frame struct {
	typ     byte
	payload []byte
}

// readFrame reads one frame from r. Message frames may carry up to maxMsg bytes, others up to
// maxHeaderFrame. A clean end of stream before the first header byte is io.EOF; a stream that
// ends inside a frame is a frameError. Errors of r itself are returned unchanged.
func readFrame(r io.Reader, hdr *[frameHeaderLen]byte, maxMsg int) (frame, error) {
	return readFrameInto(r, hdr, maxMsg, nil)
}

// readFrameInto is readFrame reading the payload into buf when it fits (then the payload
// is buf's), else into a new slice.
func readFrameInto(r io.Reader, hdr *[frameHeaderLen]byte, maxMsg int, buf []byte) (frame, error) {
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF && n == 0 {
			return frame{}, io.EOF
		}
		if err == io.ErrUnexpectedEOF {
			return frame{}, malformed("stream ended inside a frame header")
		}
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	typ := hdr[4]
	limit := maxHeaderFrame
	switch typ {
	case frameMessage:
		limit = maxMsg
	case frameHello, frameRequest, frameEnd, frameCancel:
	default:
		return frame{}, malformed("unknown frame type 0x%02x", typ)
	}
	if uint64(n) > uint64(limit) {
		return frame{}, &frameError{msg: fmt.Sprintf("frame of %d bytes exceeds the limit of %d", n, limit), tooLarge: true}
	}
	var payload []byte
	if int(n) <= cap(buf) {
		payload = buf[:n]
	} else {
		payload = make([]byte, n)
	}
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return frame{}, malformed("stream ended inside a frame of %d bytes", n)
		}
		return frame{}, err
	}
	return frame{typ: typ, payload: payload}, nil
}

// appendFrame appends a frame header and payload to b.
func appendFrame(b []byte, typ byte, payload []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, typ)
	return append(b, payload...)
}

// appendFrameHeader appends only the header of a frame with a payload of n bytes.
func appendFrameHeader(b []byte, typ byte, n int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, typ)
}

// Metadata is a call's string key/value metadata, sent in the REQUEST frame.
type Metadata map[string]string

func encodeMetadata(e *Encoder, md Metadata) {
	e.Uvarint(uint64(len(md)))
	for k, v := range md {
		e.String(k)
		e.String(v)
	}
}

func decodeMetadata(d *Decoder) Metadata {
	n := d.Uvarint()
	if d.Err() != nil {
		return nil
	}
	if n > maxMetadataKeys || n > uint64(d.Len()/2) {
		d.Fail(malformed("%d metadata entries", n))
		return nil
	}
	if n == 0 {
		return nil
	}
	md := make(Metadata, n)
	for range n {
		k := d.String()
		v := d.String()
		if d.Err() != nil {
			return nil
		}
		md[k] = v
	}
	return md
}

// hello is the first frame each side sends on a connection's control stream.
type hello struct {
	version uint8
	agent   string
}

func (h *hello) encode() []byte {
	var e Encoder
	e.Uint8(h.version)
	e.String(h.agent)
	return e.Bytes()
}

func decodeHello(p []byte) (hello, error) {
	d := NewDecoder(p)
	h := hello{version: d.Uint8(), agent: d.String()}
	if d.Err() != nil {
		return hello{}, malformed("HELLO: %v", d.Err())
	}
	return h, nil
}

// request opens a call.
type request struct {
	method  string
	timeout time.Duration // 0: no deadline
	md      Metadata
}

func (r *request) encode(e *Encoder) {
	e.String(r.method)
	us := r.timeout.Microseconds()
	if r.timeout > 0 && us == 0 {
		us = 1
	}
	e.Uvarint(uint64(max(us, 0)))
	encodeMetadata(e, r.md)
}

func decodeRequest(p []byte) (request, error) {
	d := NewDecoder(p)
	var r request
	r.method = d.String()
	us := d.Uvarint()
	r.md = decodeMetadata(d)
	if err := d.Err(); err != nil {
		if isFrameError(err) {
			return request{}, err
		}
		return request{}, malformed("REQUEST: %v", err)
	}
	if r.method == "" || len(r.method) > maxMethodLen {
		return request{}, malformed("REQUEST: method name of %d bytes", len(r.method))
	}
	const maxTimeout = uint64(100 * 365 * 24 * time.Hour / time.Microsecond)
	r.timeout = time.Duration(min(us, maxTimeout)) * time.Microsecond
	return r, nil
}

func encodeEnd(e *Encoder, s *Status) {
	e.Uvarint(uint64(s.Code))
	e.String(s.Message)
	encodeMetadata(e, nil) // trailer metadata, reserved
}

func decodeEnd(p []byte) (*Status, error) {
	d := NewDecoder(p)
	c := d.Uvarint()
	msg := d.String()
	decodeMetadata(d)
	if err := d.Err(); err != nil {
		return nil, malformed("END: %v", err)
	}
	if c > 1<<16 {
		return nil, malformed("END: status code %d", c)
	}
	return &Status{Code: Code(c), Message: msg}, nil
}

func encodeCancel(e *Encoder, s *Status) {
	e.Uvarint(uint64(s.Code))
	e.String(s.Message)
}

func decodeCancel(p []byte) (*Status, error) {
	d := NewDecoder(p)
	c := d.Uvarint()
	msg := d.String()
	if err := d.Err(); err != nil {
		return nil, malformed("CANCEL: %v", err)
	}
	if c > 1<<16 {
		return nil, malformed("CANCEL: status code %d", c)
	}
	return &Status{Code: Code(c), Message: msg}, nil
}
