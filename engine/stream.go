package engine

import (
	"context"
	"io"
	"sync"
	"sync/atomic"

	"tandem/llm"
)

// stream hands one sequence's events from the scheduler to the caller. The
// scheduler never blocks on it: events queue until the caller takes them.
type stream struct {
	mu     sync.Mutex
	events []llm.Event
	err    error // set with the final event when the generation failed
	done   bool  // the final event (or err) is queued
	notify chan struct{}

	closed atomic.Bool
	wake   func() // tells the scheduler to look at closed streams
	// cancelled is the request context's Done channel (nil: never), set
	// before the scheduler sees the stream.
	cancelled <-chan struct{}
}

func newStream(wake func()) *stream {
	return &stream{notify: make(chan struct{}, 1), wake: wake}
}

func (s *stream) push(ev llm.Event) {
	s.mu.Lock()
	s.events = append(s.events, ev)
	if ev.Finish != "" {
		s.done = true
	}
	s.mu.Unlock()
	s.signal()
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	if !s.done {
		s.err, s.done = err, true
	}
	s.mu.Unlock()
	s.signal()
}

func (s *stream) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event, io.EOF after the final one, or the error
// that ended the generation.
func (s *stream) Next(ctx context.Context) (llm.Event, error) {
	for {
		s.mu.Lock()
		if len(s.events) > 0 {
			ev := s.events[0]
			s.events[0] = llm.Event{}
			s.events = s.events[1:]
			s.mu.Unlock()
			return ev, nil
		}
		if s.done {
			err := s.err
			s.mu.Unlock()
			if err == nil {
				err = io.EOF
			}
			return llm.Event{}, err
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return llm.Event{}, ctx.Err()
		}
	}
}

// abandoned reports whether the caller closed the stream or cancelled the
// request's context. The context counts as soon as it is cancelled, not
// when the goroutine that closes the stream for it gets to run: otherwise a
// loaded machine could let the scheduler finish (and pin) a prefill whose
// caller was already gone.
func (s *stream) abandoned() bool {
	if s.closed.Load() {
		return true
	}
	select {
	case <-s.cancelled:
		return true
	default:
		return false
	}
}

// Close abandons the generation; the scheduler frees its blocks on its next
// step.
func (s *stream) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.wake()
	}
	return nil
}
