package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"tandem/cluster"
	"tandem/orpc"
)

// Load reports and KV event batches over one stream.
//
// A unary Router.Heartbeat or Router.Events call opens a QUIC stream, runs a handler and
// closes the stream again at both ends: five or six packets and a few goroutines for a
// message of a hundred bytes. A live Mooncake run sent some 300 of them a second to the
// router from 16 engines, most of the router's CPU once the tokens were cheap. So a
// router that knows how opens Worker.Publish for each registration, and the session
// sends its reports and batches on it, one message each, in order (a report can no longer
// overtake its events). The answer of a call was also how a worker learned that its router
// was alive; a stream gives none. A router that beats (cluster.RegisterReply.BeatMs)
// repeats its reply on the registration stream instead, one message where a call opened
// and closed a stream of its own; under a router that does not, every probeEvery a report
// also goes as a Router.Heartbeat call, whose answer (or its timeout, lossTimeout) says
// so as before, and which the router takes for a sign of life only while the stream is
// live.

// publisher is a router's Worker.Publish call, which the session of its registration
// sends on.
type publisher struct {
	send func(*cluster.Publication) error
	done chan struct{}   // closed by end: the call returns
	gone <-chan struct{} // closed when the router's connection to us ends (nil: unknown)
	once sync.Once
}

func (p *publisher) end() { p.once.Do(func() { close(p.done) }) }

// publishWait bounds how long a Worker.Publish call waits for its registration: the router
// opens it as soon as it has answered the registration, which the session may not have
// read yet.
const publishWait = 5 * time.Second

// publish serves Worker.Publish: it attaches the call to its registration's session,
// which sends on it until the session ends, the call is canceled, or a send fails.
func (w *Worker) publish(ctx context.Context, req *cluster.PublishRequest, send func(*cluster.Publication) error) error {
	p := &publisher{send: send, done: make(chan struct{})}
	if peer, ok := orpc.PeerFromContext(ctx); ok {
		p.gone = peer.Done()
	}
	reg, err := w.regs.attach(ctx, req.DispatchKey, p)
	if err != nil {
		return err
	}
	defer reg.pub.CompareAndSwap(p, nil)
	select {
	case <-ctx.Done():
	case <-p.done:
	}
	reg.dropIfGone(p, context.Cause(ctx))
	return nil
}

// dropIfGone tells reg's session (reg.dropped) that the router's connection to this
// worker, which p came on, has ended, if it has; cause is what ended p. The router drops
// the registration when that connection ends, and it ends by itself only when the router
// stops acknowledging: a router killed with SIGKILL is noticed so at QUIC's idle timeout
// after the first report it did not acknowledge, sooner than the registration's own
// connection, quiet but for beats and keepalives, would time out.
func (reg *registration) dropIfGone(p *publisher, cause error) {
	select {
	case <-p.gone:
	default:
		return // open, or unknown (a nil channel)
	}
	select {
	case reg.dropped <- fmt.Errorf("%w: %w", errRouterConnEnded, cause):
	default: // told already
	}
}

// takeDropped returns what dropIfGone told reg's session, if it did (and takes it: the
// session ends on it), nil otherwise.
func (reg *registration) takeDropped() error {
	select {
	case err := <-reg.dropped:
		return err
	default:
		return nil
	}
}

// errRouterConnEnded ends a session whose router's connection to this worker ended
// (registration.dropped); errNoBeats, one whose router stopped beating.
var (
	errRouterConnEnded = errors.New("the router's connection to this worker ended")
	errNoBeats         = errors.New("the router has sent no beat")
)

// attach makes p the publisher of the registration with key, waiting up to publishWait
// for the registration to be known. A publisher already there is ended.
func (r *registrations) attach(ctx context.Context, key uint64, p *publisher) (*registration, error) {
	if key == 0 { // no registration has key 0: refuse now rather than after publishWait
		return nil, orpc.Errorf(orpc.FailedPrecondition, "worker: no registration with that dispatch key")
	}
	deadline := time.Now().Add(publishWait)
	for {
		r.mu.Lock()
		reg := r.regs[key]
		r.mu.Unlock()
		if reg != nil {
			if old := reg.pub.Swap(p); old != nil {
				old.end()
			}
			return reg, nil
		}
		if time.Now().After(deadline) {
			return nil, orpc.Errorf(orpc.FailedPrecondition, "worker: no registration with that dispatch key")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// endPublishers ends every Worker.Publish call: the sessions make calls from then on.
// Shutdown does this before it shuts the ORPC server down, which waits for calls.
func (r *registrations) endPublishers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, reg := range r.regs {
		reg.endPublisher()
	}
}

// endPublisher ends reg's Worker.Publish call, if it has one.
func (reg *registration) endPublisher() {
	if p := reg.pub.Swap(nil); p != nil {
		p.end()
	}
}

// publishOn sends m on reg's publisher, if it has one; false: there is none, or the send
// failed (the publisher is ended then): the caller makes the call instead.
func publishOn(reg *registration, m *cluster.Publication) bool {
	p := reg.pub.Load()
	if p == nil {
		return false
	}
	if err := p.send(m); err != nil {
		reg.pub.CompareAndSwap(p, nil)
		p.end()
		reg.dropIfGone(p, err) // before the caller's call: it looks first
		return false
	}
	return true
}
