package orpc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// slowCount streams n messages, one every tick, and reports how its context ended.
func slowCount(n int, tick time.Duration, ended chan<- error) StreamFunc {
	return func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := range n {
			select {
			case <-ctx.Done():
				ended <- ctx.Err()
				return ctx.Err()
			case <-time.After(tick):
			}
			if err := send([]byte{byte(i)}); err != nil {
				return err
			}
		}
		ended <- nil
		return nil
	}
}

// TestShutdownGraceful: during Shutdown, a running call finishes in full, a new call is
// refused with ErrServerShutdown (Unavailable, so a router retries it elsewhere), and
// Shutdown returns nil once the call is done; Serve then returns by itself.
func TestShutdownGraceful(t *testing.T) {
	ended := make(chan error, 4)
	env := newEnv(t, func(s *Server) { s.HandleStream("test.Slow", slowCount(10, 30*time.Millisecond, ended)) })
	c := dial(t, env.addr, env.cliID)
	cs, err := c.StreamBytes(testCtx(t), "test.Slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() { shut <- env.server.Shutdown(testCtx(t)) }()
	for !env.server.shutting.Load() {
		time.Sleep(time.Millisecond)
	}
	late, err := c.StreamBytes(testCtx(t), "test.Slow", nil)
	if err == nil {
		_, err = late.Recv()
	}
	var st *Status
	if !errors.As(err, &st) || st.Code != Unavailable {
		t.Fatalf("a call during shutdown: %v, want Unavailable", err)
	}
	n, err := recvAll(cs, nil)
	got := 1 + n
	if err != nil {
		t.Fatalf("the running call was cut after %d messages: %v", got, err)
	}
	if got != 10 || <-ended != nil {
		t.Fatalf("the running call sent %d of 10", got)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last call")
	}
	env.stopSrv() // fails the test if Serve has not returned
}

// TestShutdownDeadline: at Shutdown's deadline the running calls are cancelled and
// Shutdown reports it.
func TestShutdownDeadline(t *testing.T) {
	ended := make(chan error, 4)
	env := newEnv(t, func(s *Server) { s.HandleStream("test.Slow", slowCount(1000, 20*time.Millisecond, ended)) })
	c := dial(t, env.addr, env.cliID)
	cs, err := c.StreamBytes(testCtx(t), "test.Slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := env.server.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the handler finished instead of being cancelled")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler was not cancelled")
	}
	for {
		if _, err := cs.Recv(); err != nil {
			if err == io.EOF {
				t.Fatal("the cut call ended as if complete")
			}
			break
		}
	}
}
