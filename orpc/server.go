package orpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// UnaryFunc handles a unary call: one request message in, one response message out.
// ctx carries the caller's deadline and metadata and is cancelled when the caller cancels,
// the deadline passes or the connection dies.
type UnaryFunc func(ctx context.Context, req []byte) ([]byte, error)

// StreamFunc handles a server-streaming call: one request, any number of messages sent with
// send, then the returned error (nil for OK). send fails once the call is cancelled.
type StreamFunc func(ctx context.Context, req []byte, send func([]byte) error) error

type handler struct {
	unary  UnaryFunc
	stream StreamFunc
}

// Server serves ORPC calls on QUIC listeners. Register methods before serving.
type Server struct {
	o options

	mu      sync.RWMutex
	methods map[string]handler
	join    *joinService

	// Shutdown: new calls and connections are refused while calls (counted in active)
	// finish; then stop ends every Serve as its context's end does.
	shutting atomic.Bool
	active   callCount
	stopOnce sync.Once
	stopped  chan struct{} // closed by Shutdown when the calls are done or its deadline passed
}

// callCount counts running calls; idle's channel is closed when none runs.
type callCount struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func (c *callCount) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *callCount) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 && c.zero != nil {
		close(c.zero)
		c.zero = nil
	}
}

func (c *callCount) idle() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if c.zero == nil {
		c.zero = make(chan struct{})
	}
	return c.zero
}

// ErrServerShutdown is the status of a call made to a Server that is shutting down.
var ErrServerShutdown = &Status{Code: Unavailable, Message: "orpc: the server is shutting down"}

// Shutdown shuts the server down gracefully, in the manner of net/http.Server.Shutdown: new
// connections and new calls are refused at once (calls with ErrServerShutdown, which a
// caller may retry elsewhere), the calls running continue until they return, and then
// every Serve closes its listener and connections and returns. If ctx ends first, the
// remaining calls are cancelled (their handlers see their contexts end) and Shutdown
// returns ctx.Err() once Serve has cut them.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutting.Store(true)
	var err error
	select {
	case <-s.active.idle():
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.stopOnce.Do(func() { close(s.stopped) })
	return err
}

// NewServer returns a Server with no methods.
func NewServer(opts ...Option) *Server {
	return &Server{o: buildOptions(opts), methods: map[string]handler{}, stopped: make(chan struct{})}
}

func (s *Server) register(method string, h handler) {
	if method == "" || len(method) > maxMethodLen {
		panic("orpc: invalid method name " + fmt.Sprintf("%q", method))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.methods[method]; dup {
		panic("orpc: method registered twice: " + method)
	}
	s.methods[method] = h
}

// HandleUnary registers a unary method. It panics if the name is empty or taken.
func (s *Server) HandleUnary(method string, h UnaryFunc) { s.register(method, handler{unary: h}) }

// HandleStream registers a server-streaming method. It panics if the name is empty or taken.
func (s *Server) HandleStream(method string, h StreamFunc) { s.register(method, handler{stream: h}) }

// Unary registers a typed unary method: the request is decoded into a new Req, the response
// encoded with its MarshalORPC. A request that does not decode fails with InvalidArgument.
func Unary[Req any, PReq interface {
	*Req
	Unmarshaler
}, Resp Marshaler](s *Server, method string, h func(context.Context, PReq) (Resp, error)) {
	s.HandleUnary(method, func(ctx context.Context, b []byte) ([]byte, error) {
		req := PReq(new(Req))
		if err := Unmarshal(b, req); err != nil {
			return nil, Errorf(InvalidArgument, "decoding %s request: %v", method, err)
		}
		resp, err := h(ctx, req)
		if err != nil {
			return nil, err
		}
		return Marshal(resp), nil
	})
}

// ServerStream registers a typed server-streaming method.
func ServerStream[Req any, PReq interface {
	*Req
	Unmarshaler
}, Resp Marshaler](s *Server, method string, h func(context.Context, PReq, func(Resp) error) error) {
	s.HandleStream(method, func(ctx context.Context, b []byte, send func([]byte) error) error {
		req := PReq(new(Req))
		if err := Unmarshal(b, req); err != nil {
			return Errorf(InvalidArgument, "decoding %s request: %v", method, err)
		}
		var e Encoder
		return h(ctx, req, func(m Resp) error {
			e.Reset()
			m.MarshalORPC(&e)
			return send(e.Bytes())
		})
	})
}

// prepareTLS clones c, sets the ALPN protocols and wraps certificate verification so that
// rejected peers are logged.
func (s *Server) prepareTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	if len(c.NextProtos) == 0 {
		c.NextProtos = []string{ALPN}
	}
	s.wrapVerify(c)
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(hi)
			if err != nil || cc == nil {
				return cc, err
			}
			cc = cc.Clone()
			s.wrapVerify(cc)
			return cc, nil
		}
	}
	return c
}

