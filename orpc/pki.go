package orpc

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"tandem/internal/statefile"
)

// File names in a state directory.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
	TokenFile    = "join-token"
)

// Certificate lifetimes.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	NodeValidity = 365 * 24 * time.Hour
)

// CA is a cluster certificate authority: an ECDSA P-256 key and a self-signed certificate.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a CA in memory.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"tandem"}},
		NotBefore:             time.Now().Add(-5 * time.Minute),
		NotAfter:              time.Now().Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadOrCreateCA loads the CA from dir (ca.crt, ca.key) or, if there is none, creates one
// and writes it there (the key with mode 0600). created reports a new CA.
//
// The certificate is the CA's commit point: Save writes the key first and the certificate
// last, each atomically, and nothing is signed before both are on disk. So a key without a
// certificate is a first start that was killed in between: that key never signed anything.
// It is set aside as ca.key.orphaned (not deleted: it is key material), a warning is logged
// on log (slog.Default if nil), and a new CA is made. A certificate without its key cannot
// be repaired here (the certificates issued under it need that key): it is an error naming
// both files and what to do.
func LoadOrCreateCA(dir string, log *slog.Logger) (ca *CA, created bool, err error) {
	if log == nil {
		log = slog.Default()
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certExists, err := exists(certPath)
	if err != nil {
		return nil, false, err
	}
	keyExists, err := exists(keyPath)
	if err != nil {
		return nil, false, err
	}
	switch {
	case certExists && !keyExists:
		return nil, false, fmt.Errorf("orpc: %s exists but its private key %s does not: restore %s from a backup, "+
			"or remove %s to make a new cluster CA (every engine must then join again: remove its state directory's %s)",
			certPath, keyPath, CAKeyFile, certPath, NodeCertFile)
	case keyExists && !certExists:
		aside := keyPath + ".orphaned"
		if err := os.Rename(keyPath, aside); err != nil {
			return nil, false, fmt.Errorf("orpc: setting aside the key of an unfinished CA: %w", err)
		}
		log.Warn("orpc: the state directory held a CA key without its certificate: an earlier first start was interrupted "+
			"before the CA was complete, so that key never signed anything; making a new CA", "dir", dir, "set_aside", aside)
		fallthrough
	case !certExists:
		ca, err := NewCA("tandem cluster CA")
		if err != nil {
			return nil, false, err
		}
		if err := ca.Save(dir); err != nil {
			return nil, false, err
		}
		return ca, true, nil
	}
	ca, err = LoadCA(certPath, keyPath)
	return ca, false, err
}

// exists reports whether path exists (an error other than "does not exist" is returned).
func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, err
}

// LoadCA reads a CA certificate and its private key from PEM files (for a CA given by
// flags).
func LoadCA(certFile, keyFile string) (*CA, error) {
	cert, err := readCertFile(certFile)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("orpc: %s is not a CA certificate", certFile)
	}
	key, err := readKeyFile(keyFile)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("orpc: %s does not match the certificate in %s", keyFile, certFile)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Save writes ca.key (0600) and then ca.crt into dir, creating it (0700) if needed. The
// certificate is the commit point (see LoadOrCreateCA): an existing one is removed first,
// so that a crash in between never pairs one CA's certificate with another's key.
func (ca *CA) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyPEM, err := keyToPEM(ca.Key)
	if err != nil {
		return err
	}
	certPath := filepath.Join(dir, CACertFile)
	if err := statefile.Remove(certPath); err != nil {
		return err
	}
	if err := statefile.Write(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	return statefile.Write(certPath, certToPEM(ca.Cert), 0o644)
}

// PEM returns the CA's certificate and key encoded as Save writes them to ca.crt and
// ca.key (the operator keeps them in a Secret instead of a directory).
func (ca *CA) PEM() (cert, key []byte, err error) {
	key, err = keyToPEM(ca.Key)
	if err != nil {
		return nil, nil, err
	}
	return certToPEM(ca.Cert), key, nil
}

// Issue signs a node certificate for pub: CN = name, usable as both TLS client and server,
// with hosts (DNS names or IPs) as subject alternative names.
func (ca *CA) Issue(name string, hosts []string, pub crypto.PublicKey, validity time.Duration) (*x509.Certificate, error) {
	if err := checkNodeName(name); err != nil {
		return nil, err
	}
	if validity <= 0 {
		validity = NodeValidity
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"tandem"}},
		NotBefore:    time.Now().Add(-5 * time.Minute),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// NewIdentity makes a key and a certificate signed by the CA, for a process that holds the CA
