package orpc

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A peer that vanishes without a word (its socket closed: no CONNECTION_CLOSE) leaves the
// calls to it hanging until QUIC's idle timeout, two minutes here. CloseWithReason, as
// the router calls it on a worker it declared dead, ends every one of them at once with
// the reason, and leaves no goroutine behind.
func TestCloseWithReasonEndsCallsToSilentPeer(t *testing.T) {
	_, srvID, cliID := newPKI(t)
	idle := WithIdleTimeout(2 * time.Minute)
	s := NewServer(WithLogger(quietLogger()), idle)
	started := make(chan struct{}, 8)
	s.HandleStream("test.Hang", func(ctx context.Context, req []byte, send func([]byte) error) error {
		if err := send([]byte("first")); err != nil {
			return err
		}
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	udp, addr := serveOnUDP(t, s, srvID)
	before := runtime.NumGoroutine()

	c := dial(t, addr, cliID, idle)
	const calls = 4
	errc := make(chan error, calls)
	for range calls {
		cs, err := c.StreamBytes(testCtx(t), "test.Hang", nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Recv(); err != nil {
			t.Fatal(err)
		}
		<-started
		go func() {
			_, err := cs.Recv()
			errc <- err
		}()
	}
	udp.Close() // the server vanishes
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("a call ended before the client closed: %v", err)
	default:
	}
	const reason = "worker w1 declared dead: no load report for 1s"
	c.CloseWithReason(reason)
	for range calls {
		select {
		case err := <-errc:
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), reason) {
				t.Errorf("call after CloseWithReason: %v, want Unavailable with the reason", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call to the silent peer still hangs after CloseWithReason")
		}
	}
	// The client's goroutines (connection, streams, context watchers) are gone, and so are
	// the server's, whose socket is closed.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the client dialled:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
