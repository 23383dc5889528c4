package httpserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
)

var quiet = slog.New(slog.DiscardHandler)

// certs is one self-signed certificate shared by all tests.
var certs struct {
	once      sync.Once
	cert, key string
	pool      *x509.CertPool
	err       error
}

func testCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	certs.once.Do(func() {
		dir, err := os.MkdirTemp("", "httpserve-cert")
		if err != nil {
			certs.err = err
			return
		}
		certs.cert, certs.key, certs.err = SelfSignedCert(dir)
		if certs.err != nil {
			return
		}
		pem, err := os.ReadFile(certs.cert)
		if err != nil {
			certs.err = err
			return
		}
		certs.pool = x509.NewCertPool()
		if !certs.pool.AppendCertsFromPEM(pem) {
			certs.err = errors.New("bad cert PEM")
		}
	})
	if certs.err != nil {
		t.Fatal(certs.err)
	}
	return certs.cert, certs.key, certs.pool
}

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	code := m.Run()
	if certs.cert != "" {
		os.RemoveAll(strings.TrimSuffix(certs.cert, "cert.pem"))
	}
	os.Exit(code)
}

// proto is one way for a client to reach a Server.
type proto struct {
	name      string
	tls       bool
	wantProto string // resp.Proto
	newClient func(pool *x509.CertPool) (c *http.Client, closeFn func())
}

func stdClient(tr *http.Transport) (*http.Client, func()) {
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}, tr.CloseIdleConnections
}

var protos = []proto{
	{"h1", false, "HTTP/1.1", func(*x509.CertPool) (*http.Client, func()) {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP1(true)
		return stdClient(tr)
	}},
	{"h2c", false, "HTTP/2.0", func(*x509.CertPool) (*http.Client, func()) {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		return stdClient(tr)
	}},
	{"h1-tls", true, "HTTP/1.1", func(pool *x509.CertPool) (*http.Client, func()) {
		tr := &http.Transport{Protocols: new(http.Protocols), TLSClientConfig: &tls.Config{RootCAs: pool}}
		tr.Protocols.SetHTTP1(true)
		return stdClient(tr)
	}},
	{"h2-tls", true, "HTTP/2.0", func(pool *x509.CertPool) (*http.Client, func()) {
		tr := &http.Transport{Protocols: new(http.Protocols), TLSClientConfig: &tls.Config{RootCAs: pool}}
		tr.Protocols.SetHTTP2(true)
		return stdClient(tr)
	}},
	{"h3", true, "HTTP/3.0", func(pool *x509.CertPool) (*http.Client, func()) {
		tr := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
		return &http.Client{Transport: tr, Timeout: 20 * time.Second}, func() { tr.Close() }
	}},
}

// start starts a Server for cfg (over TLS when withTLS) and shuts it down
// at the end of the test.
func start(t *testing.T, cfg Config, withTLS bool) *Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if withTLS {
		cfg.TLSCert, cfg.TLSKey, _ = testCert(t)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s
}

func client(t *testing.T, p proto) *http.Client {
	t.Helper()
	var pool *x509.CertPool
	if p.tls {
		_, _, pool = testCert(t)
	}
	c, closeFn := p.newClient(pool)
	t.Cleanup(closeFn)
	return c
}

func get(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp, string(body)
}

var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Proto", r.Proto)
	fmt.Fprintf(w, "hello %s", r.URL.Path)
})

