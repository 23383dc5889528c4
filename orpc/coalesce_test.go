package orpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Calls of one connection that send at once, small messages and large ones mixed, each get
// every message, intact and in order, and the status they end with.
func TestCoalescedStreamsKeepOrder(t *testing.T) {
	const calls, msgs = 24, 300
	env := newEnv(t, func(s *Server) {
		s.HandleStream("test.Mixed", func(ctx context.Context, req []byte, send func([]byte) error) error {
			seed, _ := strconv.Atoi(string(req))
			buf := make([]byte, 0, 8<<10)
			for i := range msgs {
				// Mostly token-sized, some across the coalescing bound, a few large.
				size := 8 + (seed*31+i*17)%40
				switch {
				case i%50 == 7:
					size = coalesceMax + 100
				case i%23 == 3:
					size = coalesceMax - frameHeaderLen - 1
				}
				buf = binary.BigEndian.AppendUint32(buf[:0], uint32(i))
				for len(buf) < size {
					buf = append(buf, byte(seed+i))
				}
				if err := send(buf); err != nil {
					return err
				}
			}
			if seed%3 == 0 {
				return Errorf(NotFound, "call %d ends with a status", seed)
			}
			return nil
		})
	})
	c := dial(t, env.addr, env.cliID)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for k := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, err := c.StreamBytes(ctx, "test.Mixed", []byte(strconv.Itoa(k)))
			if err != nil {
				t.Error(err)
				return
			}
			for i := 0; ; i++ {
				var m Bytes
				var err error
				if i%2 == 0 {
					err = cs.RecvMsgReusing(&m)
				} else {
					m, err = cs.Recv()
				}
				if err != nil {
					if i != msgs {
						t.Errorf("call %d: %v after %d messages, want %d", k, err, i, msgs)
					}
					wantErr := k%3 == 0
					if gotErr := err != io.EOF; gotErr != wantErr {
						t.Errorf("call %d ended with %v", k, err)
					}
					return
				}
				if len(m) < 4 || binary.BigEndian.Uint32(m) != uint32(i) || !bytes.Equal(m[4:], bytes.Repeat([]byte{byte(k + i)}, len(m)-4)) {
					t.Errorf("call %d: message %d is %d bytes starting %x", k, i, len(m), m[:min(len(m), 8)])
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A call whose caller stops reading does not hold up the other calls of its connection:
// the write made for it times out, and from then on it waits on its own.
func TestCoalescedStreamStuckAlone(t *testing.T) {
	stuckSent := make(chan int, 1)
	got := make(chan struct{})
	env := newEnv(t, func(s *Server) {
		s.HandleStream("test.Flood", func(ctx context.Context, req []byte, send func([]byte) error) error {
			msg := make([]byte, 1000) // small enough to be coalesced
			n := 0
			defer func() { stuckSent <- n }()
			for ctx.Err() == nil {
				if err := send(msg); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		// One message at a time, each sent once the caller got the one before: only the
		// connection's writer can deliver it.
		s.HandleStream("test.Few", func(ctx context.Context, req []byte, send func([]byte) error) error {
			for range 50 {
				if err := send([]byte("token")); err != nil {
					return err
				}
				select {
				case <-got:
				case <-time.After(5 * time.Second):
					return Errorf(DeadlineExceeded, "the caller did not get the message")
				}
			}
			return nil
		})
	})
	c := dial(t, env.addr, env.cliID)
	ctx := testCtx(t)
	stuck, err := c.StreamBytes(ctx, "test.Flood", nil) // never read: its window fills
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // its window is full by now
	for round := range 3 {
		start := time.Now()
		cs, err := c.StreamBytes(ctx, "test.Few", nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := recvAll(cs, func() { got <- struct{}{} })
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if n != 50 {
			t.Fatalf("round %d: %d messages, want 50", round, n)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("round %d took %v beside a stuck call", round, d)
		}
	}
	stuck.Close()
	select {
	case n := <-stuckSent:
		if n < 1000 {
			t.Errorf("the stuck call sent only %d messages: was its window ever full?", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck call's handler did not end after the caller closed it")
	}
}

// A nested message written in place is the bytes Message writes, whatever its length.
func TestBeginEndMessage(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 16383, 16384, 70000} {
		body := bytes.Repeat([]byte{7}, n)
		var a, b Encoder
		a.Uint8(1)
		a.Message(Bytes(body))
		a.Uint8(2)
		b.Uint8(1)
		mark := b.BeginMessage()
		b.buf = append(b.buf, body...)
		b.EndMessage(mark)
		b.Uint8(2)
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Fatalf("%d bytes: in place %x…, Message %x…", n, b.Bytes()[:min(8, b.Len())], a.Bytes()[:min(8, a.Len())])
		}
	}
}
