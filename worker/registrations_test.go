package worker

import (
	"context"
	"errors"
	"testing"
)

// A request the router dispatched the moment it replied, before the worker read the
// reply and added the registration, is still the registration's: losing the router
// cancels it (it used to run on for nobody), and one that no registration adopts leaves
// nothing behind when it ends.
func TestBindBeforeAdd(t *testing.T) {
	var r registrations
	const key = 42
	ctx, done := r.bind(context.Background(), key, false)
	defer done()
	reg := r.add(key)
	lost := errors.New("router lost")
	if n := r.lose(reg, lost); n != 1 {
		t.Fatalf("lose canceled %d requests, want the early one", n)
	}
	if !errors.Is(context.Cause(ctx), lost) {
		t.Fatalf("the early request's context: %v", context.Cause(ctx))
	}

	_, done2 := r.bind(context.Background(), 7, false) // a key no registration will have
	if len(r.regs) != 1 {
		t.Fatalf("%d registrations while the early binding runs, want 1", len(r.regs))
	}
	done2()
	if len(r.regs) != 0 {
		t.Fatalf("%d registrations left after the early request ended", len(r.regs))
	}
}

// A request's arrival nudges the other routers' registrations to report, not its own
// router's, which predicts the request until a periodic report counts it; a request of an
// untracked router (key 0) nudges every registration.
func TestNudgeOthers(t *testing.T) {
	var r registrations
	own, other := r.add(1), r.add(2)
	nudged := func(reg *registration) bool {
		select {
		case <-reg.nudge:
			return true
		default:
			return false
		}
	}
	r.nudgeOthers(1)
	if got := [2]bool{nudged(own), nudged(other)}; got != [2]bool{false, true} {
		t.Errorf("after a request of router 1: nudged (own, other) = %v, want (false, true)", got)
	}
	r.nudgeOthers(0)
	if got := [2]bool{nudged(own), nudged(other)}; got != [2]bool{true, true} {
		t.Errorf("after an untracked request: nudged (own, other) = %v, want (true, true)", got)
	}
}