// (the router) or for tests.
func (ca *CA) NewIdentity(name string, hosts []string) (*Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, err := ca.Issue(name, hosts, key.Public(), NodeValidity)
	if err != nil {
		return nil, err
	}
	return newIdentity(cert, key, ca.Cert), nil
}

// Identity is a node's certificate and key plus the cluster CA it trusts.
type Identity struct {
	Name   string
	Cert   *x509.Certificate
	Key    crypto.Signer
	CACert *x509.Certificate
}

func newIdentity(cert *x509.Certificate, key crypto.Signer, ca *x509.Certificate) *Identity {
	return &Identity{Name: cert.Subject.CommonName, Cert: cert, Key: key, CACert: ca}
}

// ErrNoIdentity is the error of LoadIdentity for a state directory that holds no node
// identity (no node.crt).
var ErrNoIdentity = errors.New("orpc: no node identity")

// LoadIdentity reads node.crt, node.key and ca.crt from dir and checks that the certificate
// is valid now and signed by the CA. node.crt is the identity's commit point (Save writes it
// last): without it there is no identity, whatever else dir holds (a join interrupted before
// it finished), and the error matches ErrNoIdentity and fs.ErrNotExist. Any other failure
// names the file at fault.
func LoadIdentity(dir string) (*Identity, error) {
	certPath, keyPath, caPath := filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile), filepath.Join(dir, CACertFile)
	cert, err := readCertFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNoIdentity, err)
	}
	if err != nil {
		return nil, err
	}
	key, err := readKeyFile(keyPath)
	if err != nil {
		return nil, err
	}
	ca, err := readCertFile(caPath)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("orpc: %s does not match %s", keyPath, certPath)
	}
	id := newIdentity(cert, key, ca)
	if err := id.check(); err != nil {
		return nil, fmt.Errorf("orpc: %s: %w", certPath, err)
	}
	return id, nil
}

func (id *Identity) check() error {
	_, err := id.Cert.Verify(x509.VerifyOptions{
		Roots:     id.roots(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("node certificate %q is not valid under the cluster CA: %w", id.Name, err)
	}
	return nil
}

// Save writes node.key (0600), ca.crt and then node.crt into dir, creating it (0700) if
// needed. node.crt is the commit point (see LoadIdentity): an existing one is removed
// first, so that a crash in between never pairs one identity's certificate with another's
// key or CA.
func (id *Identity) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyPEM, err := keyToPEM(id.Key)
	if err != nil {
		return err
	}
	certPath := filepath.Join(dir, NodeCertFile)
	if err := statefile.Remove(certPath); err != nil {
		return err
	}
	if err := statefile.Write(filepath.Join(dir, NodeKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := statefile.Write(filepath.Join(dir, CACertFile), certToPEM(id.CACert), 0o644); err != nil {
		return err
	}
	return statefile.Write(certPath, certToPEM(id.Cert), 0o644)
}

func (id *Identity) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(id.CACert)
	return p
}

func (id *Identity) tlsCert() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{id.Cert.Raw}, PrivateKey: id.Key, Leaf: id.Cert}
}

// ServerTLS returns the TLS configuration for serving ORPC: TLS 1.3, this node's certificate,
// and a client certificate required and verified against the cluster CA (the equivalent of
// tls.RequireAndVerifyClientCert, done in VerifyPeerCertificate so that a refusal says why).
// Connections offering only the ALPN "orpc-join/1" get a configuration without client
// certificates; the Server lets them call nothing but the join method, and only if
// EnableJoin was called.
func (id *Identity) ServerTLS() *tls.Config {
	cert := id.tlsCert()
	base := &tls.Config{
		MinVersion:            tls.VersionTLS13,
		Certificates:          []tls.Certificate{cert},
		ClientAuth:            tls.RequireAnyClientCert,
		VerifyPeerCertificate: verifyChain(id.roots(), x509.ExtKeyUsageClientAuth, "client"),
		NextProtos:            []string{ALPN},
	}
	join := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.NoClientCert,
		NextProtos:   []string{ALPNJoin},
	}
	c := base.Clone()
	c.NextProtos = []string{ALPN, ALPNJoin}
	c.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
		if !slices.Contains(hi.SupportedProtos, ALPN) && slices.Contains(hi.SupportedProtos, ALPNJoin) {
			return join, nil
		}
		return base, nil
	}
	return c
}

