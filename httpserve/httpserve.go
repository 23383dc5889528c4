// Package httpserve is the HTTP serving foundation shared by tandem and tandem-router:
// HTTP/1.1, HTTP/2 (h2c and TLS), HTTP/3 over QUIC, /health, /metrics and graceful drain.
package httpserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Defaults applied by New for zero Config fields.
const (
	DefaultDrainTimeout      = 30 * time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultBodyReadTimeout   = 10 * time.Second
	DefaultMinBodyRate       = 64 << 10 // bytes per second
)

// Paths answered by the Server itself, ahead of Config.Handler.
const (
	HealthPath  = "/health"
	MetricsPath = "/metrics"
	VersionPath = "/version" // {"version": Config.Version}, when set
)

// cutGrace is how long, once the drain deadline has passed, request handlers get to end
// their responses (a stream sends an error event) after their contexts are cancelled
// with ErrDrainTimeout, before the remaining connections are closed.
const cutGrace = 500 * time.Millisecond

// cutLinger is how long a cut response's last bytes get to leave before its stream or
// connection is reset (see abort).
const cutLinger = 100 * time.Millisecond

// ErrDrainTimeout is the cause (context.Cause) of a request context that Shutdown
// cancelled because its deadline passed: the server, not the client, is ending the
// request, and the handler should say so in its response before it returns.
var ErrDrainTimeout = errors.New("httpserve: the server's drain deadline passed")

// hardCloseGrace bounds how long Shutdown waits, after its deadline has
// passed and connections were cut, for serving goroutines to return. A
// handler that ignores its request context can hold one past this.
const hardCloseGrace = 2 * time.Second

// ErrServerClosed is returned by Start on a Server that was shut down.
var ErrServerClosed = http.ErrServerClosed