func (s *Server) wrapVerify(c *tls.Config) {
	v := c.VerifyPeerCertificate
	if v == nil {
		return
	}
	c.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		err := v(raw, chains)
		if err != nil {
			s.o.logger.Warn("orpc: refused a connection", "err", err)
			if s.o.onHandshakeError != nil {
				s.o.onHandshakeError(err)
			}
		}
		return err
	}
}

// Listen opens a QUIC listener on addr ("host:port"; port 0 picks one) with the Server's
// transport settings. tlsConf is typically Identity.ServerTLS().
func (s *Server) Listen(addr string, tlsConf *tls.Config) (*quic.Listener, error) {
	return quic.ListenAddr(addr, s.prepareTLS(tlsConf), s.o.quicConfig())
}

// ListenPacket is Listen on an existing packet connection (for tests and custom sockets).
func (s *Server) ListenPacket(pc net.PacketConn, tlsConf *tls.Config) (*quic.Listener, error) {
	tr := &quic.Transport{Conn: pc}
	return tr.Listen(s.prepareTLS(tlsConf), s.o.quicConfig())
}

// ListenAndServe is Listen followed by Serve.
func (s *Server) ListenAndServe(ctx context.Context, addr string, tlsConf *tls.Config) error {
	l, err := s.Listen(addr, tlsConf)
	if err != nil {
		return err
	}
	return s.Serve(ctx, l)
}

// Serve accepts connections on l until ctx is done or l fails. When ctx is done it closes l
// and every connection it accepted, cancels the handlers and waits for them to return; it
// then returns nil. Handlers must honour their context.
func (s *Server) Serve(ctx context.Context, l *quic.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	go func() {
		select {
		case <-s.stopped: // Shutdown is done waiting: end as at ctx's end
			cancel()
		case <-ctx.Done():
		}
	}()
	var mine sync.WaitGroup
	var err error
	for {
		conn, aerr := l.Accept(ctx)
		if aerr != nil {
			if ctx.Err() == nil {
				err = aerr
			}
			break
		}
		if s.shutting.Load() {
			conn.CloseWithError(connCodeNoError, "server shutting down")
			continue
		}
		mine.Add(1)
		go func() {
			defer mine.Done()
			stop := context.AfterFunc(ctx, func() { conn.CloseWithError(connCodeNoError, "server shutting down") })
			defer stop()
			s.serveConn(conn)
		}()
	}
	l.Close()
	cancel()
	mine.Wait()
	return err
}

// serveConn runs one connection: the HELLO exchange on the control stream, then one
// goroutine per call stream, until the connection ends.
func (s *Server) serveConn(conn *quic.Conn) {
	var calls sync.WaitGroup
	defer calls.Wait()
	cs := conn.ConnectionState()
	lookup := s.lookup
	if cs.TLS.NegotiatedProtocol == ALPNJoin {
		s.mu.RLock()
		j := s.join
		s.mu.RUnlock()
		if j == nil {
			conn.CloseWithError(connCodeJoinRefused, "this server does not accept joins")
			return
		}
		lookup = j.lookup
	}
	if err := s.serverHello(conn); err != nil {
		s.o.logger.Debug("orpc: connection failed before HELLO", "peer", conn.RemoteAddr(), "err", err)
		return
	}
	peer := newPeer(conn)
	cw := &connWriter{}
	for {
		st, err := conn.AcceptStream(conn.Context())
		if err != nil {
			return
		}
		calls.Add(1)
		go func() {
			defer calls.Done()
			s.serveStream(conn, peer, cw, st, lookup)
		}()
	}
}

func (s *Server) serverHello(conn *quic.Conn) error {
	ctx, cancel := context.WithTimeout(conn.Context(), s.o.handshakeTimeout)
	defer cancel()
	ctrl, err := conn.AcceptStream(ctx)
	if err != nil {
		conn.CloseWithError(connCodeProtocol, "no HELLO")
		return err
	}
	ctrl.SetDeadline(time.Now().Add(s.o.handshakeTimeout))
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
		conn.CloseWithError(connCodeProtocol, err.Error())
		return err
	}
	me := hello{version: Version, agent: s.o.agent}
	if _, err := ctrl.Write(appendFrame(nil, frameHello, me.encode())); err != nil {
		return err
	}
	if h.version != Version {
		msg := fmt.Sprintf("unsupported ORPC version %d (this server speaks %d)", h.version, Version)
		// Give the HELLO a moment to reach the peer so it can report both versions.
		time.AfterFunc(200*time.Millisecond, func() { conn.CloseWithError(connCodeVersion, msg) })
		return errors.New(msg)
	}
	ctrl.SetDeadline(time.Time{})
	// The control stream stays open for the connection's lifetime; later versions may send
	// control frames on it. Drain it so the peer's writes never block.
	go io.Copy(io.Discard, ctrl)
	return nil
}

