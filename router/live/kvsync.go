package live

// Keeping the KV index in step with each worker, off the router's decision lock. A worker's
// event batches, its resynchronisations and the checks its load reports trigger take only
// that worker's kv lock and the index's own (sharded) locks, so routing decisions do not
// wait for them, and different workers' events apply in parallel:
//
//   - Events are applied in id order; a gap (an id skipped) fetches a snapshot. While the
//     snapshot is on its way, events wait in a bounded backlog.
//   - A load report carries the worker's last event id. Reports and event batches travel on
//     different streams, so a report may overtake the batch it covers: the index being
//     behind a report is a gap only if it stays behind, with no event arriving, for
//     behindGrace.
//   - A snapshot that fails is retried with backoff, the worker staying in the registry with
//     its overlap counted as unknown (stale) meanwhile, instead of being removed (which made
//     a worker whose snapshots fail register, fail and register again for ever).
//   - Stale: a worker with load whose event id has not moved for staleAfter is not sending
//     its events (or not emitting them); its overlap counts as unknown, or with
//     --require-kv-events it gets no requests, until events come again. Counted, logged once
//     per episode, and the router's /health says degraded.
//   - Consistency: when the index has applied exactly the events a report covers, the
//     worker's cache size in the report must equal the index's block count for it; a
//     difference is drift: counted, logged, and resynchronised (at most once per
//     driftCooldown, so that a systematic difference cannot loop).

import (
	"context"
	"strconv"
	"time"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/llm"
)

// Limits of the KV sync.
const (
	maxBacklog    = 1 << 16 // events kept while a snapshot is fetched; more are dropped (the snapshot covers them)
	driftCooldown = time.Minute
	retryMin      = time.Second
	retryMax      = 30 * time.Second
)

// kvSync is a worker's KV sync state, guarded by liveWorker.kv.
type kvSync struct {
	gone      bool // removed from the registry: nothing more is applied
	resyncing bool
	backlog   []kvcache.Event
	dropped   bool // events were dropped from the backlog
	failures  int  // snapshots failed in a row
	// Behind: the highest last event id reports claimed while the index was behind, since
	// when, and the index's last id then (progress resets the wait).
	behindID    uint64
	behindSince time.Time
	behindLast  uint64
	// Staleness: the last time the worker's event ids moved (an event applied or a report
	// claiming a higher id), and whether it is marked stale.
	idsMovedAt time.Time
	lastSeenID uint64
	stale      bool
	everEvent  bool
	driftAt    time.Time // last drift resync
}

// behindGrace is how long the index may stay behind a load report's last event id, with no
// event arriving, before the router takes it for a lost event and resynchronises.
func (l *Router) behindGrace() time.Duration { return max(4*l.cfg.Heartbeat, time.Second) }

// staleAfter is how long a worker with load may go without its event ids moving before it
// is marked stale.
func (l *Router) staleAfter() time.Duration {
	if l.cfg.StaleAfter > 0 {
		return l.cfg.StaleAfter
	}
	return max(20*l.cfg.Heartbeat, 5*time.Second)
}

// events serves Router.Events.
func (l *Router) events(ctx context.Context, b *cluster.KVEvents) (*cluster.Ack, error) {
	w, err := l.lookupFast(b.WorkerID)
	if err != nil {
		return nil, err
	}
	l.met.WorkerMessages.WithLabelValues("events", "call").Inc()
	l.applyEvents(w, b)
	return &cluster.Ack{}, nil
}

// applyEvents takes a batch of w's KV events, from a call or w's report stream.
func (l *Router) applyEvents(w *liveWorker, b *cluster.KVEvents) {
	w.kv.Lock()
	defer w.kv.Unlock()
	if w.kvs.gone {
		return
	}
	l.applyKV(w, b.Events, time.Now())
}