// Config configures a Server. Only Handler is required.
type Config struct {
	// Addr is the host:port to listen on (TCP, and UDP for HTTP/3).
	// Port 0 picks a free port; Server.Addr reports it. Empty means ":0".
	Addr string

	// Handler serves the application. Requests for HealthPath and
	// MetricsPath never reach it.
	Handler http.Handler

	// TLSCert and TLSKey are PEM file paths. When both are set the server
	// speaks HTTPS (HTTP/1.1 and HTTP/2 via ALPN) on TCP and HTTP/3 over QUIC
	// on UDP at the same port, advertised to TCP clients with Alt-Svc.
	// When both are empty it speaks cleartext HTTP/1.1 and h2c (HTTP/2 with
	// prior knowledge) on one TCP port.
	TLSCert, TLSKey string

	// DisableHTTP3 keeps a TLS server off UDP (no QUIC listener, no Alt-Svc).
	DisableHTTP3 bool

	// Ready reports whether the application can take traffic (e.g. model
	// loaded). HealthPath answers 200 only when Ready() is true and the
	// server is not draining, else 503. Nil means always ready.
	Ready func() bool

	// Degraded, if set, says why the application serves in a degraded mode ("" when it
	// does not): HealthPath then answers 200 "degraded: REASON", so that load balancers
	// keep the server while probes and people that read the body learn why.
	Degraded func() string

	// Metrics is served at MetricsPath (e.g. promhttp.HandlerFor(reg, …)).
	// Nil answers 404 there.
	Metrics http.Handler

	// DrainTimeout bounds the graceful shutdown done by Serve. Zero means
	// DefaultDrainTimeout. (Shutdown takes its deadline from its context.)
	DrainTimeout time.Duration

	// DrainDelay is how long Shutdown keeps accepting new connections while
	// HealthPath already answers 503, so load balancers see the server leave
	// before its listeners close. Zero closes listeners at once.
	DrainDelay time.Duration

	// ReadHeaderTimeout, IdleTimeout and MaxHeaderBytes protect against slow
	// or hostile clients; zero means the Default* constant. There is no write
	// timeout: SSE streams may run for minutes.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int

	// BodyReadTimeout and MinBodyRate bound how long a request body may take: a body
	// must keep within BodyReadTimeout plus its bytes so far at MinBodyRate, counted from
	// the handler's first read. A client that sends its headers and then a byte every few
	// seconds, or Expect: 100-continue and no body, is cut: the read fails with an error
	// matching os.ErrDeadlineExceeded. Zero means the Default* constant; a negative
	// BodyReadTimeout turns the bound off.
	BodyReadTimeout time.Duration
	MinBodyRate     int64 // bytes per second

	// Version, if set, is served at VersionPath as {"version": "..."} (vLLM's shape). Like
	// HealthPath it needs no token: it names the build, nothing more.
	Version string

	// MetricsToken, if set, is the bearer token MetricsPath requires
	// ("Authorization: Bearer TOKEN"). HealthPath never requires one: load balancers
	// and probes must reach it, and it tells only "ok", "not ready" or "draining".
	MetricsToken string

	// AllowedOrigins turns CORS on for these origins ("*": any): their requests get
	// Access-Control-Allow-Origin, and their preflights (OPTIONS) are answered here. Empty:
	// CORS is off, and browsers refuse cross-origin calls.
	AllowedOrigins []string

	// OnRefused, if set, counts a request the server refused itself, by reason
	// ("cors_origin": a preflight from an origin not allowed).
	OnRefused func(reason string)

	// Logger receives start, shutdown and server error lines. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Server serves one Config. Create it with New, then call Serve, or Start
// and later Shutdown.
type Server struct {
	cfg      Config
	log      *slog.Logger
	tlsConf  *tls.Config // nil for cleartext
	http3On  bool
	draining atomic.Bool

	mu      sync.Mutex
	state   int
	tcpLn   net.Listener
	udpConn net.PacketConn
	hs      *http.Server
	h3      *http3.Server
	altSvc  string

	baseCtx    context.Context         // parent of every request context
	cancelBase context.CancelCauseFunc // cut request contexts on hard close
	serving    sync.WaitGroup          // serve goroutines
	serveErr   chan error              // unexpected serve failures
	handlers   sync.WaitGroup          // requests being served
	handoff    *handoffListener        // the TCP listener, shared with the drain server
	drainSrv   *http.Server            // answers 503 on new connections during a drain

	shutdownDone chan struct{}
	shutdownErr  error
}

const (
	stateNew = iota
	stateServing
	stateClosing
)

// New checks cfg, loads the TLS certificate if any, and returns a Server
// that has not yet bound anything.
func New(cfg Config) (*Server, error) {
	if cfg.Handler == nil {
		return nil, errors.New("httpserve: Config.Handler is nil")
	}
	if cfg.Addr == "" {
		cfg.Addr = ":0"
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("httpserve: bad Addr %q: %w", cfg.Addr, err)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.BodyReadTimeout == 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if cfg.MinBodyRate <= 0 {
		cfg.MinBodyRate = DefaultMinBodyRate
	}
	s := &Server{cfg: cfg, log: cfg.Logger, shutdownDone: make(chan struct{}), serveErr: make(chan error, 2)}
	if s.log == nil {
		s.log = slog.Default()
	}
	switch {
	case cfg.TLSCert == "" && cfg.TLSKey == "":
	case cfg.TLSCert == "" || cfg.TLSKey == "":
		return nil, errors.New("httpserve: set both TLSCert and TLSKey, or neither")
	default:
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("httpserve: load TLS key pair: %w", err)
		}
		s.tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		s.http3On = !cfg.DisableHTTP3
	}
	return s, nil
}

// Start binds the listeners, so that Addr and URL are known when it returns,
// and serves in the background until Shutdown.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case stateServing:
		return errors.New("httpserve: already started")
	case stateClosing:
		return ErrServerClosed
	}
	if err := s.listen(); err != nil {
		return err
	}
	s.baseCtx, s.cancelBase = context.WithCancelCause(context.Background())
	s.handoff = newHandoffListener(s.tcpLn)

	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	if s.tlsConf != nil {
		protos.SetHTTP2(true)
	} else {
		protos.SetUnencryptedHTTP2(true)
	}
	tcpHandler := s.routes()
	if s.http3On {
		s.altSvc = fmt.Sprintf(`h3=":%d"; ma=86400`, s.udpConn.LocalAddr().(*net.UDPAddr).Port)
		app := tcpHandler
		tcpHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Alt-Svc", s.altSvc)
			app.ServeHTTP(w, r)
		})
	}
	s.hs = &http.Server{
		Handler:           tcpHandler,
		Protocols:         protos,
		TLSConfig:         s.tlsConf,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
	}
	s.drainSrv = &http.Server{
		Handler:           http.HandlerFunc(s.drainAnswer),
		Protocols:         protos,
		TLSConfig:         s.tlsConf,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.drainSrv.SetKeepAlivesEnabled(false)
	if s.http3On {
		s.h3 = &http3.Server{
			Handler:        s.routes(),
			TLSConfig:      s.tlsConf.Clone(),
			QUICConfig:     &quic.Config{Allow0RTT: false}, // no replayable POSTs
			MaxHeaderBytes: s.cfg.MaxHeaderBytes,
			IdleTimeout:    s.cfg.IdleTimeout,
			Logger:         s.log,
			ConnContext: func(ctx context.Context, _ *quic.Conn) context.Context {
				// HTTP/3 request contexts end with the TCP ones, with the same cause.
				ctx, cancel := context.WithCancelCause(ctx)
				stop := context.AfterFunc(s.baseCtx, func() { cancel(context.Cause(s.baseCtx)) })
				context.AfterFunc(ctx, func() { stop() })
				return ctx
			},
		}
	}

	s.state = stateServing
	s.serving.Go(func() {
		var err error
		if s.tlsConf != nil {
			err = s.hs.ServeTLS(s.handoff.main, "", "") // certificates are in TLSConfig
		} else {
			err = s.hs.Serve(s.handoff.main)
		}
		s.reportServeErr("tcp", err)
	})
	s.serving.Go(s.handoff.run)
	if s.h3 != nil {
		s.serving.Go(func() { s.reportServeErr("quic", s.h3.Serve(s.udpConn)) })
	}
	s.log.Info("httpserve: listening", "url", s.url(), "protocols", s.protocols())
	return nil
}

