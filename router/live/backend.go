package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/orpc"
	"tandem/router"
)

// DefaultMaxMigrations bounds how often one request moves to another worker after its
// worker failed mid-stream, unless Config.MaxMigrations says otherwise.
const DefaultMaxMigrations = 2

// liveBackend is the openai.Backend of one model: it routes each request to a worker.
type liveBackend struct {
	l *Router
	m *liveModel
}

// Generate hashes the prompt's blocks, asks the policy for a worker (waiting a bounded time
// when every worker is busy), and opens Worker.Generate there. It returns once the worker
// accepted the request, so that the worker's own refusals (400, 429) reach the client.
func (b *liveBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	if len(req.Prompt) == 0 {
		return nil, fmt.Errorf("%w: empty prompt", llm.ErrInvalid)
	}
	start := time.Now()
	b.l.planArrive(b.m.name)
	s := &liveStream{b: b, orig: *req, session: req.Session, ctx: ctx}
	s.orig.Prompt = req.Prompt
	if p := &s.orig.Sampling; !p.HasSeed && p.Temperature > 0 {
		// The router picks the seed, so that a migrated request resumes the same draws.
		p.Seed, p.HasSeed = rand.Uint64(), true
	}
	dreq, err := s.prefillRemote(ctx) // live_disagg.go: with a prefill pool, P may go first
	if err != nil {
		return nil, err
	}
	if dreq != nil {
		if err := s.dispatch(ctx, dreq); err != nil {
			s.abandonRemote()
			return nil, err
		}
		if err := s.awaitPrefill(ctx); err != nil { // P's first token, when P prefills
			s.Close()
			return nil, err
		}
	}
	return s.timed(start), nil
}

// liveStream is a generation on a worker; it implements llm.Stream and openai.WorkerStream.
type liveStream struct {
	b       *liveBackend
	ctx     context.Context // the request's
	orig    llm.Request
	session string

	mu     sync.Mutex // guards cs and in against Close
	cs     *orpc.ClientStream
	w      *liveWorker
	in     router.Inflight
	closed bool
	dis    disaggStream // live_disagg.go

	worker    string
	workers   []string
	generated []int32 // tokens received so far
	migrated  int
	retries   int // dispatches again after a failure before the first token (live_failover.go)
	prefix    int // tokens generated before the current worker took over
	done      bool

	// The block hashes of hashed (under hashSalt, hashBlock tokens a block): the
	// disaggregated decision and the dispatch of the same prompt share them.
	hashes    []uint64
	hashed    []int32
	hashSalt  uint64
	hashBlock int

	ev      cluster.GenerateEvent // the event Next decodes into, one per stream
	batchAt int                   // the next of ev.Tokens to hand out (EventTokens)
}

// blockHashes returns the block hashes of prompt, computed once for the prompt that was
// hashed last (the same slice: a migration's longer prompt is hashed anew).
func (s *liveStream) blockHashes(salt uint64, blockSize int, prompt []int32) []uint64 {
	if s.hashes != nil && s.hashSalt == salt && s.hashBlock == blockSize &&
		len(prompt) == len(s.hashed) && len(prompt) > 0 && &prompt[0] == &s.hashed[0] {
		return s.hashes
	}
	s.hashes = kvcache.HashBlocks(salt, prompt, blockSize, nil)
	s.hashed, s.hashSalt, s.hashBlock = prompt, salt, blockSize
	return s.hashes
}

// noWatch is the stop function of no context watch.
func noWatch() bool { return false }

// Ready implements openai.ReadyStream: the next event is already received (or waits from
// before the stream was handed out). D's echo of P's first token does not count, as Next
// drops it and waits on.
func (s *liveStream) Ready() bool {
	if len(s.dis.pending) > 0 {
		return true
	}
	if s.done || s.dis.skip {
		return false
	}
	if s.batchAt < len(s.ev.Tokens) {
		return true
	}
	s.mu.Lock()
	cs := s.cs
	s.mu.Unlock()
	return cs != nil && cs.Buffered()
}