func TestProtocols(t *testing.T) {
	for _, p := range protos {
		t.Run(p.name, func(t *testing.T) {
			s := start(t, Config{Handler: echo}, p.tls)
			c := client(t, p)
			resp, body := get(t, c, s.URL()+"/v1/models")
			if resp.StatusCode != 200 || body != "hello /v1/models" {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			if resp.Proto != p.wantProto || resp.Header.Get("X-Proto") != p.wantProto {
				t.Fatalf("client saw %s, server saw %s, want %s", resp.Proto, resp.Header.Get("X-Proto"), p.wantProto)
			}
			if strings.HasPrefix(p.wantProto, "HTTP/2") && resp.ProtoMajor != 2 {
				t.Fatalf("ProtoMajor %d", resp.ProtoMajor)
			}
			altSvc := resp.Header.Get("Alt-Svc")
			switch {
			case !p.tls || p.name == "h3":
				if altSvc != "" {
					t.Fatalf("unexpected Alt-Svc %q", altSvc)
				}
			default:
				port := s.QUICAddr().(*net.UDPAddr).Port
				if want := `h3=":` + strconv.Itoa(port) + `"`; !strings.HasPrefix(altSvc, want) {
					t.Fatalf("Alt-Svc %q, want prefix %q", altSvc, want)
				}
				if tcp := s.Addr().(*net.TCPAddr).Port; tcp != port {
					t.Fatalf("TCP port %d, UDP port %d", tcp, port)
				}
			}
		})
	}
}

// TestH2CUpgrade: net/http does not implement the deprecated h2c Upgrade
// (RFC 7540 §3.2, removed in RFC 9113); such a request is answered as plain
// HTTP/1.1, which RFC 9110 allows.
func TestH2CUpgrade(t *testing.T) {
	s := start(t, Config{Handler: echo}, false)
	conn, err := net.DialTimeout("tcp", s.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /x HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 100))
	if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" || string(body) != "hello /x" {
		t.Fatalf("got %s %d %q", resp.Proto, resp.StatusCode, body)
	}
}

func TestHealth(t *testing.T) {
	for _, p := range []proto{protos[0], protos[4]} {
		t.Run(p.name, func(t *testing.T) {
			var ready atomic.Bool
			var appHits atomic.Int32
			var degraded atomic.Pointer[string]
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { appHits.Add(1) })
			s := start(t, Config{Handler: app, Ready: ready.Load, Degraded: func() string {
				if d := degraded.Load(); d != nil {
					return *d
				}
				return ""
			}}, p.tls)
			c := client(t, p)
			resp, body := get(t, c, s.URL()+HealthPath)
			if resp.StatusCode != 503 || body != "not ready\n" {
				t.Fatalf("before ready: %d %q", resp.StatusCode, body)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("Cache-Control %q", cc)
			}
			ready.Store(true)
			resp, body = get(t, c, s.URL()+HealthPath)
			if resp.StatusCode != 200 || body != "ok\n" {
				t.Fatalf("after ready: %d %q", resp.StatusCode, body)
			}
			why := "2 workers without KV events"
			degraded.Store(&why)
			resp, body = get(t, c, s.URL()+HealthPath)
			if resp.StatusCode != 200 || body != "degraded: 2 workers without KV events\n" {
				t.Fatalf("degraded: %d %q", resp.StatusCode, body)
			}
			if n := appHits.Load(); n != 0 {
				t.Fatalf("app saw %d health requests", n)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	var appHits atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { appHits.Add(1) })
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, "tandem_up 1")
	})
	c := client(t, protos[0])

	s := start(t, Config{Handler: app, Metrics: metrics}, false)
	resp, body := get(t, c, s.URL()+MetricsPath)
	if resp.StatusCode != 200 || body != "tandem_up 1\n" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("metrics: %d %q %q", resp.StatusCode, body, resp.Header.Get("Content-Type"))
	}

	s = start(t, Config{Handler: app}, false)
	if resp, _ := get(t, c, s.URL()+MetricsPath); resp.StatusCode != 404 {
		t.Fatalf("nil Metrics: %d", resp.StatusCode)
	}
	if n := appHits.Load(); n != 0 {
		t.Fatalf("app saw %d metrics requests", n)
	}
}

// streamer writes n chunks, one every tick, then returns. It records when
// it started and finished, and whether its context was cancelled.
type streamer struct {
	n         int // 0: until the request context ends (bounded by 20s)
	tick      time.Duration
	started   chan struct{}
	done      chan struct{}
	cancelled atomic.Bool
}

func newStreamer(n int, tick time.Duration) *streamer {
	return &streamer{n: n, tick: tick, started: make(chan struct{}), done: make(chan struct{})}
}

func (st *streamer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer close(st.done)
	close(st.started)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	limit := st.n
	if limit == 0 {
		limit = int(20 * time.Second / st.tick)
	}
	for i := range limit {
		if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-time.After(st.tick):
		case <-r.Context().Done():
			st.cancelled.Store(true)
			return
		}
	}
}