// listen binds TCP and, for HTTP/3, UDP on the same port. With port 0 the
// TCP port is picked first and UDP tried on it, a few times if it is taken.
func (s *Server) listen() error {
	host, port, _ := net.SplitHostPort(s.cfg.Addr)
	tries := 1
	if s.http3On && (port == "0" || port == "") {
		tries = 20
	}
	var err error
	for range tries {
		var ln net.Listener
		ln, err = net.Listen("tcp", s.cfg.Addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("httpserve: %s is in use by another process (choose another port): %w", s.cfg.Addr, syscall.EADDRINUSE)
		}
		if err != nil {
			return fmt.Errorf("httpserve: %w", err)
		}
		if !s.http3On {
			s.tcpLn = ln
			return nil
		}
		p := ln.Addr().(*net.TCPAddr).Port
		var pc net.PacketConn
		pc, err = net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			s.tcpLn, s.udpConn = ln, pc
			return nil
		}
		ln.Close()
	}
	return fmt.Errorf("httpserve: listen udp: %w", err)
}

func (s *Server) reportServeErr(what string, err error) {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, quic.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return
	}
	s.log.Error("httpserve: serving stopped", "listener", what, "err", err)
	s.serveErr <- fmt.Errorf("httpserve: %s: %w", what, err)
}

