package live

// Disaggregated prefill and decode in the live router (docs/disaggregation.md). With workers
// of role prefill serving a model, a request goes through DecideDisagg: a decode worker D,
// and, when the prompt tokens D lacks are many enough and the prefill pool is not busy, a
// prefill worker P. The router starts both at once: P computes the prompt's KV and the first
// token (Worker.Prefill), which the client gets as soon as P has it; D (Worker.Decode) pulls
// the blocks it lacks from P directly, as P computes them, computes the rest of the prompt
// and the first token again (the same one: its echo is dropped), and decodes on. A failed
// remote prefill or transfer falls back to D computing the prompt, unless
// DisaggConfig.Strict; D's death mid-stream migrates the request as usual.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/cluster"
	"tandem/llm"
	"tandem/orpc"
	"tandem/router"
)

// disaggStream is a liveStream's disaggregation state.
type disaggStream struct {
	pool    router.Pool        // where decode decisions (first, retries, migrations) look
	pre     *router.Decision   // decode decision taken with the prefill's; dispatch's first attempt uses it
	source  *cluster.KVSource  // where D pulls the prompt's KV; nil: D prefills
	pw      *liveWorker        // P, when the prefill runs there
	pres    chan prefillResult // P's answer, while awaited
	pcancel context.CancelFunc // cancels the call to P
	pinfl   router.Inflight    // P's in-flight record
	reason  string             // why the prefill went to P
	pCached int                // prompt tokens P had cached
	skip    bool               // D's first token is P's, sent already: drop it
	srcLost bool               // P left while D pulled from it: D's stream was closed (live_failover.go)
	role    string             // role of the worker streaming now, for the per-pool metrics
	pending []llm.Event        // tokens received before the stream was returned (P's first)
}

type prefillResult struct {
	rep cluster.PrefillReply
	err error
}

// prefillRemote takes the disaggregated decision for s.orig and, if it says so, starts the
// prefill on P under a new transfer id. It returns the request to dispatch to D, at once:
// D pulls the blocks as P computes them (Worker.PullKV waits for them), while the router
// waits for P's first token (awaitPrefill).
func (s *liveStream) prefillRemote(ctx context.Context) (*llm.Request, error) {
	l, m := s.b.l, s.b.m
	if s.orig.Pooling != llm.PoolNone || s.orig.PromptLogprobs {
		// Outputs at prompt positions come from the worker that computes them: one worker.
		return &s.orig, nil
	}
	cfg := l.cfg.Disagg
	l.mu.Lock()
	c, _ := m.state.Card()
	prefillers, _ := m.state.PoolSize(router.PoolPrefill)
	if prefillers == 0 || s.orig.Adapter != "" {
		// No prefill pool, or a LoRA adapter's request (whose prefill worker would need the
		// adapter too): the aggregated path, untouched.
		l.mu.Unlock()
		return &s.orig, nil
	}
	deciders, _ := m.state.PoolSize(router.PoolDecode)
	l.mu.Unlock()
	if deciders > 0 {
		s.dis.pool = router.PoolDecode
	}
	t0 := time.Now()
	hashes := s.blockHashes(c.Salt, c.BlockSize, s.orig.Prompt)
	l.mu.Lock()
	l.drainLocked()
	dd, err := router.DecideDisagg(m.state, router.Request{Hashes: hashes, PromptTokens: len(s.orig.Prompt), SessionID: s.session, Now: t0}, cfg)
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
		l.dis.Prefills.WithLabelValues(router.PrefillLocal, dd.Reason).Inc()
		if dd.Reason == router.ReasonKVFormat {
			l.noPrefillFormat(m, dd.Decode.Worker)
		}
		return &s.orig, nil
	}
	l.met.decision(*dd.Prefill, nil, time.Since(t0))
	s.dis.pinfl = dd.Prefill.Inflight
	if pw == nil {
		s.prefillDone()
		l.dis.Prefills.WithLabelValues(router.PrefillLocal, router.ReasonNoPrefill).Inc()
		return &s.orig, nil
	}
	id := rand.Uint64() | 1
	greq := cluster.GenerateRequest{Request: s.orig, PredictedCached: min(dd.Prefill.HostOverlap*c.BlockSize, len(s.orig.Prompt)),
		DispatchKey: pw.key, DispatchSeq: dd.Prefill.Inflight.Seq()}
	preq := &cluster.PrefillRequest{Generate: greq, HoldMs: int(cfg.Hold / time.Millisecond), TransferID: id}
	pctx, cancel := context.WithCancel(ctx)
	ch := make(chan prefillResult, 1)
	go func() {
		defer cancel()
		var r prefillResult
		r.err = pw.client.Call(pctx, cluster.MethodPrefill, preq, &r.rep)
		ch <- r
	}()
	s.dis.pw, s.dis.pres, s.dis.pcancel, s.dis.reason = pw, ch, cancel, dd.Reason
	s.dis.source = &cluster.KVSource{Addr: pw.addr, Node: pw.node, Handle: id, PromptLen: len(s.orig.Prompt),
		TimeoutMs: int(cfg.TransferTimeout / time.Millisecond), Strict: cfg.Strict}
	return &s.orig, nil
}

