package orpc

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"time"
)

// Small messages of a connection's calls, written together.
//
// A streaming handler's send used to write its frame to the call's QUIC stream at once.
// quic-go then wakes the connection's sender, and Go's scheduler runs the woken goroutine
// next (runnext): so when an engine step gives a token to each of several calls, each
// token leaves in a packet of its own, and the peer pays per packet (a receive, a
// decryption, an ACK every second packet). Instead, a small message goes to its call's
// pending bytes, and the first call to have something pending on an idle connection
// (the leader) yields once, so that the handlers already runnable add theirs, then writes
// every call's pending bytes in one pass, which quic-go packs into as few packets as fit.
// Nothing waits on a clock: the leader only lets the goroutines that are ready run first,
// and a call's messages keep their order (its pending bytes are written, by the leader or
// by the call itself, before anything the call writes after them).
//
// A write the leader makes for another call must not stall the others: a call whose peer
// stopped reading (flow control) would. The leader gives one call's write handoffWait;
// past it, what is left stays pending and that call writes its own from then on, blocking
// only itself.

// coalesceMax bounds the pending bytes of a call that go through the connection's
// writer; a larger message is written by its call at once, after its pending bytes.
const coalesceMax = 2 << 10

// handoffWait is the longest the leader waits on one call's write.
const handoffWait = time.Millisecond

// connWriter gathers the calls of one connection that have small messages pending.
type connWriter struct {
	mu      sync.Mutex
	queue   []*streamWriter // calls with pending bytes, in the order they got them
	spare   []*streamWriter
	leading bool // a leader is writing the queue
}

// add queues w, whose pending bytes were empty, and writes the queue if no one leads.
func (c *connWriter) add(w *streamWriter) {
	c.mu.Lock()
	c.queue = append(c.queue, w)
	if c.leading {
		c.mu.Unlock()
		return
	}
	c.leading = true
	c.mu.Unlock()
	runtime.Gosched() // the handlers already woken (by the same engine step) add theirs
	c.mu.Lock()
	for len(c.queue) > 0 {
		batch := c.queue
		c.queue, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		for i, q := range batch {
			q.writePending()
			batch[i] = nil
		}
		c.mu.Lock()
		c.spare = batch[:0]
	}
	c.leading = false
	c.mu.Unlock()
}

// sendMessage writes a MESSAGE frame: through the connection's writer when it is small,
// else at once, after the call's pending bytes. An error of a write the leader made for
// this call is returned by its next send.
func (w *streamWriter) sendMessage(payload []byte) error {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return errors.New("call already ended")
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	if w.cw == nil || w.direct || len(w.pending)+frameHeaderLen+len(payload) > coalesceMax {
		err := w.flushPendingLocked()
		if err == nil {
			err = w.writeLocked(frameMessage, payload)
		}
		w.mu.Unlock()
		return err
	}
	queued := len(w.pending) > 0 // then w is queued already, or being written
	w.pending = appendFrame(w.pending, frameMessage, payload)
	w.mu.Unlock()
	if !queued {
		w.cw.add(w)
	}
	return nil
}

// writePending is the leader's write of w's pending bytes.
func (w *streamWriter) writePending() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || w.err != nil {
		w.pending = w.pending[:0]
		return
	}
	if len(w.pending) == 0 {
		return
	}
	w.st.SetWriteDeadline(time.Now().Add(handoffWait))
	n, err := w.st.Write(w.pending)
	w.st.SetWriteDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The peer is not reading this call: it writes its own from now on.
		w.pending = w.pending[:copy(w.pending, w.pending[n:])]
		w.direct = true
		return
	}
	w.pending = w.pending[:0]
	if err != nil {
		w.err = err
	}
}

// flushPendingLocked writes w's pending bytes from w's own goroutine. Called with w.mu
// held.
func (w *streamWriter) flushPendingLocked() error {
	if len(w.pending) == 0 {
		return nil
	}
	_, err := w.st.Write(w.pending)
	w.pending = w.pending[:0]
	return err
}
