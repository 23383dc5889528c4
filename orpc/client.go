package orpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/quic-go/quic-go"
)

// Client is one QUIC connection to a peer; every call is a stream on it. It is safe for
// concurrent use. When the connection dies (peer gone, idle timeout, Close), calls in flight
// and later calls fail with Unavailable and Done is closed; dial again to reconnect.
type Client struct {
	conn *quic.Conn
	o    options
	addr string
}

// Dial connects to addr ("host:port") and exchanges HELLO. tlsConf is typically
// Identity.ClientTLS(). Errors are *Status with code Unavailable and say why (for instance
// that the peer refused our certificate).
func Dial(ctx context.Context, addr string, tlsConf *tls.Config, opts ...Option) (*Client, error) {
	o := buildOptions(opts)
	tc := tlsConf.Clone()
	if len(tc.NextProtos) == 0 {
		tc.NextProtos = []string{ALPN}
	}
	dctx, cancel := context.WithTimeout(ctx, 2*o.handshakeTimeout)
	defer cancel()
	conn, err := quic.DialAddr(dctx, addr, tc, o.quicConfig())
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxStatus(ctx)
		}
		return nil, &Status{Code: Unavailable, Message: fmt.Sprintf("dial %s: %s", addr, describeConnError(err))}
	}
	c := &Client{conn: conn, o: o, addr: addr}
	if err := c.hello(dctx); err != nil {
		conn.CloseWithError(connCodeProtocol, "HELLO failed")
		if s, ok := errors.AsType[*Status](err); ok {
			return nil, s
		}
		if cerr := context.Cause(conn.Context()); cerr != nil {
			err = errors.New(describeConnError(cerr))
		}
		return nil, &Status{Code: Unavailable, Message: fmt.Sprintf("dial %s: %v", addr, err)}
	}
	return c, nil
}

func (c *Client) hello(ctx context.Context) error {
	ctrl, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(c.o.handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctrl.SetDeadline(deadline)
	me := hello{version: Version, agent: c.o.agent}
	if _, err := ctrl.Write(appendFrame(nil, frameHello, me.encode())); err != nil {
		return err
	}
	var hdr [frameHeaderLen]byte
	f, err := readFrame(ctrl, &hdr, 0)
	if err == nil && f.typ != frameHello {
		err = malformed("expected HELLO, got frame type 0x%02x", f.typ)
	}
	var h hello
	if err == nil {
		h, err = decodeHello(f.payload)
	}
	if err != nil {
		return err
	}
	if h.version != Version {
		return &Status{Code: Unavailable, Message: fmt.Sprintf("dial %s: peer speaks ORPC version %d, we speak %d", c.addr, h.version, Version)}
	}
	ctrl.SetDeadline(time.Time{})
	go io.Copy(io.Discard, ctrl)
	return nil
}

// Close closes the connection; calls in flight fail with Unavailable.
func (c *Client) Close() error {
	return c.CloseWithReason("client closed")
}

// CloseWithReason is Close with the reason the calls in flight fail with, and the peer
// is told (if it is still there to hear it). It does not wait for the peer: the calls end
// at once however dead the peer is.
func (c *Client) CloseWithReason(reason string) error {
	if len(reason) > maxCloseReason { // it must fit in one packet
		n := maxCloseReason
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n]
	}
	return c.conn.CloseWithError(connCodeNoError, reason)
}

const maxCloseReason = 256

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.conn.Context().Done() }

// Err says why the connection ended (nil while it is up).
func (c *Client) Err() error {
	if c.conn.Context().Err() == nil {
		return nil
	}
	return &Status{Code: Unavailable, Message: describeConnError(context.Cause(c.conn.Context()))}
}

// RemoteAddr is the peer's address.
func (c *Client) RemoteAddr() net.Addr { return c.conn.RemoteAddr() }

// PeerName is the common name of the peer's certificate.
func (c *Client) PeerName() string {
	if certs := c.conn.ConnectionState().TLS.PeerCertificates; len(certs) > 0 {
		return certs[0].Subject.CommonName
	}
	return ""
}

// Call makes a unary call: req is encoded, sent to method, and the response decoded into
// resp (which may be nil to discard it). Errors are *Status.
func (c *Client) Call(ctx context.Context, method string, req Marshaler, resp Unmarshaler) error {
	b, err := c.CallBytes(ctx, method, Marshal(req))
	if err != nil {
		return err
	}
	if err := Unmarshal(b, resp); err != nil {
		return Errorf(Internal, "decoding %s response: %v", method, err)
	}
	return nil
}

