package orpc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// JoinMethod is the only method a join connection (ALPN "orpc-join/1") may call.
const JoinMethod = "orpc.Join"

// Labels of the join proofs and the TLS exporter; see docs/orpc.md.
const (
	joinExporterLabel = "EXPORTER-orpc-join/1"
	joinClientLabel   = "orpc-join/1 client proof"
	joinServerLabel   = "orpc-join/1 server proof"
)

// ErrJoinTokenRejected is the error of a join whose token the server does not accept.
var ErrJoinTokenRejected = &Status{Code: Unauthenticated, Message: "join token rejected"}

// JoinConfig lets a Server admit new nodes: a node that proves it knows a token gets a
// certificate signed by CA.
type JoinConfig struct {
	CA *CA
	// Tokens returns the tokens accepted now (called on every join).
	Tokens func() []Token
	// Validity of issued certificates (default NodeValidity).
	Validity time.Duration
	// OnJoin, if set, is told of every certificate issued.
	OnJoin func(name string, cert *x509.Certificate)
	// Limits bounds the attempts per client address (zero fields: DefaultJoinLimits).
	Limits JoinLimits
	// OnRefused, if set, is told of every attempt refused, with its reason: JoinRefusedToken,
	// JoinRefusedRateLimited or JoinRefusedBadRequest (for a metric).
	OnRefused func(reason string)
}

// Reasons a join attempt is refused, as JoinConfig.OnRefused is told them.
const (
	JoinRefusedToken       = "token"        // not a token the server accepts
	JoinRefusedRateLimited = "rate_limited" // too many attempts, or too many rejected ones, from its address
	JoinRefusedBadRequest  = "bad_request"  // a request or certificate request that does not parse or is invalid
)

type joinService struct {
	cfg JoinConfig
	s   *Server
	h   UnaryFunc

	mu  sync.Mutex
	lim *joinLimiter
}

// EnableJoin makes the server answer joins (connections with ALPN "orpc-join/1").
func (s *Server) EnableJoin(cfg JoinConfig) {
	if cfg.CA == nil || cfg.Tokens == nil {
		panic("orpc: EnableJoin needs a CA and Tokens")
	}
	s.mu.Lock()
	j := &joinService{cfg: cfg, s: s, lim: newJoinLimiter(cfg.Limits)}
	j.h = j.handle
	s.join = j
	s.mu.Unlock()
}

func (j *joinService) lookup(method string) (handler, bool) {
	if method != JoinMethod {
		return handler{}, false
	}
	return handler{unary: j.h}, true
}

// joinRequest is the joiner's message: the token id, a CSR, and the MAC proving the secret.
type joinRequest struct {
	TokenID string
	CSR     []byte
	Proof   []byte
}

func (r *joinRequest) MarshalORPC(e *Encoder) {
	e.String(r.TokenID)
	e.BytesField(r.CSR)
	e.BytesField(r.Proof)
}

func (r *joinRequest) UnmarshalORPC(d *Decoder) error {
	r.TokenID = d.String()
	r.CSR = d.BytesField()
	r.Proof = d.BytesField()
	return d.Err()
}

// joinResponse is the server's answer: the CA, the issued certificate and the server's MAC.
type joinResponse struct {
	CACert []byte
	Cert   []byte
	Proof  []byte
}

func (r *joinResponse) MarshalORPC(e *Encoder) {
	e.BytesField(r.CACert)
	e.BytesField(r.Cert)
	e.BytesField(r.Proof)
}

func (r *joinResponse) UnmarshalORPC(d *Decoder) error {
	r.CACert = d.BytesField()
	r.Cert = d.BytesField()
	r.Proof = d.BytesField()
	return d.Err()
}