// routes answers HealthPath and MetricsPath and hands the rest to the application.
func (s *Server) routes() http.Handler {
	app, metrics := s.cfg.Handler, s.cfg.Metrics
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.handlers.Add(1)
		defer s.handlers.Done()
		w.Header().Set(RequestIDHeader, RequestID(r))
		if s.cors(w, r) {
			return
		}
		switch r.URL.Path {
		case HealthPath:
			s.health(w)
		case VersionPath:
			if s.cfg.Version == "" {
				app.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, "{\"version\":%q}\n", s.cfg.Version)
		case MetricsPath:
			if metrics == nil {
				http.NotFound(w, r)
				return
			}
			if s.cfg.MetricsToken != "" && !bearerIs(r, s.cfg.MetricsToken) {
				w.Header().Set("WWW-Authenticate", "Bearer")
				http.Error(w, "metrics need \"Authorization: Bearer <key>\" (the server's API key)", http.StatusUnauthorized)
				return
			}
			metrics.ServeHTTP(w, r)
		default:
			if r.Body != nil && r.Body != http.NoBody && s.cfg.BodyReadTimeout > 0 {
				r.Body = &deadlineBody{body: r.Body, rc: http.NewResponseController(w),
					timeout: s.cfg.BodyReadTimeout, rate: s.cfg.MinBodyRate}
			}
			app.ServeHTTP(w, r)
			if errors.Is(context.Cause(r.Context()), ErrDrainTimeout) {
				s.abort(w, r)
			}
		}
	})
}

// abort ends a response the drain deadline cut, after its handler returned, so that the
// client sees a cut stream (no clean end of the body) and not a complete response; what
// the handler wrote first (a stream's error event) is delivered before the cut. HTTP/3 is
// the exception: a QUIC stream reset makes the client drop the data it has not read yet,
// the handler's last words included, so there the response ends normally and those
// words alone say it was cut.
func (s *Server) abort(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 3 {
		return
	}
	http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
}

func (s *Server) health(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	switch {
	case s.draining.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "draining")
	case s.cfg.Ready != nil && !s.cfg.Ready():
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready")
	default:
		if s.cfg.Degraded != nil {
			if why := s.cfg.Degraded(); why != "" {
				fmt.Fprintln(w, "degraded: "+why)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	}
}

// Addr returns the bound TCP address, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tcpLn == nil {
		return nil
	}
	return s.tcpLn.Addr()
}

// QUICAddr returns the bound UDP address of the HTTP/3 listener, or nil
// when there is none.
func (s *Server) QUICAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.udpConn == nil {
		return nil
	}
	return s.udpConn.LocalAddr()
}

// URL returns "http://host:port" or "https://host:port" for the bound
// address (an unspecified host becomes localhost), or "" before Start.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url()
}

func (s *Server) url() string {
	if s.tcpLn == nil {
		return ""
	}
	a := s.tcpLn.Addr().(*net.TCPAddr)
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "localhost"
	}
	scheme := "http"
	if s.tlsConf != nil {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, strconv.Itoa(a.Port))
}

func (s *Server) protocols() []string {
	switch {
	case s.tlsConf == nil:
		return []string{"http/1.1", "h2c"}
	case s.http3On:
		return []string{"http/1.1", "h2", "h3"}
	default:
		return []string{"http/1.1", "h2"}
	}
}

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// Shutdown drains the server: HealthPath turns 503 at once, new connections
// are accepted for Config.DrainDelay and then refused, idle connections are
// closed, HTTP/2 and HTTP/3 clients get GOAWAY, and in-flight requests
// (long SSE streams included) run until they finish. If ctx ends first, the
// remaining connections are cut, request contexts are cancelled, and
// Shutdown returns ctx.Err(). Later calls wait for the first one's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	switch s.state {
	case stateNew:
		s.state = stateClosing
		s.draining.Store(true)
		close(s.shutdownDone)
		s.mu.Unlock()
		return nil
	case stateClosing:
		s.mu.Unlock()
		select {
		case <-s.shutdownDone:
			return s.shutdownErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.state = stateClosing
	s.mu.Unlock()

	s.shutdownErr = s.drain(ctx)
	close(s.shutdownDone)
	return s.shutdownErr
}

