package router

// Disaggregated prefill and decode in the live router (docs/disaggregation.md). With workers
// of role prefill serving a model, a request goes through DecideDisagg: a decode worker D,
// and, when the prompt tokens D lacks are many enough and the prefill pool is not busy, a
// prefill worker P. P computes the prompt's KV and the first token (Worker.Prefill), which
// the client gets at once; D then continues the request (Worker.Decode) after pulling the
// blocks it lacks from P directly. A failed remote prefill falls back to D computing the
// prompt, unless DisaggConfig.Strict; D's death mid-stream migrates the request as usual.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/orpc"
)

// disaggStream is a liveStream's disaggregation state.
type disaggStream struct {
	pool    Pool              // where decode decisions (first, retries, migrations) look
	pre     *Decision         // decode decision taken with the prefill's; dispatch's first attempt uses it
	source  *cluster.KVSource // where D pulls the prompt's KV; nil: D prefills
	pw      *liveWorker       // P, when the prefill ran there
	pCached int               // prompt tokens P had cached
	role    string            // role of the worker streaming now, for the per-pool metrics
	pending []llm.Event       // tokens received before the stream was returned (P's first)
}

// prefillRemote takes the disaggregated decision for s.orig and, if it says so, runs the
// prefill on P. It returns the request to dispatch to D (the original, or the original with
// P's first token appended), or nil when the request already finished on P.
func (s *liveStream) prefillRemote(ctx context.Context) (*llm.Request, error) {
	l, m := s.b.l, s.b.m
	cfg := l.cfg.Disagg
	l.mu.Lock()
	c, _ := m.state.Card()
	prefillers, _ := m.state.PoolSize(PoolPrefill)
	deciders, _ := m.state.PoolSize(PoolDecode)
	l.mu.Unlock()
	if prefillers == 0 {
		return &s.orig, nil // no prefill pool: the aggregated path, untouched
	}
	if deciders > 0 {
		s.dis.pool = PoolDecode
	}
	t0 := time.Now()
	hashes := kvcache.HashBlocks(c.Salt, s.orig.Prompt, c.BlockSize, nil)
	l.mu.Lock()
	dd, err := DecideDisagg(m.state, Request{Hashes: hashes, PromptTokens: len(s.orig.Prompt), SessionID: s.session, Now: t0}, cfg)
	var pw *liveWorker
	if err == nil && dd.Prefill != nil {
		pw = l.workers[dd.Prefill.Worker]
	}
	l.mu.Unlock()
	if err != nil {
		return &s.orig, nil // dispatch decides again, queueing while the decode pool is busy
	}
	s.dis.pre = &dd.Decode
	if dd.Prefill == nil {
		l.dis.Prefills.WithLabelValues(PrefillLocal, dd.Reason).Inc()
		return &s.orig, nil
	}
	l.met.decision(*dd.Prefill, nil, time.Since(t0))
	done := func() {
		l.mu.Lock()
		m.state.RemoveInflight(dd.Prefill.Inflight)
		l.signal()
		l.mu.Unlock()
	}
	if pw == nil {
		done()
		l.dis.Prefills.WithLabelValues(PrefillLocal, ReasonNoPrefill).Inc()
		return &s.orig, nil
	}
	greq := cluster.GenerateRequest{Request: s.orig, PredictedCached: min(dd.Prefill.HostOverlap*c.BlockSize, len(s.orig.Prompt))}
	var rep cluster.PrefillReply
	err = pw.client.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{Generate: greq, HoldMs: int(cfg.Hold / time.Millisecond)}, &rep)
	done()
	if err == nil && rep.First.Kind == cluster.EventError {
		err = rep.First.Error()
	} else if err == nil && rep.First.Kind != cluster.EventToken {
		err = fmt.Errorf("worker %s: unexpected prefill reply kind %d", pw.node, rep.First.Kind)
	}
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, llm.ErrInvalid) || errors.Is(err, llm.ErrPromptTooLong) {
			s.dropPre()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err // the request's own fault: D would say the same
		}
		if workerFailed(err) {
			l.mu.Lock()
			m.state.SetHealthy(pw.id, false) // until its next report, if any
			l.mu.Unlock()
		}
		l.dis.Fallbacks.WithLabelValues("prefill").Inc()
		if cfg.Strict {
			s.dropPre()
			return nil, fmt.Errorf("%w: remote prefill on %s failed: %v", llm.ErrUnavailable, pw.node, err)
		}
		l.log.Warn("remote prefill failed; the decode worker prefills", "prefill_worker", pw.node, "err", err)
		l.dis.Prefills.WithLabelValues(PrefillLocal, ReasonPrefillFailed).Inc()
		return &s.orig, nil
	}
	l.dis.Prefills.WithLabelValues(PrefillRemote, dd.Reason).Inc()
	ev := rep.First.Event
	s.generated = append(s.generated, ev.Token)
	s.prefix = 1
	s.workers = append(s.workers, pw.node)
	s.worker = pw.node
	s.dis.role = RolePrefill
	if ev.Finish != "" { // a stop token, or one token asked for: done on P
		s.dropPre()
		s.dis.pending = append(s.dis.pending, ev)
		s.done = true
		return nil, nil
	}
	s.dis.pCached = ev.Usage.CachedTokens
	ev.Usage = llm.Usage{}
	s.dis.pending = append(s.dis.pending, ev)
	l.mu.Lock()
	m.state.PrefillDone(&s.dis.pre.Inflight) // D's prefill work is done elsewhere
	l.mu.Unlock()
	s.dis.pw = pw
	s.dis.source = &cluster.KVSource{Addr: pw.addr, Node: pw.node, Handle: rep.Handle, PromptLen: len(s.orig.Prompt),
		TimeoutMs: int(cfg.TransferTimeout / time.Millisecond), Strict: cfg.Strict}
	req := s.orig
	req.Prompt = append(slices.Clone(s.orig.Prompt), ev.Token)
	req.Resumed = s.orig.Resumed + 1 // D's sampler replays P's draw: seeded sampling matches
	if req.MaxTokens > 0 {
		req.MaxTokens--
	}
	return &req, nil
}