// prefillDone ends P's in-flight record.
func (s *liveStream) prefillDone() {
	l := s.b.l
	l.mu.Lock()
	l.drainLocked() // reports received before this change first
	s.b.m.state.RemoveInflight(s.dis.pinfl)
	l.signal()
	l.mu.Unlock()
	s.dis.pinfl = router.Inflight{}
}

// awaitPrefill waits for P's first token, once D has accepted the request. The token is
// the stream's first (D's own first token, the same, is dropped when it comes). If P
// failed, D's pull fails too and D computes the prompt itself, unless strict (then the
// request fails, as it does on P's verdict that the request is invalid).
func (s *liveStream) awaitPrefill(ctx context.Context) error {
	if s.dis.pres == nil {
		return nil
	}
	l, m, pw := s.b.l, s.b.m, s.dis.pw
	var r prefillResult
	select {
	case r = <-s.dis.pres:
	case <-ctx.Done():
		s.abandonRemote()
		return ctx.Err()
	}
	s.dis.pres = nil
	s.prefillDone()
	err := r.err
	if err == nil && r.rep.First.Kind == cluster.EventError {
		err = r.rep.First.Error()
	} else if err == nil && r.rep.First.Kind != cluster.EventToken {
		err = fmt.Errorf("worker %s: unexpected prefill reply kind %d", pw.node, r.rep.First.Kind)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, llm.ErrInvalid) || errors.Is(err, llm.ErrPromptTooLong) {
			return err // the request's own fault: D would say the same
		}
		if workerFailed(err) {
			l.mu.Lock()
			l.drainLocked()                  // reports received before this change first
			m.state.SetHealthy(pw.id, false) // until its next report, if any
			l.mu.Unlock()
		}
		if l.cfg.Disagg.Strict {
			return fmt.Errorf("%w: remote prefill on %s failed: %w", llm.ErrUnavailable, pw.node, err)
		}
		l.dis.Fallbacks.WithLabelValues("prefill").Inc()
		l.log.Warn("remote prefill failed; the decode worker prefills", "prefill_worker", pw.node, "err", err)
		l.dis.Prefills.WithLabelValues(router.PrefillLocal, router.ReasonPrefillFailed).Inc()
		if r.err != nil {
			// The call failed (P's answer would be an error event): P may be dead, and D's
			// pull from it hang until D's connection to P times out (live_failover.go).
			return s.prefillLocally(ctx, err)
		}
		return nil
	}
	l.dis.Prefills.WithLabelValues(router.PrefillRemote, s.dis.reason).Inc()
	ev := r.rep.First.Event
	s.workers = append([]string{pw.node}, s.workers...)
	if ev.Finish != "" { // a stop token, or one token asked for: done on P
		s.dis.pending = append(s.dis.pending, ev)
		s.generated = append(s.generated, ev.Token)
		s.mu.Lock()
		cs := s.cs
		s.mu.Unlock()
		cs.Close()
		s.release()
		s.done = true
		return nil
	}
	s.dis.pCached = ev.Usage.CachedTokens
	ev.Usage = llm.Usage{}
	s.dis.pending = append(s.dis.pending, ev)
	s.generated = append(s.generated, ev.Token)
	s.dis.skip = true
	l.mu.Lock()
	s.mu.Lock()
	if s.w != nil {
		l.drainLocked()            // reports received before this change first
		m.state.PrefillDone(&s.in) // D's prefill is done elsewhere
	}
	s.mu.Unlock()
	l.mu.Unlock()
	return nil
}

