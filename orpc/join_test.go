package orpc

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// router is a stand-in for tandem-router: CA and token in a state dir, join enabled.
type router struct {
	ca    *CA
	tok   Token
	id    *Identity
	s     *Server
	addr  string
	log   *syncBuffer
	mu    sync.Mutex
	peers []string
}

func startRouter(t *testing.T, stateDir string) *router {
	t.Helper()
	ca, created, err := LoadOrCreateCA(stateDir, quietLogger())
	if err != nil || !created {
		t.Fatalf("LoadOrCreateCA: created=%v err=%v", created, err)
	}
	tok, created, err := LoadOrCreateToken(stateDir, "")
	if err != nil || !created {
		t.Fatalf("LoadOrCreateToken: created=%v err=%v", created, err)
	}
	id, err := ca.NewIdentity("router", []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	r := &router{ca: ca, tok: tok, id: id, log: &syncBuffer{}}
	r.s = NewServer(WithLogger(slog.New(slog.NewTextHandler(r.log, nil))))
	r.s.EnableJoin(JoinConfig{CA: ca, Tokens: func() []Token { return []Token{tok} }})
	r.s.HandleUnary("router.Hello", func(ctx context.Context, req []byte) ([]byte, error) {
		p, _ := PeerFromContext(ctx)
		r.mu.Lock()
		r.peers = append(r.peers, p.Name)
		r.mu.Unlock()
		return []byte("hello " + p.Name), nil
	})
	r.addr, _ = serve(t, r.s, id)
	return r
}

func TestJoinFlow(t *testing.T) {
	routerDir := t.TempDir()
	r := startRouter(t, routerDir)

	// The router's state dir holds the CA and token; secrets are 0600.
	for _, f := range []string{CAKeyFile, TokenFile} {
		fi, err := os.Stat(filepath.Join(routerDir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi.Mode(), err)
		}
	}
	// A restart loads the same CA and token.
	ca2, created, err := LoadOrCreateCA(routerDir, quietLogger())
	if err != nil || created || !ca2.Cert.Equal(r.ca.Cert) {
		t.Fatalf("reload CA: %v %v", created, err)
	}
	tok2, created, err := LoadOrCreateToken(routerDir, "")
	if err != nil || created || tok2 != r.tok {
		t.Fatalf("reload token: %v %v %v", tok2, created, err)
	}

	// An engine joins with the token printed by the router.
	workerDir := t.TempDir()
	ctx := testCtx(t)
	tok, err := ParseToken(r.tok.String())
	if err != nil {
		t.Fatal(err)
	}
	id, joined, err := JoinOrLoad(ctx, workerDir, r.addr, tok, "worker-1", []string{"127.0.0.1"}, WithLogger(quietLogger()))
	if err != nil || !joined {
		t.Fatalf("join: joined=%v err=%v", joined, err)
	}
	if !strings.Contains(r.log.String(), "node joined") {
		t.Errorf("router log lacks the join: %s", r.log.String())
	}
	if id.Name != "worker-1" || !id.CACert.Equal(r.ca.Cert) {
		t.Fatalf("identity %q", id.Name)
	}
	fi, err := os.Stat(filepath.Join(workerDir, NodeKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node key: %v %v", fi.Mode(), err)
	}
	// A restart loads the identity instead of joining again.
	id2, joined, err := JoinOrLoad(ctx, workerDir, "127.0.0.1:1", Token{}, "worker-1", nil)
	if err != nil || joined || !id2.Cert.Equal(id.Cert) {
		t.Fatalf("reload identity: joined=%v err=%v", joined, err)
	}

	// From now on connections are mutually authenticated.
	c := dial(t, r.addr, id2)
	b, err := c.CallBytes(ctx, "router.Hello", nil)
	if err != nil || string(b) != "hello worker-1" {
		t.Fatalf("call: %q %v", b, err)
	}
	if c.PeerName() != "router" {
		t.Fatalf("router name %q", c.PeerName())
	}

	// Workers serve each other (and the router) with the same certificate.
	ws := NewServer(WithLogger(quietLogger()))
	ws.HandleUnary("worker.Ping", func(ctx context.Context, req []byte) ([]byte, error) {
		p, _ := PeerFromContext(ctx)
		return []byte("pong " + p.Name), nil
	})
	waddr, _ := serve(t, ws, id2)
	rc := dial(t, waddr, r.id)
	if b, err := rc.CallBytes(ctx, "worker.Ping", nil); err != nil || string(b) != "pong router" {
		t.Fatalf("router→worker: %q %v", b, err)
	}

	// Join connections can reach only the join method.
	jc, err := Dial(ctx, r.addr, joinTLS(), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer jc.Close()
	if _, err := jc.CallBytes(ctx, "router.Hello", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("join connection reached a method: %v", err)
	}
}

func TestJoinWrongToken(t *testing.T) {
	r := startRouter(t, t.TempDir())
	ctx := testCtx(t)
	cases := map[string]Token{
		"wrong secret": {ID: r.tok.ID, Secret: "0123456789abcdef"},
		"unknown id":   {ID: "zzzzzz", Secret: r.tok.Secret},
	}
	for name, tok := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			_, _, err := JoinOrLoad(ctx, dir, r.addr, tok, "intruder", nil, WithLogger(quietLogger()))
			t.Logf("joiner: %v", err)
			if !errors.Is(err, ErrJoinTokenRejected) || !strings.Contains(err.Error(), "join token rejected") {
				t.Fatalf("err %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, NodeCertFile)); err == nil {
				t.Fatal("a certificate was stored")
			}
		})
	}
	if got := r.log.String(); strings.Count(got, "join token rejected") != 2 {
		t.Fatalf("router log: %s", got)
	}
}

func TestJoinDisabled(t *testing.T) {
	env := newEnv(t, func(s *Server) {})
	_, err := Join(testCtx(t), env.addr, Token{ID: "abcdef", Secret: "0123456789abcdef"}, "w", nil, WithLogger(quietLogger()))
	t.Logf("joiner: %v", err)
	if err == nil || !strings.Contains(err.Error(), "does not accept joins") {
		t.Fatalf("err %v", err)
	}
}

// TestJoinRefusesImpostor: a server that does not know the token (a man in the middle, or a
// wrong address) cannot make the joiner trust its CA, even if it accepts any token.
func TestJoinRefusesImpostor(t *testing.T) {
	evilCA, evilID, _ := newPKI(t)
	evil := NewServer(WithLogger(quietLogger()))
	evil.join = &joinService{s: evil, h: func(ctx context.Context, b []byte) ([]byte, error) {
		var req joinRequest
		if err := Unmarshal(b, &req); err != nil {
			return nil, err
		}
		cert, err := evilCA.Issue("victim", nil, evilID.Key.Public(), time.Hour)
		if err != nil {
			return nil, err
		}
		resp := joinResponse{CACert: evilCA.Cert.Raw, Cert: cert.Raw, Proof: make([]byte, 32)}
		return Marshal(&resp), nil
	}}
	addr, _ := serve(t, evil, evilID)
	_, err := Join(testCtx(t), addr, Token{ID: "abcdef", Secret: "0123456789abcdef"}, "victim", nil, WithLogger(quietLogger()))
	t.Logf("joiner: %v", err)
	if err == nil || !strings.Contains(err.Error(), "could not prove it knows the join token") {
		t.Fatalf("err %v", err)
	}
}

func TestForeignCertificateRefused(t *testing.T) {
	var mu sync.Mutex
	var serverSide []error
	ourCA, srvID, _ := newPKI(t)
	_, _, foreignID := newPKI(t) // another cluster's CA
	// A node of another cluster that trusts our CA (so that only the server's check bites).
	intruder := &Identity{Name: foreignID.Name, Cert: foreignID.Cert, Key: foreignID.Key, CACert: ourCA.Cert}
	s := NewServer(WithLogger(quietLogger()), OnHandshakeError(func(err error) {
		mu.Lock()
		serverSide = append(serverSide, err)
		mu.Unlock()
	}))
	s.HandleUnary("x", func(ctx context.Context, req []byte) ([]byte, error) { return nil, nil })
	addr, _ := serve(t, s, srvID)
	ctx := testCtx(t)

	// A client from another cluster is refused by the server.
	_, err := Dial(ctx, addr, intruder.ClientTLS(), WithLogger(quietLogger()))
	t.Logf("client side: %v", err)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("foreign client: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		n := len(serverSide)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if len(serverSide) == 0 || !strings.Contains(serverSide[0].Error(), "not accepted by this cluster's CA") {
		t.Fatalf("server side: %v", serverSide)
	}
	t.Logf("server side: %v", serverSide[0])
	mu.Unlock()

	// A server from another cluster is refused by the client.
	fs := NewServer(WithLogger(quietLogger()))
	faddr, _ := serve(t, fs, foreignID)
	_, _, cliID := newPKI(t)
	_, err = Dial(ctx, faddr, cliID.ClientTLS(), WithLogger(quietLogger()))
	t.Logf("client dialing a foreign server: %v", err)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "server's certificate") {
		t.Fatalf("foreign server: %v", err)
	}

	// A client without any certificate is refused too.
	noCert := cliID.ClientTLS()
	noCert.Certificates = nil
	noCert.VerifyPeerCertificate = nil
	_, err = Dial(ctx, addr, noCert, WithLogger(quietLogger()))
	t.Logf("client without certificate: %v", err)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no cert: %v", err)
	}
}

func TestTokens(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, err := GenerateToken()
		if err != nil {
			t.Fatal(err)
		}
		if !tokenRE.MatchString(tok.String()) || seen[tok.String()] {
			t.Fatalf("token %q", tok)
		}
		seen[tok.String()] = true
		back, err := ParseToken(tok.String())
		if err != nil || back != tok {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"", "abcdef", "abcdef.0123456789abcde", "ABCDEF.0123456789abcdef", "abcdef:0123456789abcdef"} {
		if _, err := ParseToken(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
	dir := t.TempDir()
	given := "abcdef.0123456789abcdef"
	tok, created, err := LoadOrCreateToken(dir, given)
	if err != nil || created || tok.String() != given {
		t.Fatal(tok, created, err)
	}
	tok, created, err = LoadOrCreateToken(dir, "")
	if err != nil || created || tok.String() != given {
		t.Fatal(tok, created, err)
	}
}

// joinTLS is the TLS configuration of a join connection (no client certificate).
func joinTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{ALPNJoin}, InsecureSkipVerify: true}
}
