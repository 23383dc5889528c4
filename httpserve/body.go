package httpserve

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// deadlineBody bounds the time a request body takes to arrive (Config.BodyReadTimeout
// and MinBodyRate): before each read it moves the connection's (or stream's) read
// deadline to the first read's time + timeout + bytes so far / rate, and clears it at
// the end of the body, so that the rest of the request (a long response) has none.
type deadlineBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	rate    int64

	start time.Time
	n     int64
	err   error
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.start.IsZero() {
		b.start = time.Now()
	}
	deadline := b.start.Add(b.timeout + time.Duration(float64(b.n)/float64(b.rate)*float64(time.Second)))
	if err := b.rc.SetReadDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		b.err = err
		return 0, err
	}
	n, err := b.body.Read(p)
	b.n += int64(n)
	switch {
	case err == io.EOF:
		b.rc.SetReadDeadline(time.Time{})
	case err != nil && isTimeout(err):
		err = &BodyTimeoutError{Read: b.n, Took: time.Since(b.start), Limit: b.timeout, MinRate: b.rate}
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.body.Close() }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// BodyTimeoutError is the read error of a request body that did not arrive within
// Config.BodyReadTimeout and MinBodyRate. It matches os.ErrDeadlineExceeded.
type BodyTimeoutError struct {
	Read    int64         // bytes that did arrive
	Took    time.Duration // since the first read
	Limit   time.Duration // Config.BodyReadTimeout
	MinRate int64
}

func (e *BodyTimeoutError) Error() string {
	return fmt.Sprintf("%d bytes of the body in %v: a body must arrive within %v plus 1 s per %d bytes",
		e.Read, e.Took.Round(time.Millisecond), e.Limit, e.MinRate)
}

// Is makes the error match os.ErrDeadlineExceeded.
func (e *BodyTimeoutError) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// Timeout reports true, as a net.Error does.
func (e *BodyTimeoutError) Timeout() bool { return true }