// CallBytes makes a unary call with raw message bytes.
func (c *Client) CallBytes(ctx context.Context, method string, req []byte) ([]byte, error) {
	cs, err := c.open(ctx, method, req)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	resp, err := cs.Recv()
	if err == io.EOF {
		return nil, Errorf(Internal, "%s: call ended without a response (is it a streaming method?)", method)
	}
	if err != nil {
		return nil, err
	}
	if _, err := cs.Recv(); err != io.EOF {
		if err == nil {
			return nil, Errorf(Internal, "%s: more than one response to a unary call (is it a streaming method?)", method)
		}
		return nil, err
	}
	return resp, nil
}

// Stream starts a server-streaming call. Read it with Recv until io.EOF or an error; call
// Close (or cancel ctx) to abandon it early.
func (c *Client) Stream(ctx context.Context, method string, req Marshaler) (*ClientStream, error) {
	return c.open(ctx, method, Marshal(req))
}

// StreamBytes is Stream with raw request bytes.
func (c *Client) StreamBytes(ctx context.Context, method string, req []byte) (*ClientStream, error) {
	return c.open(ctx, method, req)
}

// ClientStream is the caller's end of a call.
type ClientStream struct {
	c      *Client
	ctx    context.Context
	method string
	st     *quic.Stream
	br     *bufio.Reader
	hdr    [frameHeaderLen]byte
	stop   func() bool
	reuse  []byte  // RecvMsgReusing's payload buffer
	dec    Decoder // and its decoder

	mu   sync.Mutex // guards writes on st and the fields below
	done bool
	err  error // io.EOF or the *Status the call ended with
}

func (c *Client) open(ctx context.Context, method string, req []byte) (*ClientStream, error) {
	if ctx.Err() != nil {
		return nil, ctxStatus(ctx)
	}
	if len(req) > c.o.maxFrame {
		return nil, Errorf(ResourceExhausted, "request of %d bytes exceeds the frame limit of %d", len(req), c.o.maxFrame)
	}
	r := request{method: method}
	if d, ok := ctx.Deadline(); ok {
		r.timeout = time.Until(d)
		if r.timeout <= 0 {
			return nil, &Status{Code: DeadlineExceeded, Message: "deadline exceeded"}
		}
	}
	if md, ok := ctx.Value(outgoingMDKey{}).(Metadata); ok {
		r.md = md
	}
	var e Encoder
	r.encode(&e)
	if e.Len() > maxHeaderFrame {
		return nil, Errorf(InvalidArgument, "request header of %d bytes is too large", e.Len())
	}

	st, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, c.callError(ctx, err)
	}
	cs := &ClientStream{c: c, ctx: ctx, method: method, st: st, br: bufio.NewReaderSize(st, 8<<10)}
	cs.mu.Lock()
	cs.stop = context.AfterFunc(ctx, cs.cancelFromCtx)
	buf := appendFrame(make([]byte, 0, 2*frameHeaderLen+e.Len()+min(len(req), coalesceLimit)), frameRequest, e.Bytes())
	if len(req) <= coalesceLimit {
		buf = appendFrame(buf, frameMessage, req)
		_, err = st.Write(buf)
	} else {
		buf = appendFrameHeader(buf, frameMessage, len(req))
		if _, err = st.Write(buf); err == nil {
			_, err = st.Write(req)
		}
	}
	cs.mu.Unlock()
	if err != nil {
		err = c.callError(ctx, err)
		cs.abort(err)
		return nil, err
	}
	return cs, nil
}

// cancelFromCtx tells the server the caller gave up: a CANCEL frame and the end of our send
// side, then STOP_SENDING. If a write is in progress (blocked on flow control) the stream is
// reset instead.
func (cs *ClientStream) cancelFromCtx() {
	status := ctxStatus(cs.ctx)
	code := quic.StreamErrorCode(status.Code)
	if !cs.mu.TryLock() {
		cs.st.CancelWrite(code)
		cs.st.CancelRead(code)
		return
	}
	defer cs.mu.Unlock()
	if cs.done {
		return
	}
	var e Encoder
	encodeCancel(&e, status)
	cs.st.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := cs.st.Write(appendFrame(nil, frameCancel, e.Bytes())); err != nil {
		cs.st.CancelWrite(code)
	} else {
		cs.st.Close()
	}
	cs.st.CancelRead(code)
}

// abort ends the call with err, resetting both directions of the stream.
func (cs *ClientStream) abort(err error) {
	cs.stop()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.done {
		return
	}
	cs.done = true
	cs.err = err
	code := quic.StreamErrorCode(CodeOf(err))
	cs.st.CancelWrite(code)
	cs.st.CancelRead(code)
}

// end records a clean end (END frame received) and closes our send side.
func (cs *ClientStream) end(err error) {
	cs.stop()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.done {
		return
	}
	cs.done = true
	cs.err = err
	cs.st.Close()
	// Everything we want was read; release the receive side (the FIN may still be unread).
	cs.st.CancelRead(quic.StreamErrorCode(OK))
}