// dropPre forgets the decode decision taken with the prefill's.
func (s *liveStream) dropPre() {
	if s.dis.pre == nil {
		return
	}
	l := s.b.l
	l.mu.Lock()
	s.b.m.state.RemoveInflight(s.dis.pre.Inflight)
	l.signal()
	l.mu.Unlock()
	s.dis.pre = nil
}

// abandonRemote tells P to free the blocks it holds for a request that will not be decoded.
func (s *liveStream) abandonRemote() {
	s.dropPre()
	pw, src := s.dis.pw, s.dis.source
	if pw == nil || src == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		pw.client.Call(ctx, cluster.MethodReleaseKV, &cluster.ReleaseRequest{Handle: src.Handle}, &cluster.ReleaseReply{})
	}()
}

// decide is dispatch's decision: the decode decision taken with the prefill's, the first
// time, else the policy's over the stream's pool. Called with l.mu held.
func (s *liveStream) decide(req Request) (Decision, error) {
	if d := s.dis.pre; d != nil {
		s.dis.pre = nil
		return *d, nil
	}
	req.Pool = s.dis.pool
	return s.b.m.state.Decide(req)
}

// open starts the request on worker w: Worker.Decode when its prompt's KV is on a prefill
// worker, else Worker.Generate (always after a migration: the new worker computes).
func (s *liveStream) open(ctx context.Context, w *liveWorker, greq *cluster.GenerateRequest) (*orpc.ClientStream, error) {
	l := s.b.l
	l.mu.Lock()
	st, _ := s.b.m.state.Worker(w.id)
	l.mu.Unlock()
	s.dis.role = st.Card.Role
	if s.dis.role == "" {
		s.dis.role = RoleBoth
	}
	if s.dis.source == nil || s.migrated > 0 {
		return w.client.Stream(ctx, cluster.MethodGenerate, greq)
	}
	return w.client.Stream(ctx, cluster.MethodDecode, &cluster.DecodeRequest{Generate: *greq, Source: *s.dis.source})
}

// popPending returns a token received before the stream was handed out.
func (s *liveStream) popPending() (llm.Event, bool) {
	if len(s.dis.pending) == 0 {
		return llm.Event{}, false
	}
	ev := s.dis.pending[0]
	s.dis.pending = s.dis.pending[1:]
	return ev, true
}

// fixUsage makes the final usage of a request whose prompt grew (a migration, or P's first
// token) describe the client's request.
func (s *liveStream) fixUsage(u *llm.Usage) {
	if s.migrated == 0 && s.prefix == 0 {
		return
	}
	u.PromptTokens = len(s.orig.Prompt)
	u.CachedTokens = min(max(u.CachedTokens, s.dis.pCached), len(s.orig.Prompt))
	u.CompletionTokens += s.prefix
}

// timedStream records the router's time to first token and inter-token latency by the pool
// of the worker that produced each token.
type timedStream struct {
	*liveStream
	start, last time.Time
	n           int
}

func (s *liveStream) timed(start time.Time) *timedStream {
	return &timedStream{liveStream: s, start: start}
}

// Next implements llm.Stream.
func (t *timedStream) Next(ctx context.Context) (llm.Event, error) {
	fromP := len(t.dis.pending) > 0 // only P's first token waits there
	ev, err := t.liveStream.Next(ctx)
	if err != nil {
		return ev, err
	}
	now := time.Now()
	role := t.dis.role
	if fromP {
		role = RolePrefill
	}
	if role == "" {
		role = RoleBoth
	}
	if t.n == 0 {
		t.b.l.dis.TTFT.WithLabelValues(role).Observe(now.Sub(t.start).Seconds())
	} else {
		t.b.l.dis.ITL.WithLabelValues(role).Observe(now.Sub(t.last).Seconds())
	}
	t.n++
	t.last = now
	return ev, nil
}