func (s *Server) lookup(method string) (handler, bool) {
	s.mu.RLock()
	h, ok := s.methods[method]
	s.mu.RUnlock()
	return h, ok
}

// streamWriter serialises writes of frames on a call's send side.
type streamWriter struct {
	mu   sync.Mutex
	st   *quic.Stream
	buf  []byte
	done bool

	// Small messages wait in pending for the connection's writer (coalesce.go).
	cw      *connWriter // nil: every message is written at once
	pending []byte
	direct  bool  // the leader's write for this call timed out: it writes its own
	err     error // the leader's write for this call failed
}

const coalesceLimit = 64 << 10

func (w *streamWriter) writeLocked(typ byte, payload []byte) error {
	if len(payload) <= coalesceLimit {
		w.buf = appendFrame(w.buf[:0], typ, payload)
		_, err := w.st.Write(w.buf)
		return err
	}
	w.buf = appendFrameHeader(w.buf[:0], typ, len(payload))
	if _, err := w.st.Write(w.buf); err != nil {
		return err
	}
	_, err := w.st.Write(payload)
	return err
}

// finish writes an optional last message and the END frame, then closes the send side.
func (w *streamWriter) finish(msg []byte, hasMsg bool, status *Status) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.done = true
	var e Encoder
	encodeEnd(&e, status)
	// The messages still pending go first, in the same write when they are small.
	err := w.err
	switch {
	case err != nil:
	case hasMsg && len(msg) > coalesceLimit:
		if err = w.flushPendingLocked(); err == nil {
			err = w.writeLocked(frameMessage, msg)
		}
		if err == nil {
			err = w.writeLocked(frameEnd, e.Bytes())
		}
	default:
		w.buf = append(w.buf[:0], w.pending...)
		w.pending = w.pending[:0]
		if hasMsg {
			w.buf = appendFrame(w.buf, frameMessage, msg)
		}
		w.buf = appendFrame(w.buf, frameEnd, e.Bytes())
		_, err = w.st.Write(w.buf)
	}
	if cerr := w.st.Close(); err == nil {
		err = cerr
	}
	return err
}

// refuse ends a call that never reached a handler.
func (s *Server) refuse(st *quic.Stream, status *Status) {
	w := &streamWriter{st: st}
	st.SetWriteDeadline(time.Now().Add(s.o.handshakeTimeout))
	w.finish(nil, false, status)
	st.CancelRead(quic.StreamErrorCode(status.Code))
}

// requestStatus is the status for a request that could not be read.
func requestStatus(err error) *Status {
	if fe, ok := errors.AsType[*frameError](err); ok {
		if fe.tooLarge {
			return &Status{Code: ResourceExhausted, Message: fe.Error()}
		}
		return &Status{Code: InvalidArgument, Message: fe.Error()}
	}
	return nil
}

