package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"tandem/cluster"
	"tandem/llm"
	"tandem/orpc"
)

// errDrainCut is the cause of the contexts of the requests a drain's deadline ends.
var errDrainCut = errors.New("worker: the drain deadline passed")

// drain is a worker's part in its process's ordered shutdown: once it begins, the load
// reports say unhealthy (routers send nothing new), new requests are refused with
// Unavailable (a router that had not yet heard retries them elsewhere), and the running
// ones are counted until they finish, or are cut at the deadline with an Unavailable
// error event, which makes their router migrate them.
type drain struct {
	mu       sync.Mutex
	draining bool
	n        int           // requests running
	idle     chan struct{} // closed when n drops to 0 while draining
	cutCtx   context.Context
	cut      context.CancelCauseFunc
}

func (d *drain) init() {
	d.cutCtx, d.cut = context.WithCancelCause(context.Background())
}

// admit counts a request in, or refuses it while draining. The returned context ends
// with errDrainCut as its cause when the drain's deadline passes; done must be called
// when the request ends.
func (w *Worker) admit(ctx context.Context) (context.Context, func(), error) {
	d := &w.drain
	if w.cfg.Health != nil {
		if err := w.cfg.Health(); err != nil {
			return nil, nil, orpc.Errorf(orpc.Unavailable, "worker %s cannot serve: %v: send the request elsewhere", w.cfg.Card.Node, err)
		}
	}
	d.mu.Lock()
	if d.draining {
		d.mu.Unlock()
		return nil, nil, orpc.Errorf(orpc.Unavailable, "worker %s is shutting down: send the request elsewhere", w.cfg.Card.Node)
	}
	d.n++
	d.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(d.cutCtx, func() { cancel(context.Cause(d.cutCtx)) })
	return ctx, func() {
		stop()
		cancel(nil)
		d.mu.Lock()
		if d.n--; d.n == 0 && d.idle != nil {
			close(d.idle)
			d.idle = nil
		}
		d.mu.Unlock()
	}, nil
}

// cutEvent is the event that ends a request cut by the drain's deadline, if ctx was.
func (w *Worker) cutEvent(ctx context.Context) (*cluster.GenerateEvent, bool) {
	if !errors.Is(context.Cause(ctx), errDrainCut) {
		return nil, false
	}
	return cluster.ErrorEvent(fmt.Errorf("%w: worker %s shut down before the request finished (its drain deadline passed)",
		llm.ErrUnavailable, w.cfg.Card.Node)), true
}

// Draining reports whether the worker's drain has begun.
func (w *Worker) Draining() bool {
	w.drain.mu.Lock()
	defer w.drain.mu.Unlock()
	return w.drain.draining
}

// Drain begins the drain: routers are told at once, by a load report, that the worker
// takes nothing new, and new requests are refused. Running ones go on.
func (w *Worker) Drain() {
	d := &w.drain
	d.mu.Lock()
	first := !d.draining
	d.draining = true
	d.mu.Unlock()
	if first {
		w.log.Info("draining: routers are told to send nothing new; running requests go on")
		w.regs.nudgeAll()
	}
}

// Shutdown ends the worker's membership in order: it drains (see Drain), waits for the
// requests running to finish, or at ctx's end cuts them (each ends with an Unavailable
// error event, so that its router migrates it), then deregisters from every router and
// closes its ORPC server; Run then returns nil. It returns ctx.Err() if requests were cut.
func (w *Worker) Shutdown(ctx context.Context) error {
	w.Drain()
	d := &w.drain
	var err error
	if !waitIdle(ctx, d) {
		err = ctx.Err()
		d.mu.Lock()
		n := d.n
		d.mu.Unlock()
		w.log.Warn("drain deadline passed; cutting the requests still running (their routers migrate them)", "requests", n)
		d.cut(errDrainCut)
		grace, cancel := context.WithTimeout(context.Background(), cutGrace)
		waitIdle(grace, d)
		cancel()
	}
	w.mu.Lock()
	w.shut = true // a Run not yet begun (a signal during start-up) returns at once
	stop, srv := w.stopRun, w.srv
	w.mu.Unlock()
	if stop != nil {
		if srv != nil {
			w.regs.endPublishers() // their calls last as long as the registrations
			sctx, cancel := context.WithTimeout(context.Background(), cutGrace)
			srv.Shutdown(sctx) // refuses what still arrives; nothing runs now
			cancel()
		}
		stop() // ends the registrations (the routers remove this worker) and the server
		<-w.runDone
	}
	return err
}

// cutGrace bounds the wait for cut requests to end, and for the ORPC server to close.
const cutGrace = 2 * time.Second

// waitIdle waits until no request runs or ctx ends; it reports the first.
func waitIdle(ctx context.Context, d *drain) bool {
	d.mu.Lock()
	if d.n == 0 {
		d.mu.Unlock()
		return true
	}
	if d.idle == nil {
		d.idle = make(chan struct{})
	}
	idle := d.idle
	d.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}