// joinMAC is HMAC-SHA256 keyed by the token secret over the label, the TLS channel binding
// and the given fields, each length-prefixed.
func joinMAC(secret, label string, binding []byte, fields ...[]byte) []byte {
	var e Encoder
	e.String(label)
	e.BytesField(binding)
	for _, f := range fields {
		e.BytesField(f)
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(e.Bytes())
	return m.Sum(nil)
}

// channelBinding is the TLS 1.3 exporter of the connection: equal on both ends of one TLS
// session, different on each leg of a man in the middle.
func channelBinding(conn *quic.Conn) ([]byte, error) {
	st := conn.ConnectionState().TLS
	b, err := st.ExportKeyingMaterial(joinExporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("orpc: TLS exporter: %w", err)
	}
	return b, nil
}

// refused counts a refused attempt.
func (j *joinService) refused(reason string) {
	if j.cfg.OnRefused != nil {
		j.cfg.OnRefused(reason)
	}
}

// rejected charges a rejected attempt from addr and counts it.
func (j *joinService) rejected(addr, reason string) {
	j.mu.Lock()
	j.lim.reject(addr, time.Now())
	j.mu.Unlock()
	j.refused(reason)
}

func (j *joinService) handle(ctx context.Context, b []byte) ([]byte, error) {
	peer, _ := PeerFromContext(ctx)
	addr := addrKey(peer.Addr)
	j.mu.Lock()
	ok, log, n := j.lim.allow(addr, time.Now())
	j.mu.Unlock()
	if !ok {
		j.refused(JoinRefusedRateLimited)
		if log {
			j.s.o.logger.Warn("orpc: join attempts refused: too many, or too many rejected, from this address",
				"peer", addr, "refused", n, "log_interval", j.lim.lim.LogInterval)
		}
		return nil, Errorf(ResourceExhausted, "join: too many attempts from %s; retry later", addr)
	}
	var req joinRequest
	if err := Unmarshal(b, &req); err != nil {
		j.rejected(addr, JoinRefusedBadRequest)
		return nil, Errorf(InvalidArgument, "join request: %v", err)
	}
	binding, err := channelBinding(peer.conn)
	if err != nil {
		return nil, Errorf(Internal, "%v", err)
	}
	var tok Token
	found := false
	for _, t := range j.cfg.Tokens() {
		if t.ID == req.TokenID {
			tok, found = t, true
			break
		}
	}
	if !found || !hmac.Equal(req.Proof, joinMAC(tok.Secret, joinClientLabel, binding, []byte(req.TokenID), req.CSR)) {
		j.s.o.logger.Warn("orpc: join token rejected", "peer", peer.Addr, "token_id", req.TokenID, "known_id", found)
		j.rejected(addr, JoinRefusedToken)
		return nil, ErrJoinTokenRejected
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		j.rejected(addr, JoinRefusedBadRequest)
		return nil, Errorf(InvalidArgument, "join: bad certificate request: %v", err)
	}
	hosts := append([]string(nil), csr.DNSNames...)
	for _, ip := range csr.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	cert, err := j.cfg.CA.Issue(csr.Subject.CommonName, hosts, csr.PublicKey, j.cfg.Validity)
	if err != nil {
		j.rejected(addr, JoinRefusedBadRequest)
		return nil, Errorf(InvalidArgument, "join: %v", err)
	}
	resp := joinResponse{CACert: j.cfg.CA.Cert.Raw, Cert: cert.Raw}
	resp.Proof = joinMAC(tok.Secret, joinServerLabel, binding, []byte(req.TokenID), req.CSR, resp.CACert, resp.Cert)
	j.s.o.logger.Info("orpc: node joined", "peer", peer.Addr, "name", cert.Subject.CommonName, "token_id", tok.ID)
	if j.cfg.OnJoin != nil {
		j.cfg.OnJoin(cert.Subject.CommonName, cert)
	}
	return Marshal(&resp), nil
}

// Join obtains a node identity from the cluster at addr by proving the token: it sends a
// certificate request for name (with hosts as alternative names) and gets back a certificate
// signed by the cluster CA, and the CA itself, both authenticated by the token. A wrong token
// fails with an error matching ErrJoinTokenRejected.
func Join(ctx context.Context, addr string, tok Token, name string, hosts []string, opts ...Option) (*Identity, error) {
	if err := checkNodeName(name); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, err
	}

	var serverChain []*x509.Certificate
	tc := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPNJoin},
		// We do not know the CA yet. The server is authenticated below: its proof is a MAC
		// with the token secret over this TLS session's exporter and the CA it sends, and its
		// TLS certificate must then chain to that CA.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			serverChain = cs.PeerCertificates
			return nil
		},
	}
	c, err := Dial(ctx, addr, tc, opts...)
	if err != nil {
		return nil, fmt.Errorf("orpc: join %s: %w", addr, err)
	}
	defer c.Close()
	binding, err := channelBinding(c.conn)
	if err != nil {
		return nil, err
	}
	req := joinRequest{TokenID: tok.ID, CSR: csr}
	req.Proof = joinMAC(tok.Secret, joinClientLabel, binding, []byte(tok.ID), csr)
	var resp joinResponse
	if err := c.Call(ctx, JoinMethod, &req, &resp); err != nil {
		if errors.Is(err, ErrJoinTokenRejected) {
			return nil, fmt.Errorf("orpc: join %s: the server rejected our join token (check --join-token): %w", addr, err)
		}
		return nil, fmt.Errorf("orpc: join %s: %w", addr, err)
	}
	want := joinMAC(tok.Secret, joinServerLabel, binding, []byte(tok.ID), csr, resp.CACert, resp.Cert)
	if !hmac.Equal(resp.Proof, want) {
		return nil, fmt.Errorf("orpc: join %s: the server could not prove it knows the join token (wrong address, or a man in the middle); not trusting its CA", addr)
	}
	caCert, err := x509.ParseCertificate(resp.CACert)
	if err != nil {
		return nil, fmt.Errorf("orpc: join %s: CA certificate: %w", addr, err)
	}
	if !caCert.IsCA {
		return nil, fmt.Errorf("orpc: join %s: the server's CA certificate is not a CA", addr)
	}
	cert, err := x509.ParseCertificate(resp.Cert)
	if err != nil {
		return nil, fmt.Errorf("orpc: join %s: node certificate: %w", addr, err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("orpc: join %s: the issued certificate is not for our key", addr)
	}
	id := newIdentity(cert, key, caCert)
	if err := id.check(); err != nil {
		return nil, fmt.Errorf("orpc: join %s: %w", addr, err)
	}
	var raw [][]byte
	for _, c := range serverChain {
		raw = append(raw, c.Raw)
	}
	if err := verifyChain(id.roots(), x509.ExtKeyUsageServerAuth, "server")(raw, nil); err != nil {
		return nil, fmt.Errorf("orpc: join %s: %w", addr, err)
	}
	return id, nil
}

// JoinOrLoad returns the identity stored in dir if there is a valid one for name (for any
// name if name is ""), else joins the cluster at addr as name (see Join) and stores the
// result in dir. joined reports a new join. With the zero Token it only loads: an identity
// that is missing, does not load (corrupt, expired, not under its CA) or is another node's
// is then an error naming the file.
func JoinOrLoad(ctx context.Context, dir, addr string, tok Token, name string, hosts []string, opts ...Option) (id *Identity, joined bool, err error) {
	id, err = LoadIdentity(dir)
	if err == nil && name != "" && id.Name != name {
		err = fmt.Errorf("orpc: %s is the identity of node %q, not %q", filepath.Join(dir, NodeCertFile), id.Name, name)
	}
	if err == nil {
		return id, false, nil
	}
	if tok == (Token{}) {
		return nil, false, fmt.Errorf("%w; without a join token this node cannot join the cluster again", err)
	}
	id, err = Join(ctx, addr, tok, name, hosts, opts...)
	if err != nil {
		return nil, false, err
	}
	if err := id.Save(dir); err != nil {
		return nil, false, err
	}
	return id, true, nil
}