func (s *Server) serveStream(conn *quic.Conn, peer *Peer, cw *connWriter, st *quic.Stream, lookup func(string) (handler, bool)) {
	br := bufio.NewReaderSize(st, 4096)
	var hdr [frameHeaderLen]byte

	// The request and its message must arrive promptly.
	st.SetReadDeadline(time.Now().Add(s.o.handshakeTimeout))
	req, body, err := func() (request, []byte, error) {
		f, err := readFrame(br, &hdr, s.o.maxFrame)
		if err != nil {
			return request{}, nil, err
		}
		if f.typ != frameRequest {
			return request{}, nil, malformed("expected REQUEST, got frame type 0x%02x", f.typ)
		}
		req, err := decodeRequest(f.payload)
		if err != nil {
			return request{}, nil, err
		}
		f, err = readFrame(br, &hdr, s.o.maxFrame)
		if err == io.EOF {
			err = malformed("stream ended before the request message")
		}
		if err != nil {
			return req, nil, err
		}
		if f.typ != frameMessage {
			return req, nil, malformed("expected MESSAGE, got frame type 0x%02x", f.typ)
		}
		return req, f.payload, nil
	}()
	if err != nil {
		if status := requestStatus(err); status != nil {
			s.o.logger.Debug("orpc: refused a call", "peer", peer.Addr, "method", req.method, "err", err)
			s.refuse(st, status)
		} else {
			st.CancelRead(quic.StreamErrorCode(Canceled))
			st.CancelWrite(quic.StreamErrorCode(Canceled))
		}
		return
	}
	h, ok := lookup(req.method)
	if !ok {
		s.refuse(st, &Status{Code: NotFound, Message: fmt.Sprintf("unknown method %q", req.method)})
		return
	}
	s.active.add()
	defer s.active.done()
	if s.shutting.Load() { // after add: Shutdown either waits for this call or it sees shutting
		s.refuse(st, ErrServerShutdown)
		return
	}
	st.SetReadDeadline(time.Time{})

	ctx := context.WithValue(conn.Context(), peerKey{}, peer)
	if req.md != nil {
		ctx = context.WithValue(ctx, incomingMDKey{}, req.md)
	}
	if req.timeout > 0 {
		var cancelT context.CancelFunc
		ctx, cancelT = context.WithTimeout(ctx, req.timeout)
		defer cancelT()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// peerCancel applies a cancellation from the caller. When the caller's deadline passed,
	// our copy of it is due within a one-way delay: let it fire, so that the handler sees
	// ctx.Err() == context.DeadlineExceeded, with a fallback in case it does not.
	peerCancel := func(status *Status) {
		if status.Code == DeadlineExceeded && req.timeout > 0 {
			time.AfterFunc(100*time.Millisecond, func() { cancel(status) })
			return
		}
		cancel(status)
	}

	// The caller cancels by a CANCEL frame, by resetting its send side, or by STOP_SENDING
	// (which cancels our send side's context).
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			f, err := readFrame(br, &hdr, s.o.maxFrame)
			if err == io.EOF {
				return
			}
			if err != nil {
				if se, ok := errors.AsType[*quic.StreamError](err); ok && se.Remote {
					peerCancel(resetStatus(se.ErrorCode, "call canceled by the client"))
				} else if isFrameError(err) {
					cancel(&Status{Code: InvalidArgument, Message: err.Error()})
				} else {
					cancel(&Status{Code: Canceled, Message: "call stream closed: " + err.Error()})
				}
				return
			}
			if f.typ == frameCancel {
				status, err := decodeCancel(f.payload)
				if err != nil {
					status = &Status{Code: Canceled, Message: "call canceled by the client"}
				}
				peerCancel(status)
			}
		}
	}()
	stopSendWatch := context.AfterFunc(st.Context(), func() {
		cause := context.Cause(st.Context())
		if se, ok := errors.AsType[*quic.StreamError](cause); ok && se.Remote {
			peerCancel(resetStatus(se.ErrorCode, "call canceled by the client"))
		}
	})
	defer stopSendWatch()

	w := &streamWriter{st: st, cw: cw}
	// A call whose context ends stops writing at once, even if blocked on flow control.
	// CancelWrite comes first: it unblocks a write that holds w.mu.
	stopAbort := context.AfterFunc(ctx, func() {
		st.CancelWrite(quic.StreamErrorCode(ctxStatus(ctx).Code))
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})

	resp, hasResp, herr := s.runHandler(ctx, h, req.method, body, w)
	if stopAbort() {
		status := StatusOf(herr)
		if herr == nil {
			status = &Status{Code: OK}
		}
		w.finish(resp, hasResp, status)
	}

	// Wait for the caller to close its side (it does on reading END), then release the stream.
	st.SetReadDeadline(time.Now().Add(s.o.handshakeTimeout))
	<-readerDone
	st.CancelRead(quic.StreamErrorCode(OK))
}

func resetStatus(code quic.StreamErrorCode, msg string) *Status {
	c := Code(code)
	if c == OK || code > 1<<16 {
		c = Canceled
	}
	return &Status{Code: c, Message: msg}
}

func (s *Server) runHandler(ctx context.Context, h handler, method string, body []byte, w *streamWriter) (resp []byte, hasResp bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.o.logger.Error("orpc: handler panicked", "method", method, "panic", r, "stack", string(debug.Stack()))
			resp, hasResp, err = nil, false, &Status{Code: Internal, Message: fmt.Sprintf("handler panicked: %v", r)}
		}
	}()
	if h.unary != nil {
		resp, err = h.unary(ctx, body)
		if err == nil && len(resp) > s.o.maxFrame {
			return nil, false, Errorf(ResourceExhausted, "response of %d bytes exceeds the frame limit of %d", len(resp), s.o.maxFrame)
		}
		return resp, err == nil, err
	}
	send := func(b []byte) error {
		if ctx.Err() != nil {
			return ctxStatus(ctx)
		}
		if len(b) > s.o.maxFrame {
			return Errorf(ResourceExhausted, "message of %d bytes exceeds the frame limit of %d", len(b), s.o.maxFrame)
		}
		if err := w.sendMessage(b); err != nil {
			if ctx.Err() != nil {
				return ctxStatus(ctx)
			}
			return &Status{Code: Canceled, Message: "call stream closed: " + err.Error()}
		}
		return nil
	}
	return nil, false, h.stream(ctx, body, send)
}

// Methods lists the registered method names, sorted.
func (s *Server) Methods() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.methods))
	for m := range s.methods {
		names = append(names, m)
	}
	slices.Sort(names)
	return names
}