// readEvents reads SSE data lines until the body ends and returns their
// count and the read error (nil on a clean end). first is closed after the
// first event.
func readEvents(body io.Reader, first chan<- struct{}) (int, error) {
	br := bufio.NewReader(body)
	n := 0
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			if n == 0 {
				close(first)
			}
			n++
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

type streamResult struct {
	events int
	err    error
	end    time.Time
}

// openStream starts a GET on path and waits until the first event arrives.
func openStream(t *testing.T, c *http.Client, url string) <-chan streamResult {
	t.Helper()
	first := make(chan struct{})
	res := make(chan streamResult, 1)
	go func() {
		resp, err := c.Get(url)
		if err != nil {
			res <- streamResult{err: err, end: time.Now()}
			return
		}
		defer resp.Body.Close()
		n, err := readEvents(resp.Body, first)
		res <- streamResult{n, err, time.Now()}
	}()
	select {
	case <-first:
		return res
	case r := <-res:
		t.Fatalf("stream ended before its first event: %+v", r)
	case <-time.After(10 * time.Second):
		t.Fatal("no first event within 10s")
	}
	return nil
}

// waitDraining asks a new connection for HealthPath and the application until they
// answer 503 as the drain server does, for at most limit. (HTTP/3 is skipped: a draining
// QUIC listener takes no new connections.)
func waitDraining(url string, p proto, limit time.Duration) error {
	if p.name == "h3" {
		return nil
	}
	deadline := time.Now().Add(limit)
	for {
		c, closeFn := p.newClient(certs.pool)
		health, hbody, herr := getOnce(c, url+HealthPath)
		app, _, aerr := getOnce(c, url+"/app")
		closeFn()
		if herr == nil && aerr == nil && health == 503 && hbody == "draining\n" && app == 503 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("during the drain a new connection got /health %d %q (%v), app %d (%v); want 503 draining, 503", health, hbody, herr, app, aerr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func getOnce(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitRefused dials addr until the dial is refused (the listener closed),
// for at most limit.
func waitRefused(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return nil
		}
		conn.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still accepts connections after %v", addr, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestGracefulShutdown(t *testing.T) {
	for _, p := range protos {
		t.Run(p.name, func(t *testing.T) {
			const chunks = 16 // 800ms of stream: room for the drain checks below
			st := newStreamer(chunks, 50*time.Millisecond)
			mux := http.NewServeMux()
			mux.Handle("/stream", st)
			s := start(t, Config{Handler: mux}, p.tls)
			c := client(t, p)
			res := openStream(t, c, s.URL()+"/stream")

			shutdownErr := make(chan error, 1)
			var shutdownEnd time.Time
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				err := s.Shutdown(ctx)
				shutdownEnd = time.Now()
				shutdownErr <- err
			}()

			// While the stream runs: new TCP connections are answered by the drain
			// server (/health 503 "draining", the application 503), not refused, so
			// a load balancer can tell draining from dead.
			for t0 := time.Now(); !s.Draining() && time.Since(t0) < 2*time.Second; {
				time.Sleep(time.Millisecond)
			}
			if err := waitDraining(s.URL(), p, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			if !s.Draining() {
				t.Fatal("Draining() false during drain")
			}
			rec := httptest.NewRecorder()
			s.routes().ServeHTTP(rec, httptest.NewRequest("GET", HealthPath, nil))
			if rec.Code != 503 {
				t.Fatalf("/health during drain: %d", rec.Code)
			}
			if p.name == "h3" {
				// A new QUIC connection gets no answer either.
				c2, closeFn := p.newClient(certs.pool)
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				req, _ := http.NewRequestWithContext(ctx, "GET", s.URL()+HealthPath, nil)
				if resp, err := c2.Do(req); err == nil {
					resp.Body.Close()
					t.Errorf("new HTTP/3 connection during drain answered %d", resp.StatusCode)
				}
				cancel()
				closeFn()
			}
			select {
			case <-st.done:
				t.Fatal("stream finished before the drain checks; test is too slow to mean anything")
			default:
			}

			var r streamResult
			select {
			case r = <-res:
			case <-time.After(10 * time.Second):
				t.Fatal("stream did not end")
			}
			if r.err != nil || r.events != chunks {
				t.Fatalf("stream: %d/%d events, err %v", r.events, chunks, r.err)
			}
			select {
			case err := <-shutdownErr:
				if err != nil {
					t.Fatalf("Shutdown: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Shutdown did not return")
			}
			select {
			case <-st.done:
			default:
				t.Fatal("Shutdown returned before the handler finished")
			}
			if st.cancelled.Load() {
				t.Fatal("handler context cancelled during graceful drain")
			}
			if shutdownEnd.Before(r.end.Add(-100 * time.Millisecond)) {
				t.Fatalf("Shutdown returned %v before the client saw the stream end", r.end.Sub(shutdownEnd))
			}
		})
	}
}

func TestShutdownDeadline(t *testing.T) {
	for _, p := range protos {
		t.Run(p.name, func(t *testing.T) {
			st := newStreamer(0, 20*time.Millisecond) // streams until cut
			// waiter sends one event, then only waits for its context.
			waiterCancelled := make(chan struct{})
			waiter := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, "data: 0\n\n")
				http.NewResponseController(w).Flush()
				select {
				case <-r.Context().Done():
					close(waiterCancelled)
				case <-time.After(20 * time.Second):
				}
			})
			mux := http.NewServeMux()
			mux.Handle("/stream", st)
			mux.Handle("/wait", waiter)
			s := start(t, Config{Handler: mux}, p.tls)
			c := client(t, p)
			res := openStream(t, c, s.URL()+"/stream")
			waitRes := openStream(t, c, s.URL()+"/wait")

			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			t0 := time.Now()
			err := s.Shutdown(ctx)
			took := time.Since(t0)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
			}
			if took < deadline || took > deadline+hardCloseGrace {
				t.Fatalf("Shutdown took %v", took)
			}
			select {
			case r := <-res:
				if r.err == nil && p.name != "h3" { // HTTP/3 ends cut streams normally: see Server.abort
					t.Fatalf("stream ended cleanly after %d events; want it cut", r.events)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("client stream not cut")
			}
			select {
			case <-st.done:
			case <-time.After(5 * time.Second):
				t.Fatal("handler still running")
			}
			select {
			case <-waiterCancelled:
			case <-time.After(5 * time.Second):
				t.Fatal("waiting handler's context not cancelled")
			}
			select {
			case r := <-waitRes:
				if r.err == nil && p.name != "h3" {
					t.Fatal("waiting stream ended cleanly; want it cut")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("waiting client not cut")
			}
			// Later calls report the same result.
			if err2 := s.Shutdown(context.Background()); !errors.Is(err2, context.DeadlineExceeded) {
				t.Fatalf("second Shutdown: %v", err2)
			}
		})
	}
}

func TestDrainDelay(t *testing.T) {
	const delay = 400 * time.Millisecond
	s := start(t, Config{Handler: echo, DrainDelay: delay}, false)
	c := client(t, protos[0])
	if resp, _ := get(t, c, s.URL()+HealthPath); resp.StatusCode != 200 {
		t.Fatalf("/health before drain: %d", resp.StatusCode)
	}
	done := make(chan error, 1)
	t0 := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	for !s.Draining() && time.Since(t0) < 2*time.Second {
		time.Sleep(time.Millisecond)
	}
	// New connection, still accepted during the delay: /health says 503,
	// the application still answers.
	fresh, closeFn := protos[0].newClient(nil)
	defer closeFn()
	resp, body := get(t, fresh, s.URL()+HealthPath)
	if resp.StatusCode != 503 || body != "draining\n" {
		t.Fatalf("/health during drain delay: %d %q", resp.StatusCode, body)
	}
	if time.Since(t0) < delay {
		if resp, _ := get(t, fresh, s.URL()+"/app"); resp.StatusCode != 200 {
			t.Fatalf("app during drain delay: %d", resp.StatusCode)
		}
	}
	closeFn()
	// With nothing in flight the drain ends with the delay: the port closes.
	if err := waitRefused(s.Addr().String(), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if since := time.Since(t0); since < delay {
		t.Fatalf("listener closed after %v, before the %v delay", since, delay)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestServe(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	s, err := New(Config{Addr: "127.0.0.1:0", Handler: echo, Logger: log, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	for i := 0; s.URL() == ""; i++ {
		if i > 1000 {
			t.Fatal("Serve did not start")
		}
		time.Sleep(2 * time.Millisecond)
	}
	c := client(t, protos[0])
	if resp, body := get(t, c, s.URL()+"/a"); resp.StatusCode != 200 || body != "hello /a" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	logs := buf.String()
	for _, want := range []string{"httpserve: listening", "url=" + s.URL(), "httpserve: draining", "httpserve: stopped"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if err := s.Start(); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Start after Shutdown: %v", err)
	}
}

func TestLifecycleErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without Handler: no error")
	}
	if _, err := New(Config{Handler: echo, Addr: "nonsense"}); err == nil {
		t.Error("bad Addr: no error")
	}
	cert, _, _ := testCert(t)
	if _, err := New(Config{Handler: echo, TLSCert: cert}); err == nil {
		t.Error("TLSCert without TLSKey: no error")
	}
	if _, err := New(Config{Handler: echo, TLSCert: cert, TLSKey: cert}); err == nil {
		t.Error("cert as key: no error")
	}

	s, err := New(Config{Handler: echo, Addr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != nil || s.URL() != "" {
		t.Error("address known before Start")
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown before Start: %v", err)
	}
	if err := s.Start(); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Start after Shutdown: %v", err)
	}

	s = start(t, Config{Handler: echo}, false)
	if err := s.Start(); err == nil {
		t.Error("second Start: no error")
	}
	// The port is taken: a second server on it fails to start.
	s2, _ := New(Config{Handler: echo, Addr: s.Addr().String(), Logger: quiet})
	if err := s2.Start(); err == nil {
		t.Error("Start on a taken port: no error")
		s2.Shutdown(context.Background())
	}
}

func TestDisableHTTP3(t *testing.T) {
	s := start(t, Config{Handler: echo, DisableHTTP3: true}, true)
	if s.QUICAddr() != nil {
		t.Fatal("QUIC listener with DisableHTTP3")
	}
	resp, _ := get(t, client(t, protos[3]), s.URL()+"/")
	if resp.ProtoMajor != 2 || resp.Header.Get("Alt-Svc") != "" {
		t.Fatalf("proto %s, Alt-Svc %q", resp.Proto, resp.Header.Get("Alt-Svc"))
	}
}

func TestBadInput(t *testing.T) {
	s := start(t, Config{Handler: echo, MaxHeaderBytes: 4 << 10}, false)
	raw := func(req string) string {
		conn, err := net.DialTimeout("tcp", s.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, req)
		line, _ := bufio.NewReader(conn).ReadString('\n')
		return strings.TrimSpace(line)
	}
	if got := raw("\x00\x01garbage that is longer than the HTTP/2 preface\r\n\r\n"); !strings.Contains(got, "400") {
		t.Errorf("garbage: %q", got)
	}
	big := "GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"
	if got := raw(big); !strings.Contains(got, "431") {
		t.Errorf("oversized header: %q", got)
	}
	// A broken h2c preface must not hurt the server either.
	if got := raw("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff"); strings.Contains(got, "200") {
		t.Errorf("bad h2 frames: %q", got)
	}
	if resp, _ := get(t, client(t, protos[0]), s.URL()+"/still"); resp.StatusCode != 200 {
		t.Fatalf("server unwell after bad input: %d", resp.StatusCode)
	}
}

func TestSelfSignedCertHosts(t *testing.T) {
	certFile, keyFile, err := SelfSignedCert(t.TempDir(), "example.test", "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf := pair.Leaf
	if err := leaf.VerifyHostname("example.test"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("10.1.2.3"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("localhost"); err == nil {
		t.Error("cert valid for a host not asked for")
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v %v", fi.Mode(), err)
	}
}

func BenchmarkRequest(b *testing.B) {
	for _, p := range []proto{protos[0], protos[1], protos[3], protos[4]} {
		b.Run(p.name, func(b *testing.B) {
			cfg := Config{Addr: "127.0.0.1:0", Handler: echo, Logger: quiet}
			var pool *x509.CertPool
			if p.tls {
				certFile, keyFile, err := SelfSignedCert(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				cfg.TLSCert, cfg.TLSKey = certFile, keyFile
				pem, _ := os.ReadFile(certFile)
				pool = x509.NewCertPool()
				pool.AppendCertsFromPEM(pem)
			}
			s, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Start(); err != nil {
				b.Fatal(err)
			}
			defer s.Shutdown(context.Background())
			c, closeFn := p.newClient(pool)
			defer closeFn()
			url := s.URL() + "/bench"
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Get(url)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