// Recv returns the next message, io.EOF after a successful end, or the call's error (a
// *Status). The returned slice is the caller's.
func (cs *ClientStream) Recv() ([]byte, error) {
	return cs.recv(nil)
}

// reuseLimit bounds the payload buffer a stream keeps for RecvMsgReusing: a larger
// message gets its own.
const reuseLimit = 4 << 10

// recv is Recv reading a message into buf when it fits.
func (cs *ClientStream) recv(buf []byte) ([]byte, error) {
	cs.mu.Lock()
	if cs.done {
		err := cs.err
		cs.mu.Unlock()
		return nil, err
	}
	cs.mu.Unlock()
	f, err := readFrameInto(cs.br, &cs.hdr, cs.c.o.maxFrame, buf)
	if err == io.EOF {
		err = malformed("stream ended without END")
	}
	if err != nil {
		err = cs.c.callError(cs.ctx, err)
		cs.abort(err)
		return nil, cs.result()
	}
	switch f.typ {
	case frameMessage:
		return f.payload, nil
	case frameEnd:
		status, err := decodeEnd(f.payload)
		if err != nil {
			err = cs.c.callError(cs.ctx, err)
			cs.abort(err)
			return nil, cs.result()
		}
		if status.Code == OK {
			cs.end(io.EOF)
		} else {
			cs.end(status)
		}
		return nil, cs.result()
	default:
		err := cs.c.callError(cs.ctx, malformed("unexpected frame type 0x%02x from the server", f.typ))
		cs.abort(err)
		return nil, cs.result()
	}
}

func (cs *ClientStream) result() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.err
}

// RecvMsg is Recv decoding into m.
func (cs *ClientStream) RecvMsg(m Unmarshaler) error {
	b, err := cs.Recv()
	if err != nil {
		return err
	}
	if err := Unmarshal(b, m); err != nil {
		err = Errorf(Internal, "decoding %s message: %v", cs.method, err)
		cs.abort(err)
		return err
	}
	return nil
}

// RecvMsgReusing is RecvMsg decoding from a buffer the stream keeps from one message to
// the next, for the many small messages of a long stream (a generation's tokens): m must
// not keep the bytes Decoder.BytesField and Decoder.Rest return (strings and decoded
// slices are copies). Not safe for use concurrently with other Recv calls.
func (cs *ClientStream) RecvMsgReusing(m Unmarshaler) error {
	if cs.reuse == nil {
		cs.reuse = make([]byte, reuseLimit)
	}
	b, err := cs.recv(cs.reuse)
	if err != nil {
		return err
	}
	if m == nil {
		return nil
	}
	cs.dec = Decoder{buf: b}
	if err = m.UnmarshalORPC(&cs.dec); err == nil {
		err = cs.dec.Err()
	}
	cs.dec.buf = nil
	if err != nil {
		err = Errorf(Internal, "decoding %s message: %v", cs.method, err)
		cs.abort(err)
		return err
	}
	return nil
}

// Buffered reports whether a whole frame has arrived and not been read: the next Recv
// returns without waiting. Not safe for use concurrently with Recv.
func (cs *ClientStream) Buffered() bool {
	n := cs.br.Buffered()
	if n < frameHeaderLen {
		return false
	}
	hdr, err := cs.br.Peek(frameHeaderLen)
	if err != nil {
		return false
	}
	return uint64(n) >= frameHeaderLen+uint64(binary.BigEndian.Uint32(hdr))
}

// Close abandons the call if it has not ended (the server sees it cancelled) and releases
// the stream. It is safe to call more than once and after the end.
func (cs *ClientStream) Close() error {
	cs.abort(&Status{Code: Canceled, Message: "call closed by the client"})
	return nil
}

// callError maps a stream or connection error to the *Status the call fails with.
func (c *Client) callError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxStatus(ctx)
	}
	if s, ok := errors.AsType[*Status](err); ok {
		return s
	}
	if fe, ok := errors.AsType[*frameError](err); ok {
		if fe.tooLarge {
			return &Status{Code: ResourceExhausted, Message: fe.Error()}
		}
		return &Status{Code: Internal, Message: fe.Error()}
	}
	if c.conn.Context().Err() != nil {
		return &Status{Code: Unavailable, Message: fmt.Sprintf("connection to %s lost: %s", c.addr, describeConnError(context.Cause(c.conn.Context())))}
	}
	if se, ok := errors.AsType[*quic.StreamError](err); ok {
		if se.Remote {
			return resetStatus(se.ErrorCode, "call reset by the server")
		}
		return &Status{Code: Canceled, Message: "call canceled"}
	}
	if errors.Is(err, net.ErrClosed) {
		return &Status{Code: Unavailable, Message: fmt.Sprintf("connection to %s lost: %v", c.addr, err)}
	}
	return &Status{Code: Unavailable, Message: err.Error()}
}
