package worker

import (
	"sync"
	"sync/atomic"
	"time"
)

// Several routers may dispatch to one worker. Each predicts the load of its own requests
// between load reports; to learn of the others', it needs a report soon after another
// router's request arrives. So the worker keeps, per registration (by its dispatch key),
// the highest dispatch number received, reported back as LoadReport.Received (which tells a
// router which of its own dispatches a report counts), and, when a request arrives, nudges
// every registration to report at once, at most once per minReportGap. (Not when one ends:
// the engine's figures still hold the finished sequence until its next step, and such a
// report would make the worker look busier than it is until the next heartbeat.)
// (The highest number rather than a count: a dispatch lost on its way must not hold back
// the later ones.)

// minReportGap bounds the rate of nudged load reports per router.
const minReportGap = 5 * time.Millisecond

// registrations holds, for each live registration with a router, the highest dispatch
// number received and its nudge channel.
type registrations struct {
	mu   sync.Mutex
	regs map[uint64]*registration // by dispatch key
}

type registration struct {
	received atomic.Uint64
	nudge    chan struct{} // capacity 1: a pending nudge
}

// add starts tracking the calls with key (0: the router does not track dispatches; the
// registration is still nudged).
func (r *registrations) add(key uint64) *registration {
	reg := &registration{nudge: make(chan struct{}, 1)}
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
	r.regs[key] = reg
	return reg
}

func (r *registrations) remove(reg *registration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, v := range r.regs {
		if v == reg {
			delete(r.regs, k)
		}
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
func (r *registrations) nudgeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, reg := range r.regs {
		select {
		case reg.nudge <- struct{}{}:
		default:
		}
	}
}