func (s *Server) drain(ctx context.Context) error {
	start := time.Now()
	defer s.cancelBase(ErrServerClosed)
	s.draining.Store(true)
	s.log.Info("httpserve: draining", "url", s.url(), "drain_delay", s.cfg.DrainDelay)
	if d := s.cfg.DrainDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}

	// New TCP connections now go to the drain server, which answers 503 (HealthPath
	// "draining"), so that a load balancer reads the drain instead of a refused
	// connection; the listener itself closes when the drain ends.
	s.handoff.toDrain()
	s.serving.Go(func() {
		var err error
		if s.tlsConf != nil {
			err = s.drainSrv.ServeTLS(s.handoff.drain, "", "")
		} else {
			err = s.drainSrv.Serve(s.handoff.drain)
		}
		s.reportServeErr("tcp (draining)", err)
	})
	defer s.drainSrv.Close()
	defer s.handoff.Close()

	// Graceful part: both servers stop accepting and wait for their requests.
	done := make(chan error, 2)
	n := 1
	go func() { done <- s.hs.Shutdown(ctx) }()
	if s.h3 != nil {
		n++
		// Not ctx: at its end h3.Shutdown would close the connections at once, before the
		// handlers had their cutGrace; the cut below closes them.
		go func() { done <- s.h3.Shutdown(context.WithoutCancel(ctx)) }()
	}
	var errs []error
	got, cut := 0, false
wait:
	for got < n {
		select {
		case err := <-done:
			got++
			switch {
			case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
				cut = true
			case err != nil:
				errs = append(errs, err)
			}
		case <-ctx.Done():
			// A stuck HTTP/3 handler can keep h3.Shutdown from returning
			// even after its deadline; don't wait for it here.
			cut = true
			break wait
		}
	}
	if !cut {
		s.handoff.Close()
		s.drainSrv.Close()
		s.serving.Wait()
		s.closeUDP()
		s.log.Info("httpserve: stopped", "took", time.Since(start).Round(time.Millisecond))
		return errors.Join(errs...)
	}

	s.log.Warn("httpserve: drain deadline passed, ending the remaining requests", "took", time.Since(start).Round(time.Millisecond))
	// Cancel request contexts with ErrDrainTimeout first, so each handler can end its
	// response saying why (a stream's error event), then cut what is left.
	s.cancelBase(ErrDrainTimeout)
	handled := make(chan struct{})
	go func() { s.handlers.Wait(); close(handled) }()
	cg := time.NewTimer(cutGrace)
	select {
	case <-handled:
		// HTTP/2 writes frames from its connection's own goroutine: let the last ones
		// (the handlers' final data, the resets) leave before the connections close.
		time.Sleep(cutLinger)
	case <-cg.C:
	}
	cg.Stop()
	s.hs.Close()
	s.handoff.Close()
	s.drainSrv.Close()
	if s.h3 != nil {
		go s.h3.Close() // h3.Shutdown may be doing so already; Close is idempotent
	}
	// Wait, bounded, for h3 to finish closing its connections (so their
	// CONNECTION_CLOSE frames go out before the UDP socket closes) and for
	// the serving goroutines to return.
	grace := time.NewTimer(hardCloseGrace)
	defer grace.Stop()
	waited := make(chan struct{})
	go func() { s.serving.Wait(); close(waited) }()
collect:
	for got < n {
		select {
		case <-done:
			got++
		case <-grace.C:
			break collect
		}
	}
	if got == n {
		select {
		case <-waited:
		case <-grace.C:
		}
	}
	if got < n {
		s.log.Warn("httpserve: HTTP/3 still closing after hard close; a handler ignores its context")
	}
	s.closeUDP()
	err := ctx.Err()
	if err == nil {
		err = context.DeadlineExceeded
	}
	return errors.Join(append(errs, err)...)
}

func (s *Server) closeUDP() {
	if s.udpConn != nil {
		s.udpConn.Close()
	}
}

// Serve starts the server, blocks until ctx is done (or serving fails), then
// shuts down gracefully within Config.DrainTimeout. It returns nil after a
// clean drain.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-s.serveErr:
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	return errors.Join(serveErr, s.Shutdown(sctx))
}
