package pipeline

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"tandem/orpc"
)

// ErrRefused is the error of a link whose hello a stage refused (another model, split or
// block size): retrying does not help until one side is restarted as the other wants.
var ErrRefused = errors.New("pipeline: the stage refused the replica")

// helloTimeout bounds a link's set-up: the dial, the TLS handshake and the hello's reply
// (which waits for the stages after to take the hello too).
const helloTimeout = 30 * time.Second

// A link is the upstream end of a connection to the next stage: steps go out, results
// come back in their order.
type link struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	buf  []byte
}

// dial opens a link to the stage at addr and says hello; a refused hello is ErrRefused
// with the stage's reason.
func dial(ctx context.Context, addr string, id *orpc.Identity, h *hello) (*link, error) {
	ctx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	d := tls.Dialer{Config: linkClientTLS(id.ClientTLS())}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pipeline: stage %d at %s: %w", h.Index, addr, err)
	}
	if tc, ok := c.(*tls.Conn).NetConn().(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	l := &link{addr: addr, c: c, r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriterSize(c, 1<<20)}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var enc encoder
	if err := l.send(enc.hello(h)); err != nil {
		c.Close()
		return nil, fmt.Errorf("pipeline: stage %d at %s: %w", h.Index, addr, err)
	}
	typ, p, buf, err := readFrame(l.r, nil)
	l.buf = buf
	if err == nil && typ != frameHelloReply {
		err = fmt.Errorf("%w: frame type %d for the hello's reply", errFrame, typ)
	}
	var hr helloReply
	if err == nil {
		hr, err = decodeHelloReply(p)
	}
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("pipeline: stage %d at %s: the hello: %w", h.Index, addr, err)
	}
	if hr.Err != "" {
		c.Close()
		return nil, fmt.Errorf("%w: stage %d at %s: %s", ErrRefused, h.Index, addr, hr.Err)
	}
	return l, nil
}

// send writes a frame and flushes it.
func (l *link) send(frame []byte) error {
	if _, err := l.w.Write(frame); err != nil {
		return err
	}
	return l.w.Flush()
}

// recvFrame reads the next frame; its payload is valid until the next call.
func (l *link) recvFrame() (typ byte, payload []byte, err error) {
	typ, payload, l.buf, err = readFrame(l.r, l.buf)
	return typ, payload, err
}

func (l *link) close() { l.c.Close() }