// applyKV applies events of w to the index, starting a resync on a gap. Called with w.kv.
func (l *Router) applyKV(w *liveWorker, evs []kvcache.Event, now time.Time) {
	x := w.model.state.Index()
	for i, ev := range evs {
		if w.kvs.resyncing {
			l.backlog(w, evs[i:])
			return
		}
		if x.Apply(w.id, ev) {
			last, _ := x.LastID(w.id)
			l.met.KVGaps.WithLabelValues(w.node).Inc()
			l.log.Info("KV event gap; fetching a snapshot", "worker", w.node, "last", last, "got", ev.ID)
			l.startResync(w, "gap")
			l.backlog(w, evs[i:])
			return
		}
		l.met.Events.Inc()
	}
	if len(evs) > 0 {
		l.idsMoved(w, evs[len(evs)-1].ID, now)
		w.kvs.everEvent = true
	}
}

// backlog keeps events that arrived during a resync, up to maxBacklog. Called with w.kv.
func (l *Router) backlog(w *liveWorker, evs []kvcache.Event) {
	room := maxBacklog - len(w.kvs.backlog)
	if len(evs) > room {
		l.met.KVEventsDropped.WithLabelValues(w.node).Add(float64(len(evs) - max(room, 0)))
		w.kvs.dropped = true
		evs = evs[:max(room, 0)]
	}
	w.kvs.backlog = append(w.kvs.backlog, evs...)
}

// idsMoved records that w's event ids reached id at now: it is sending its events.
// Called with w.kv.
func (l *Router) idsMoved(w *liveWorker, id uint64, now time.Time) {
	if id <= w.kvs.lastSeenID {
		return
	}
	w.kvs.lastSeenID, w.kvs.idsMovedAt = id, now
	if w.kvs.stale && !w.kvs.resyncing {
		l.setStale(w, false, "KV events arrive again")
	}
}

// startResync fetches a snapshot of w's cache in the background. Called with w.kv.
func (l *Router) startResync(w *liveWorker, cause string) {
	if w.kvs.resyncing || w.kvs.gone {
		return
	}
	w.kvs.resyncing, w.kvs.behindID = true, 0
	l.met.KVResyncs.WithLabelValues(w.node, cause).Inc()
	go l.resync(w)
}

// resync replaces w's index entries by a snapshot of its cache, then applies the events that
// arrived meanwhile. Neither the fetch nor the index update holds the router's lock: the
// index takes the snapshot a chunk per shard lock. A failed snapshot is retried with
// backoff while the worker is stale.
func (l *Router) resync(w *liveWorker) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var snap cluster.Snapshot
		err := w.client.Call(ctx, cluster.MethodSnapshot, &cluster.SnapshotRequest{}, &snap)
		cancel()
		w.kv.Lock()
		if w.kvs.gone {
			w.kv.Unlock()
			return
		}
		if err == nil {
			l.met.Snapshots.Inc()
			w.model.state.Index().Reset(w.id, snap.Snapshot)
			if w.kvs.failures > 0 {
				l.log.Info("KV snapshot succeeded after failures", "worker", w.node, "failures", w.kvs.failures)
			}
			w.kvs.failures = 0
			backlog := w.kvs.backlog
			w.kvs.backlog, w.kvs.resyncing, w.kvs.dropped = nil, false, false
			w.kvs.idsMovedAt, w.kvs.lastSeenID = time.Now(), max(w.kvs.lastSeenID, snap.LastID)
			if w.kvs.stale {
				l.setStale(w, false, "resynchronised from a snapshot")
			}
			l.applyKV(w, backlog, time.Now())
			w.kv.Unlock()
			return
		}
		w.kvs.failures++
		l.met.KVResyncFailures.WithLabelValues(w.node).Inc()
		delay := min(retryMin<<min(w.kvs.failures-1, 5), retryMax)
		if w.kvs.failures == 1 {
			l.log.Warn("KV snapshot failed; the worker's overlap counts as unknown until one succeeds; retrying with backoff",
				"worker", w.node, "err", err, "retry_in", delay)
		}
		if !w.kvs.stale {
			l.setStale(w, true, "its KV snapshot failed: "+err.Error())
		}
		w.kv.Unlock()
		select {
		case <-time.After(delay):
		case <-w.kick:
			return
		}
		l.met.KVResyncs.WithLabelValues(w.node, "retry").Inc()
	}
}