// dropEcho reports whether ev is D's first token, which P sent already.
func (s *liveStream) dropEcho(ev llm.Event) bool {
	if !s.dis.skip || ev.Finish != "" {
		return false
	}
	s.dis.skip = false
	if ev.Token != s.generated[0] {
		s.b.l.log.Error("the decode worker's first token differs from the prefill worker's; continuing with the decode worker's",
			"prefill", s.generated[0], "decode", ev.Token)
	}
	return true
}

// dropPre forgets the decode decision taken with the prefill's.
func (s *liveStream) dropPre() {
	if s.dis.pre == nil {
		return
	}
	l := s.b.l
	l.mu.Lock()
	l.drainLocked() // reports received before this change first
	s.b.m.state.RemoveInflight(s.dis.pre.Inflight)
	l.signal()
	l.mu.Unlock()
	s.dis.pre = nil
}

// abandonRemote tells P to free the blocks it holds for a request that will not be decoded.
func (s *liveStream) abandonRemote() {
	s.dropPre()
	if s.dis.pcancel != nil {
		s.dis.pcancel()
	}
	if s.dis.pres != nil {
		s.dis.pres = nil
		s.prefillDone()
	}
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
func (s *liveStream) decide(req router.Request) (router.Decision, error) {
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
		s.dis.role = cluster.RoleBoth
	}
	if s.dis.source == nil || s.migrated > 0 {
		s.dis.skip = false // a migrated request's prompt carries the tokens sent so far
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

// fixUsage makes the final usage of a request whose prompt grew (a migration) describe the
// client's request, and counts as cached what P or D held before it.
func (s *liveStream) fixUsage(u *llm.Usage) {
	if s.migrated > 0 || s.prefix > 0 {
		u.PromptTokens = len(s.orig.Prompt)
		u.CompletionTokens += s.prefix
	}
	u.CachedTokens = min(max(u.CachedTokens, s.dis.pCached), len(s.orig.Prompt))
}

// timedStream records the router's time to first token and inter-token latency by the pool
// of the worker that produced each token.
type timedStream struct {
	*liveStream
	start, last time.Time
	first       time.Time // the first token's
	n           int
	itl         prometheus.Observer // the ITL histogram of itlRole's pool, looked up once
	itlRole     string
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
		role = cluster.RolePrefill
	}
	if role == "" {
		role = cluster.RoleBoth
	}
	if t.n == 0 {
		t.b.l.dis.TTFT.WithLabelValues(role).Observe(now.Sub(t.start).Seconds())
		t.b.l.planFirst(t.b.m.name, role, now.Sub(t.start))
		t.first = now
	} else {
		if t.itl == nil || t.itlRole != role {
			t.itl, t.itlRole = t.b.l.dis.ITL.WithLabelValues(role), role
		}
		t.itl.Observe(now.Sub(t.last).Seconds())
	}
	t.n++
	t.last = now
	if ev.Finish != "" {
		var tpot time.Duration
		if t.n > 1 {
			tpot = now.Sub(t.first) / time.Duration(t.n-1)
		}
		t.b.l.planFinish(t.b.m.name, role, t.worker, ev.Usage.PromptTokens, ev.Usage.CachedTokens, t.n, tpot)
	}
	return ev, nil
}

// noPrefillFormat logs, once per pairing of formats, that decode worker d stores KV in a
// format no healthy prefill worker shares, so that its long prompts are prefilled on it:
// a pull of another format's blocks would be refused after P had computed them.
func (l *Router) noPrefillFormat(m *liveModel, d router.WorkerID) {
	l.mu.Lock()
	dw, _ := m.state.Worker(d)
	node := ""
	if lw := l.workers[d]; lw != nil {
		node = lw.node
	}
	pf := m.state.KVFormats(router.PoolPrefill)
	key := dw.Card.KVFormat + "\x00" + strings.Join(pf, "\x00")
	first := !l.formatsLogged[key]
	if first {
		l.formatsLogged[key] = true
	}
	l.mu.Unlock()
	if first {
		l.log.Warn("no prefill worker stores KV blocks in this decode worker's format, so its long prompts are prefilled on it (logged once per pairing of formats; counted in tandem_router:prefills_total{where=\"local\",reason=\"kv_format_mismatch\"})",
			"model", m.name, "decode_worker", node, "kv_format", dw.Card.KVFormat, "prefill_formats", strings.Join(pf, "; "))
	}
}
