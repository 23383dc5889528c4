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
