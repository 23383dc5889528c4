package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Several routers may dispatch to one worker. Each predicts the load of its own requests
// between load reports; to learn of the others', it needs a report soon after another
// router's request arrives. So the worker keeps, per registration (by its dispatch key),
// the highest dispatch number received, reported back as LoadReport.Received (which tells a
// router which of its own dispatches a report counts), and, when a request arrives, nudges
// every other registration to report at once, at most once per minReportGap (the request's
// own router predicts its load until a periodic report counts it, as the simulator's
// routers do: an arrival's report to it was a packet and an ACK for a small request,
// a tenth of the router's datagrams). (Not when one ends:
// the engine's figures still hold the finished sequence until its next step, and such a
// report would make the worker look busier than it is until the next heartbeat.)
// (The highest number rather than a count: a dispatch lost on its way must not hold back
// the later ones.)

// minReportGap bounds the rate of nudged load reports per router.
const minReportGap = 5 * time.Millisecond

// registrations holds, for each live registration with a router, the highest dispatch
// number received, its nudge channel, and the requests that router sent that are running.
type registrations struct {
	mu     sync.Mutex
	regs   map[uint64]*registration // by dispatch key
	nextID uint64                   // of bound requests
}

type registration struct {
	received atomic.Uint64
	nudge    chan struct{}             // capacity 1: a pending nudge
	flush    chan struct{}             // capacity 1: send the KV events waiting now
	pub      atomic.Pointer[publisher] // the router's Worker.Publish call, if any (publish.go)
	// active are the running requests the registration's router sent (bind), canceled
	// should that router be lost (lose). Guarded by registrations.mu.
	active map[uint64]boundRequest
	// early marks a registration made by bind for a key add has not seen yet: the
	// router dispatched as soon as it had replied, before the reply reached the worker's
	// add. add adopts it; if none does, its last request's end removes it. Guarded by
	// registrations.mu.
	early bool
	// dropped gets why the router's connection to this worker ended under its
	// Worker.Publish call (publish.go): the session ends on it. Capacity 1.
	dropped chan error
	// tokenStreams counts the running requests of this router that stream a message a
	// token: while there are some, KV events go at once, in the packets of a step's tokens
	// (Config.EventInterval).
	tokenStreams atomic.Int32
}

func newRegistration(early bool) *registration {
	return &registration{nudge: make(chan struct{}, 1), flush: make(chan struct{}, 1), dropped: make(chan error, 1), early: early}
}

type boundRequest struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// add starts tracking the calls with key (0: the router does not track dispatches; the
// registration is still nudged).
func (r *registrations) add(key uint64) *registration {
	reg := newRegistration(false)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.regs == nil {
		r.regs = map[uint64]*registration{}
	}
	if key == 0 {
		key = uint64(len(r.regs)) | 1<<63 // untracked: a private slot
		for r.regs[key] != nil {
			key++
		}
	}
	if early := r.regs[key]; early != nil && early.early {
		early.early = false // requests that came before the reply: this registration's
		return early
	}
	r.regs[key] = reg
	return reg
}

// remove stops tracking reg; the requests bound to it run on.
func (r *registrations) remove(reg *registration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeLocked(reg)
}

func (r *registrations) removeLocked(reg *registration) {
	for k, v := range r.regs {
		if v == reg {
			delete(r.regs, k)
		}
	}
}

// lose stops tracking reg, whose router is lost, and cancels the requests bound to it with
// cause. It returns how many were still running.
func (r *registrations) lose(reg *registration, cause error) int {
	r.mu.Lock()
	r.removeLocked(reg)
	active := reg.active
	reg.active = nil
	r.mu.Unlock()
	n := 0
	for _, b := range active {
		if b.ctx.Err() == nil {
			n++
		}
		b.cancel(cause)
	}
	return n
}

// bind ties a request that arrived with dispatch key key to that registration: the
// returned context is also canceled should the registration's router be lost. done ends
// the binding when the request ends. A request with no key, or one of a registration not
// (or no longer) tracked, is not bound: it ends when its call does.
func (r *registrations) bind(ctx context.Context, key uint64, tokenStream bool) (_ context.Context, done func()) {
	if key == 0 {
		return ctx, func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	reg := r.regs[key]
	if reg == nil {
		// Not yet registered: the router may dispatch the moment it replies, before the
		// reply is read here. Keep the binding for add to adopt.
		if r.regs == nil {
			r.regs = map[uint64]*registration{}
		}
		reg = newRegistration(true)
		r.regs[key] = reg
	}
	bctx, cancel := context.WithCancelCause(ctx)
	r.nextID++
	id := r.nextID
	if reg.active == nil {
		reg.active = map[uint64]boundRequest{}
	}
	reg.active[id] = boundRequest{bctx, cancel}
	if tokenStream {
		reg.tokenStreams.Add(1)
	}
	return bctx, func() {
		if tokenStream {
			reg.tokenStreams.Add(-1)
		}
		r.mu.Lock()
		delete(reg.active, id)
		if reg.early && len(reg.active) == 0 && r.regs[key] == reg {
			delete(r.regs, key) // no registration came to adopt it
		}
		r.mu.Unlock()
		cancel(nil)
	}
}

// received records the arrival of dispatch seq of registration key.
func (r *registrations) received(key, seq uint64) {
	if key == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if reg := r.regs[key]; reg != nil && seq > reg.received.Load() {
		reg.received.Store(seq)
	}
}

// nudgeAll asks every registration for a load report soon.
func (r *registrations) nudgeAll() { r.nudgeOthers(0) }

// nudgeOthers asks every registration but key's for a load report soon: a request of key's
// router arrived, which that router predicts until a periodic report counts it, and the
// others learn of from the report.
func (r *registrations) nudgeOthers(key uint64) {
	r.signalAll(key, func(reg *registration) chan struct{} { return reg.nudge })
}

// flushAll asks every registration to send the KV events that wait (Config.EventInterval)
// now: a sequence's prompt is stored, or it ended (its conversation's next turn may come
// at once).
func (r *registrations) flushAll() {
	r.signalAll(0, func(reg *registration) chan struct{} { return reg.flush })
}

// signalAll puts a signal, unless one is pending, on the channel ch picks of every
// registration but the one of dispatch key except (0: none; no registration has key 0, add
// gives an untracked one a slot of its own).
func (r *registrations) signalAll(except uint64, ch func(*registration) chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, reg := range r.regs {
		if key == except {
			continue
		}
		select {
		case ch(reg) <- struct{}{}:
		default:
		}
	}
}