// Worker names the worker(s) serving the stream.
func (s *liveStream) Worker() string { return strings.Join(s.workers, ",") }

// dispatch routes req to a worker and waits for its Accepted event.
func (s *liveStream) dispatch(ctx context.Context, req *llm.Request) error {
	l, m := s.b.l, s.b.m
	l.mu.Lock()
	c, _ := m.state.Card()
	l.mu.Unlock()
	salt := c.Salt
	adapterPath, loadable := "", false
	if req.Adapter != "" {
		// The adapter's sequences hash with its own salt: the index keys their blocks
		// apart from the base model's and every other adapter's.
		var err error
		if salt, err = l.adapterSalt(ctx, m, req.Adapter); err != nil {
			return err
		}
		l.mu.Lock()
		adapterPath, loadable = m.adapters[req.Adapter] // the router may load it on another worker
		l.mu.Unlock()
	}
	hashes := s.blockHashes(salt, c.BlockSize, req.Prompt)
	greq := &cluster.GenerateRequest{Request: *req, StreamInterval: l.cfg.streamInterval(req)}
	var lastErr error
	var deadline time.Time
	queued := false
	defer func() {
		if queued {
			l.mu.Lock()
			l.queued--
			l.mu.Unlock()
		}
	}()
	for attempt := 0; attempt < l.cfg.MaxAttempts; {
		t0 := time.Now()
		changed := l.changedCh() // before the state is read: a later change wakes us
		l.mu.Lock()
		l.drainLocked()
		d, err := s.decide(router.Request{Hashes: hashes, PromptTokens: len(req.Prompt), SessionID: s.session, Now: t0,
			Adapter: req.Adapter, AdapterLoadable: loadable})
		var w *liveWorker
		greq.Peer = cluster.KVPeer{}
		if err == nil {
			w = l.workers[d.Worker]
			if pw := l.workers[d.Peer]; d.PeerBlocks > 0 && pw != nil && pw.addr != "" {
				// Pulling the prefix from the peer that holds it beats computing it
				// (docs/kv-tiers.md, "Peer pulls").
				greq.Peer = cluster.KVPeer{Addr: pw.addr, Node: pw.node, Blocks: d.PeerBlocks}
			}
		}
		// No worker free (all busy) or none healthy (all suspect, or all gone for a moment):
		// the request waits in the router's queue, up to QueueTimeout.
		wait := errors.Is(err, router.ErrAllBusy) || errors.Is(err, router.ErrNoWorkers)
		l.noneLocked(errors.Is(err, router.ErrNoWorkers), t0)
		if wait && !queued {
			if l.cfg.QueueTimeout < 0 || l.queued >= l.cfg.MaxQueue {
				l.mu.Unlock()
				l.met.decision(d, err, time.Since(t0))
				return err
			}
			queued = true
			l.queued++
			deadline = t0.Add(l.cfg.QueueTimeout)
			cause := "busy"
			if errors.Is(err, router.ErrNoWorkers) {
				cause = "no_workers"
			}
			l.met.Queued.WithLabelValues(cause).Inc()
		}
		l.mu.Unlock()
		l.met.decision(d, err, time.Since(t0))
		if wait {
			wait := time.Until(deadline)
			if wait <= 0 {
				return err
			}
			t := time.NewTimer(wait)
			select {
			case <-changed:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			t.Stop()
			continue
		}
		if err != nil {
			return err
		}
		attempt++
		if w == nil { // removed between Decide and here
			l.mu.Lock()
			l.drainLocked() // reports received before this change first
			m.state.RemoveInflight(d.Inflight)
			l.mu.Unlock()
			lastErr = fmt.Errorf("worker %d left", d.Worker)
			continue
		}
		l.log.Debug("routed", "worker", w.node, "reason", d.Reason, "prompt_blocks", d.PromptBlocks, "overlap", d.Overlap,
			"cost", d.Cost.Total, "candidates", d.Candidates)
		if d.LoadAdapter {
			// Cheaper, at the cost of the load, than the workers that serve the adapter.
			if err := l.loadAdapterOn(ctx, m, w, req.Adapter, adapterPath); err != nil {
				l.mu.Lock()
				m.state.RemoveInflight(d.Inflight)
				l.mu.Unlock()
				return err
			}
		}
		greq.PredictedCached = min(max(d.Runs[len(d.Runs)-1], d.PeerBlocks)*c.BlockSize, len(req.Prompt))
		greq.DispatchKey, greq.DispatchSeq = w.key, d.Inflight.Seq()
		cs, err := s.open(ctx, w, greq)
		var ev cluster.GenerateEvent
		if err == nil {
			err = cs.RecvMsg(&ev)
			if err == nil && ev.Kind == cluster.EventError {
				err = ev.Error()
			} else if err == nil && ev.Kind != cluster.EventAccepted {
				err = fmt.Errorf("worker %s: unexpected first event kind %d", w.node, ev.Kind)
			}
			if err != nil {
				cs.Close()
			}
		}
		if err == nil {
			s.mu.Lock()
			s.cs, s.w, s.in = cs, w, d.Inflight
			if s.closed {
				cs.Close()
			}
			s.mu.Unlock()
			s.worker = w.node
			s.workers = append(s.workers, w.node)
			return nil
		}
		l.mu.Lock()
		l.drainLocked() // reports received before this change first
		m.state.RemoveInflight(d.Inflight)
		l.signal()
		if ctx.Err() == nil && workerFailed(err) {
			m.state.SetHealthy(w.id, false) // until its next report, if any
		}
		l.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !workerFailed(err) {
			return err // the worker's answer: invalid, too long, queue full
		}
		l.log.Warn("worker failed; trying another", "worker", w.node, "err", err)
		lastErr = fmt.Errorf("worker %s: %w", w.node, err)
	}
	return fmt.Errorf("%w: no worker could take the request: %v", llm.ErrUnavailable, lastErr)
}

// workerFailed tells a failure of the worker or its connection (try elsewhere) from the
// worker's verdict on the request.
func workerFailed(err error) bool {
	var st *orpc.Status
	if errors.As(err, &st) {
		return st.Code == orpc.Unavailable || st.Code == orpc.Internal || st.Code == orpc.Unknown || st.Code == orpc.Aborted
	}
	if errors.Is(err, llm.ErrUnavailable) {
		return true
	}
	return !errors.Is(err, llm.ErrInvalid) && !errors.Is(err, llm.ErrPromptTooLong) && !errors.Is(err, llm.ErrQueueFull)
}

// release records the current dispatch as ended, by the router: a failure, a cancel.
func (s *liveStream) release() { s.releaseAt(0) }

// releaseAt records the current dispatch as ended at the worker's engine step step (its
// last event's; 0: not known).
func (s *liveStream) releaseAt(step uint64) {
	s.mu.Lock()
	w, in := s.w, s.in
	s.w = nil
	s.mu.Unlock()
	if w == nil {
		return
	}
	l := s.b.l
	l.mu.Lock()
	l.drainLocked() // reports received before this change first
	w.model.state.RemoveInflightAt(in, step)
	l.signal()
	l.mu.Unlock()
}

// Next returns the next token. When the worker fails mid-stream, the request moves to
// another worker with the tokens generated so far appended to its prompt (at most
// MaxMigrations times); the client sees the same stream.
func (s *liveStream) Next(ctx context.Context) (llm.Event, error) {
	for {
		if ev, ok := s.popPending(); ok {
			return ev, nil
		}
		if s.done {
			return llm.Event{}, io.EOF
		}
		ge := &s.ev
		var err error
		if s.batchAt < len(ge.Tokens) {
			// The next token of an EventTokens message received already.
			ge.Event = ge.Tokens[s.batchAt]
			s.batchAt++
		} else {
			err = s.recv(ctx)
		}
		if err == nil && ge.Kind == cluster.EventError {
			err = ge.Error()
		}
		if err == nil && s.dropEcho(ge.Event) {
			continue // D's first token, the one P sent already
		}
		if err == nil {
			ev := ge.Event
			s.generated = append(s.generated, ev.Token)
			if len(s.generated)-s.prefix == 1 {
				l := s.b.l
				l.mu.Lock()
				s.mu.Lock()
				if s.w != nil {
					l.drainLocked() // reports received before this change first
					s.w.model.state.PrefillDoneAt(&s.in, ev.Step)
				}
				s.mu.Unlock()
				l.mu.Unlock()
			}
			if ev.Finish != "" {
				s.done = true
				s.releaseAt(ev.Step)
				s.fixUsage(&ev.Usage)
				s.b.l.met.usage(ev.Usage)
			}
			return ev, nil
		}
		s.mu.Lock()
		failed := s.w
		s.mu.Unlock()
		s.release()
		if ctx.Err() != nil {
			return llm.Event{}, ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("the worker ended the stream without a finish reason")
		}
		if ferr := s.failover(failed, err); ferr != nil { // live_failover.go
			s.done = true
			return llm.Event{}, ferr
		}
	}
}

// recv reads the worker's next message into s.ev; of an EventTokens message, it leaves
// the first token in s.ev.Event and the others for Next to hand out.
func (s *liveStream) recv(ctx context.Context) error {
	s.mu.Lock()
	cs := s.cs
	s.mu.Unlock()
	// The call watches the context it was opened with (the request's, s.ctx): only
	// another one needs a watch of its own.
	stop := noWatch
	if ctx != s.ctx {
		stop = context.AfterFunc(ctx, func() { cs.Close() })
	}
	unwatch := s.watchSource(cs)                // live_failover.go
	s.ev.Tokens, s.batchAt = s.ev.Tokens[:0], 0 // a failed read leaves none to hand out
	err := cs.RecvMsgReusing(&s.ev)
	stop()
	unwatch()
	if err != nil || s.ev.Kind != cluster.EventTokens {
		return err
	}
	if len(s.ev.Tokens) == 0 {
		return fmt.Errorf("worker %s: a message of no tokens", s.worker)
	}
	s.ev.Event, s.batchAt = s.ev.Tokens[0], 1
	return nil
}

// migrate continues the request on another worker from the tokens generated so far.
func (s *liveStream) migrate(cause error) error {
	l := s.b.l
	s.migrated++
	s.prefix = len(s.generated)
	req := s.orig
	req.Prompt = append(append([]int32(nil), s.orig.Prompt...), s.generated...)
	req.Resumed = s.orig.Resumed + len(s.generated)
	if len(s.generated) > 0 {
		req.PromptLogprobs = false // they came with the first token
	}
	if s.orig.MaxTokens > 0 {
		req.MaxTokens = s.orig.MaxTokens - len(s.generated)
		if req.MaxTokens <= 0 {
			return fmt.Errorf("%w: worker %s failed after the last token: %v", llm.ErrUnavailable, s.worker, cause)
		}
	}
	l.met.Migrations.Inc()
	l.met.WorkerMigrations.WithLabelValues(s.worker).Inc()
	l.log.Warn("worker failed mid-stream; migrating the request", "from", s.worker, "generated", len(s.generated), "err", cause)
	if err := s.dispatch(s.ctx, &req); err != nil {
		return fmt.Errorf("migrating after %v: %w", cause, err)
	}
	return nil
}

// Close ends the generation on the worker and frees its records.
func (s *liveStream) Close() error {
	s.mu.Lock()
	s.closed = true
	cs := s.cs
	s.mu.Unlock()
	if cs != nil {
		cs.Close()
	}
	s.release()
	return nil
}