// checkReport compares w's load report with the index: a lost event at the end of a
// burst (the index behind the report, with no event coming), drift (the index's block
// count off the worker's cache size once both cover the same events), and whether ids
// move. Called from the heartbeat, with neither lock held.
func (l *Router) checkReport(w *liveWorker, r llm.Load, now time.Time) {
	w.kv.Lock()
	defer w.kv.Unlock()
	if w.kvs.gone || w.kvs.resyncing {
		return
	}
	x := w.model.state.Index()
	last, _ := x.LastID(w.id)
	switch {
	case r.LastEventID > last:
		switch {
		case w.kvs.behindID == 0 || last != w.kvs.behindLast:
			// First seen, or events still arriving: the report may have overtaken them.
			w.kvs.behindID, w.kvs.behindSince, w.kvs.behindLast = max(w.kvs.behindID, r.LastEventID), now, last
		case now.Sub(w.kvs.behindSince) >= l.behindGrace():
			l.log.Info("KV index behind the worker's reports with no event arriving; fetching a snapshot",
				"worker", w.node, "index", last, "reported", w.kvs.behindID, "for", now.Sub(w.kvs.behindSince).Round(time.Millisecond))
			l.startResync(w, "behind")
		}
		return
	case r.LastEventID == last && r.CachedBlocks > 0 || r.LastEventID == last && last > 0:
		w.kvs.behindID = 0
		if n := x.Blocks(w.id); n != r.CachedBlocks && now.Sub(w.kvs.driftAt) >= driftCooldown {
			w.kvs.driftAt = now
			l.met.KVDrift.WithLabelValues(w.node).Inc()
			l.log.Warn("KV index drift: the index holds a different number of blocks for the worker than its cache; resynchronising",
				"worker", w.node, "index_blocks", n, "worker_blocks", r.CachedBlocks, "event_id", last)
			l.startResync(w, "drift")
		}
	default:
		w.kvs.behindID = 0
	}
	if w.kvs.idsMovedAt.IsZero() {
		w.kvs.idsMovedAt = now
	}
	l.idsMoved(w, r.LastEventID, now)
	// Load while the ids stand still: the worker computes prompts but no events come.
	busy := r.Running+r.Waiting > 0
	if busy && !w.kvs.stale && now.Sub(w.kvs.idsMovedAt) >= l.staleAfter() {
		why := "it has load but its KV event ids have not moved for " + now.Sub(w.kvs.idsMovedAt).Round(time.Second).String()
		if !w.kvs.everEvent {
			why += " (it never sent a KV event)"
		}
		l.setStale(w, true, why)
	}
	if !busy {
		w.kvs.idsMovedAt = now // idle: no events expected
	}
}

// setStale marks w stale or not, counting and logging the change; the policy learns it
// at its next decision (post). Called with w.kv.
func (l *Router) setStale(w *liveWorker, stale bool, why string) {
	w.kvs.stale = stale
	if stale {
		l.met.KVStale.WithLabelValues(w.node).Inc()
		how := "its overlap counts as unknown"
		if l.cfg.Policy.RequireKVEvents {
			how = "it gets no requests (--require-kv-events)"
		}
		l.log.Warn("worker's KV index is stale: "+how, "worker", w.node, "why", why)
	} else {
		l.log.Info("worker's KV index is in step again", "worker", w.node, "why", why)
	}
	w.staleFlag.Store(stale)
	l.post(w)
}

// Degraded returns why the router's routing is degraded ("" when it is not): workers whose
// KV index is stale or being resynchronised.
func (l *Router) Degraded() string {
	l.mu.Lock()
	l.drainLocked()
	stale := 0
	for _, w := range l.workers {
		if st, ok := w.model.state.Worker(w.id); ok && st.Stale {
			stale++
		}
	}
	l.mu.Unlock()
	if stale == 0 {
		return ""
	}
	return strconv.Itoa(stale) + " worker" + plural(stale) + " without KV events (stale index: overlap unknown" +
		map[bool]string{true: ", no requests", false: ""}[l.cfg.Policy.RequireKVEvents] + ")"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
