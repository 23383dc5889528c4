package planner

import (
	"context"
	"errors"
)

// A Connector starts and stops the workers of a deployment's pools; the planner's loop in
// the router drives it. Implementations: planner/local (tandem serve processes on this
// machine), and k8s/connector (a TandemPool's scale subresource, through the API server).
// A connector never decides which workers or how many: the planner does.
//
// Both methods may be called from one goroutine at a time (the planner's loop); a
// connector must still be safe against its own background work (a process exiting, a
// watch event) changing what Replicas returns.
type Connector interface {
	// Replicas lists the workers the connector runs in pool: starting, serving, or
	// draining (Draining set). Each Name is the worker's node name in the cluster (its
	// --node-name), which is how the router matches it to a registered worker.
	Replicas(pool Pool) []Replica

	// Scale brings pool to n workers that are not draining. When it grows the pool it
	// starts workers; when it shrinks it, it drains and then stops workers, those named
	// in victims first, in their order (the planner has already taken them out of the
	// router's rotation). A drained worker finishes the requests it has (the node's
	// ordered drain, --drain-timeout; requests still running when it ends migrate) and
	// only then exits; until it has, Replicas lists it as draining.
	//
	// Scale returns once the change is under way, not when workers are ready or gone. An
	// error means the change was not made, in part or at all: wrap ErrRefused when the
	// connector will not do it (a quota, a bound of its own), anything else when it
	// failed; the planner counts both and asks again on its next decision.
	Scale(ctx context.Context, pool Pool, n int, victims []string) error
}

// ErrRefused marks a scale request a connector declined rather than failed at.
var ErrRefused = errors.New("scale refused")
