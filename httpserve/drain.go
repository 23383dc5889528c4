package httpserve

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
)

// handoffListener accepts on the real TCP listener and hands each connection to the
// main server until a drain begins, then to the drain server. net/http's Shutdown closes
// its listener at once; with this, the port stays open (and answers 503) until the drain
// is over.
type handoffListener struct {
	inner       net.Listener
	main, drain *chanListener

	mu       sync.Mutex
	draining bool
}

func newHandoffListener(ln net.Listener) *handoffListener {
	return &handoffListener{inner: ln, main: newChanListener(ln.Addr()), drain: newChanListener(ln.Addr())}
}

// run accepts until the real listener closes.
func (h *handoffListener) run() {
	defer h.main.Close()
	defer h.drain.Close()
	for {
		c, err := h.inner.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return
		}
		h.mu.Lock()
		to := h.main
		if h.draining {
			to = h.drain
		}
		h.mu.Unlock()
		if !to.deliver(c) && !h.drain.deliver(c) {
			c.Close()
		}
	}
}

// toDrain sends later connections to the drain server.
func (h *handoffListener) toDrain() {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
}

// Close closes the real listener.
func (h *handoffListener) Close() error { return h.inner.Close() }

// chanListener is a net.Listener fed by a handoffListener.
type chanListener struct {
	addr      net.Addr
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *chanListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// drainAnswer serves connections made during a drain: HealthPath says "draining", every
// other request gets 503 with Retry-After (in the OpenAI error shape, which is what the
// applications behind this server speak), and the connection closes.
func (s *Server) drainAnswer(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == HealthPath {
		s.health(w)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Retry-After", "1")
	h.Set("Connection", "close")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, `{"error":{"message":"The server is shutting down; retry on another server.","type":"server_error","param":null,"code":"service_unavailable"}}`)
}

// bearerIs reports whether r carries "Authorization: Bearer token", compared in
// constant time.
func bearerIs(r *http.Request, token string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}
