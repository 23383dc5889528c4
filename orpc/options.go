package orpc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/quic-go/quic-go"
)

// Defaults for the Options.
const (
	// DefaultKeepAlive is half the idle timeout, the most quic-go allows. A keepalive goes
	// only after that long without a packet from the peer: it keeps a quiet connection
	// open, and a peer that does not answer it still has the whole idle timeout from then
	// on (so a dead peer on a quiet connection is noticed 7.5 s after its last packet at
	// most, against 6 s with the 1 s used until 2026-12). At 1 s it added a PING and its
	// ACK every second to each worker's registration connection, which the router's beats
	// (every heartbeat timeout, 2 s by default) now keep open.
	DefaultKeepAlive        = DefaultIdleTimeout / 2
	DefaultIdleTimeout      = 5 * time.Second
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultMaxCalls         = 1024
)

// An Option configures a Server or a Client.
type Option func(*options)

type options struct {
	keepAlive        time.Duration
	idleTimeout      time.Duration
	handshakeTimeout time.Duration
	maxFrame         int
	maxCalls         int64
	logger           *slog.Logger
	agent            string
	onHandshakeError func(error)
}

func buildOptions(opts []Option) options {
	o := options{
		keepAlive:        DefaultKeepAlive,
		idleTimeout:      DefaultIdleTimeout,
		handshakeTimeout: DefaultHandshakeTimeout,
		maxFrame:         DefaultMaxFrameSize,
		maxCalls:         DefaultMaxCalls,
		logger:           slog.Default(),
		agent:            "tandem-orpc",
	}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithKeepAlive sets how long a connection goes without a packet from its peer before it
// sends a keepalive (default 2.5 s; at most half the idle timeout).
func WithKeepAlive(d time.Duration) Option { return func(o *options) { o.keepAlive = d } }

// WithIdleTimeout sets how long a connection may go without hearing from its peer before it
// is declared dead and its calls fail with Unavailable (default 5s; the smaller of the two
// sides' values applies).
func WithIdleTimeout(d time.Duration) Option { return func(o *options) { o.idleTimeout = d } }

// WithHandshakeTimeout bounds the QUIC/TLS handshake, the HELLO exchange and the arrival of a
// call's request (default 5s).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(o *options) { o.handshakeTimeout = d }
}

// WithMaxFrameSize bounds the payload of a received message frame (default 16 MiB). Larger
// messages fail with ResourceExhausted.
func WithMaxFrameSize(n int) Option { return func(o *options) { o.maxFrame = n } }

// WithMaxConcurrentCalls bounds the calls a peer may have open on one connection (default
// 1024); further calls wait for a free slot.
func WithMaxConcurrentCalls(n int64) Option { return func(o *options) { o.maxCalls = n } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithAgent sets the agent string sent in HELLO (for logs only).
func WithAgent(s string) Option { return func(o *options) { o.agent = s } }

// OnHandshakeError registers a function called with every peer certificate the server
// rejects (it is logged either way).
func OnHandshakeError(f func(error)) Option { return func(o *options) { o.onHandshakeError = f } }

func (o *options) quicConfig() *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           o.handshakeTimeout,
		MaxIdleTimeout:                 o.idleTimeout,
		KeepAlivePeriod:                o.keepAlive,
		MaxIncomingStreams:             o.maxCalls + 1, // + the control stream
		MaxIncomingUniStreams:          -1,
		InitialStreamReceiveWindow:     1 << 20,
		MaxStreamReceiveWindow:         16 << 20,
		InitialConnectionReceiveWindow: 2 << 20,
		MaxConnectionReceiveWindow:     64 << 20,
	}
}

// QUIC application error codes used when a connection or stream is closed by ORPC itself.
// Streams reset because a call failed carry the call's status Code instead.
const (
	connCodeNoError     quic.ApplicationErrorCode = 0
	connCodeProtocol    quic.ApplicationErrorCode = 1
	connCodeVersion     quic.ApplicationErrorCode = 2
	connCodeJoinRefused quic.ApplicationErrorCode = 3
)

// Peer describes the other end of a call, for handlers.
type Peer struct {
	Addr net.Addr
	// Name is the common name of the peer's verified certificate ("" on join connections).
	Name string
	// Certificates is the peer's certificate chain as presented.
	Certificates []*x509.Certificate

	conn *quic.Conn
}

// Done is closed when the connection to the peer ends, whatever ended it (a close by
// either side, QUIC's idle timeout). A handler's context ends then too, and also for
// reasons of its own call (the caller's cancel, its deadline).
func (p *Peer) Done() <-chan struct{} { return p.conn.Context().Done() }

type peerKey struct{}
type incomingMDKey struct{}
type outgoingMDKey struct{}

// PeerFromContext returns the peer of the call whose handler received ctx.
func PeerFromContext(ctx context.Context) (*Peer, bool) {
	p, ok := ctx.Value(peerKey{}).(*Peer)
	return p, ok
}

// IncomingMetadata returns the metadata the caller sent with the call.
func IncomingMetadata(ctx context.Context) Metadata {
	md, _ := ctx.Value(incomingMDKey{}).(Metadata)
	return md
}

// WithOutgoingMetadata returns a context whose calls carry md.
func WithOutgoingMetadata(ctx context.Context, md Metadata) context.Context {
	return context.WithValue(ctx, outgoingMDKey{}, md)
}

func newPeer(conn *quic.Conn) *Peer {
	p := &Peer{Addr: conn.RemoteAddr(), conn: conn}
	if certs := conn.ConnectionState().TLS.PeerCertificates; len(certs) > 0 {
		p.Certificates = certs
		p.Name = certs[0].Subject.CommonName
	}
	return p
}

// describeConnError explains why a connection ended, or failed to start, in words.
func describeConnError(err error) string {
	if err == nil {
		return "connection closed"
	}
	if te, ok := errors.AsType[*quic.TransportError](err); ok && te.ErrorCode.IsCryptoError() {
		if te.Remote {
			return fmt.Sprintf("the peer refused the TLS handshake (%v): our certificate is probably not signed by its cluster CA, or we offered none", te)
		}
		return fmt.Sprintf("TLS handshake failed: %v", te)
	}
	if ae, ok := errors.AsType[*quic.ApplicationError](err); ok {
		who := "we"
		if ae.Remote {
			who = "the peer"
		}
		if ae.ErrorMessage != "" {
			return fmt.Sprintf("%s closed the connection: %s", who, ae.ErrorMessage)
		}
		return who + " closed the connection"
	}
	if _, ok := errors.AsType[*quic.IdleTimeoutError](err); ok {
		return "peer unresponsive (idle timeout): it died or the network is down"
	}
	if _, ok := errors.AsType[*quic.HandshakeTimeoutError](err); ok {
		return "handshake timed out: nothing answering at that address?"
	}
	return err.Error()
}