// ClientTLS returns the TLS configuration for dialing ORPC peers: TLS 1.3, this node's
// certificate, and the peer's certificate verified against the cluster CA. Host names are
// not checked: in the cluster a peer's identity is its CA-signed certificate (its name is
// Client.PeerName), not the address it was reached at.
func (id *Identity) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.tlsCert()},
		// The chain is verified against the cluster CA in VerifyPeerCertificate.
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: verifyChain(id.roots(), x509.ExtKeyUsageServerAuth, "server"),
		NextProtos:            []string{ALPN},
	}
}

// verifyChain verifies a peer's certificate chain against the cluster CA.
func verifyChain(roots *x509.CertPool, usage x509.ExtKeyUsage, role string) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return fmt.Errorf("orpc: the %s presented no certificate; it must have one signed by this cluster's CA (join the cluster first)", role)
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, b := range raw {
			c, err := x509.ParseCertificate(b)
			if err != nil {
				return fmt.Errorf("orpc: the %s's certificate does not parse: %w", role, err)
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
		if err != nil {
			return fmt.Errorf("orpc: the %s's certificate (CN=%q, issuer %q) is not accepted by this cluster's CA: %w",
				role, certs[0].Subject.CommonName, certs[0].Issuer.CommonName, err)
		}
		return nil
	}
}

// Token is a join token in kubeadm's bootstrap-token format "id.secret": a 6-character
// public id and a 16-character secret, both [a-z0-9].
type Token struct {
	ID     string
	Secret string
}

var tokenRE = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

// String returns "id.secret".
func (t Token) String() string { return t.ID + "." + t.Secret }

// ParseToken parses "id.secret".
func ParseToken(s string) (Token, error) {
	m := tokenRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return Token{}, errors.New(`orpc: malformed join token: want "[a-z0-9]{6}.[a-z0-9]{16}"`)
	}
	return Token{ID: m[1], Secret: m[2]}, nil
}

// GenerateToken makes a random token with crypto/rand (about 83 bits in the secret).
func GenerateToken() (Token, error) {
	id, err := randChars(6)
	if err != nil {
		return Token{}, err
	}
	secret, err := randChars(16)
	if err != nil {
		return Token{}, err
	}
	return Token{ID: id, Secret: secret}, nil
}

// LoadOrCreateToken returns the cluster's join token: given (if not empty, stored in dir),
// else the one stored in dir/join-token, else a new one (stored, mode 0600). created reports
// a new token, which the caller should print.
func LoadOrCreateToken(dir, given string) (tok Token, created bool, err error) {
	path := filepath.Join(dir, TokenFile)
	if given != "" {
		tok, err := ParseToken(given)
		if err != nil {
			return Token{}, false, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Token{}, false, err
		}
		return tok, false, statefile.Write(path, []byte(tok.String()+"\n"), 0o600)
	}
	b, err := os.ReadFile(path)
	if err == nil {
		tok, err := ParseToken(string(b))
		if err != nil {
			return Token{}, false, fmt.Errorf("%s: %w", path, err)
		}
		return tok, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Token{}, false, err
	}
	tok, err = GenerateToken()
	if err != nil {
		return Token{}, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Token{}, false, err
	}
	return tok, true, statefile.Write(path, []byte(tok.String()+"\n"), 0o600)
}

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randChars(n int) (string, error) {
	out := make([]byte, 0, n)
	var buf [32]byte
	for len(out) < n {
		if _, err := rand.Read(buf[:]); err != nil {
			return "", err
		}
		for _, b := range buf {
			if b < 252 && len(out) < n { // 252 = 7*36: no modulo bias
				out = append(out, tokenAlphabet[b%36])
			}
		}
	}
	return string(out), nil
}

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func checkNodeName(name string) error {
	if !nodeNameRE.MatchString(name) {
		return fmt.Errorf("orpc: invalid node name %q: want 1-63 of [A-Za-z0-9._-]", name)
	}
	return nil
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

func certToPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyToPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func readCertFile(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("orpc: %s: no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("orpc: %s: %w", path, err)
	}
	return c, nil
}

func readKeyFile(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("orpc: %s: no PEM key", path)
	}
	var k any
	switch blk.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("orpc: %s: unsupported PEM block %q", path, blk.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("orpc: %s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("orpc: %s: key cannot sign", path)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
