package live

// Failing over from a dead worker. A worker process that dies abruptly (kill -9, power
// loss, a cable pulled) sends no QUIC CONNECTION_CLOSE: its connections would only end at
// QUIC's idle timeout (orpc.DefaultIdleTimeout, 5 s), and the requests on it would hang
// that long. Its load reports, though, come every heartbeat interval; when none has come
// for HeartbeatTimeout, Run declares the worker dead: it is removed from the registry and
// the policy, and its connection is closed, which ends every call on it at once. Each
// request on it then moves on (liveStream.failover): one that has sent the client nothing
// yet is dispatched again (a retry, bounded by MaxAttempts), one already streaming
// migrates with the tokens so far (bounded by MaxMigrations) or ends with a 503-class
// error. A dead prefill worker P is handled where the request waits on it: the router's
// call to P fails, and the decode worker D, whose pull from P would wait for D's own
// connection to P to time out, is asked to prefill instead (prefillLocally); once P has
// answered and D is still pulling, P's removal ends D's stream and the request migrates
// (watchSource). A worker that comes back registers again and is used again.

import (
	"context"
	"fmt"
	"time"

	"tandem/llm"
	"tandem/orpc"
)

// MinHeartbeatTimeout is the least default heartbeat timeout, whatever the interval: a
// worker is not declared dead for missing reports over less than this (a garbage
// collection pause, a busy host, a retransmitted packet). It was 1 s until 2026-12: on a
// busy host (a hundred sim replicas and the router on two cores, a burst of long prompts)
// reports ran a second late often enough to declare healthy replicas dead in every run.
const MinHeartbeatTimeout = 2 * time.Second

// DefaultHeartbeatTimeout is the heartbeat timeout for workers reporting every interval:
// eight intervals, at least MinHeartbeatTimeout. With the default 250 ms interval a dead
// worker is declared dead after 2 s, against QUIC's 5 s.
func DefaultHeartbeatTimeout(interval time.Duration) time.Duration {
	return max(8*interval, MinHeartbeatTimeout)
}

// declareDeadLocked removes w, whose load reports stopped: its registration ends, which
// closes the router's connection to it and fails over its requests. Called with l.mu held.
func (l *Router) declareDeadLocked(w *liveWorker, silent time.Duration) {
	select {
	case <-w.kick:
		return // on its way out already
	default:
	}
	l.drainLocked() // reports received before this change first
	w.model.state.SetHealthy(w.id, false)
	l.met.DeadWorkers.Inc()
	l.log.Warn("worker declared dead: its load reports stopped; failing its requests over", "worker", w.node,
		"silent", silent.Round(time.Millisecond), "heartbeat_timeout", l.cfg.HeartbeatTimeout)
	w.remove(fmt.Sprintf("declared dead: no load report for %v", silent.Round(time.Millisecond)))
}

// failover continues the request elsewhere after its stream from worker failed failed with
// err, or returns the error to end it with. A failure that is the worker's verdict on the
// request (invalid, too long) ends it; a worker that failed is marked unhealthy until its
// next report (a dead one is being removed already).
func (s *liveStream) failover(failed *liveWorker, err error) error {
	l := s.b.l
	srcLost := s.dis.srcLost
	s.dis.srcLost = false
	switch {
	case srcLost:
		err = fmt.Errorf("the prefill worker %s it was pulling the prompt's KV from left: %w", s.dis.pw.node, err)
	case !workerFailed(err):
		return err
	case failed != nil:
		l.mu.Lock()
		l.drainLocked() // reports received before this change first
		failed.model.state.SetHealthy(failed.id, false)
		l.mu.Unlock()
	}
	if len(s.generated) == 0 {
		// Nothing has reached the client: send the request again, as if for the first time.
		if s.retries >= l.cfg.MaxAttempts {
			return fmt.Errorf("%w: worker %s failed before the first token (%d retries): %w", llm.ErrUnavailable, s.worker, s.retries, err)
		}
		s.retries++
		l.met.Retries.Inc()
		l.log.Warn("worker failed before the request's first token; sending it to another", "worker", s.worker, "err", err)
		s.dis.source, s.dis.skip = nil, false // the new worker prefills
		s.workers = s.workers[:0]
		if derr := s.dispatch(s.ctx, &s.orig); derr != nil {
			return fmt.Errorf("retrying after %v: %w", err, derr)
		}
		return nil
	}
	if s.migrated >= l.cfg.MaxMigrations {
		return fmt.Errorf("%w: worker %s failed after %d tokens (no migration left): %w", llm.ErrUnavailable, s.worker, len(s.generated), err)
	}
	return s.migrate(err)
}

// watchSource, while the decode worker D still pulls the prompt's KV from the prefill
// worker P (D's first token, the echo of P's, has not come), closes D's stream cs should P
// leave the registry: D's pull would otherwise wait for D's own connection to P to time out.
// The request then migrates (failover). The returned function ends the watch; once it
// returns, s.dis.srcLost says whether the watch closed cs.
func (s *liveStream) watchSource(cs *orpc.ClientStream) (unwatch func()) {
	pw := s.dis.pw
	if !s.dis.skip || pw == nil || s.migrated >= s.b.l.cfg.MaxMigrations {
		return func() {}
	}
	stop, ended := make(chan struct{}), make(chan struct{})
	lost := false
	go func() {
		defer close(ended)
		select {
		case <-pw.kick:
			lost = true
			cs.Close()
		case <-stop:
		}
	}()
	return func() {
		close(stop)
		<-ended
		if lost {
			s.dis.srcLost = true
		}
	}
}

// prefillLocally abandons the decode worker's Decode, whose pull waits on a prefill
// worker whose call failed, and dispatches the request again as a plain Generate (on the
// same decode worker, most likely): P may be gone, and D would only find out when its own
// connection to P times out.
func (s *liveStream) prefillLocally(ctx context.Context, cause error) error {
	s.mu.Lock()
	cs := s.cs
	s.mu.Unlock()
	cs.Close()
	s.release()
	s.dis.source, s.dis.skip = nil, false
	s.workers = s.workers[:0]
	s.b.l.log.Info("dispatching the request again for the decode worker to prefill", "decode_worker", s.worker, "cause", cause)
	return s.dispatch(ctx, &s.orig)
}
