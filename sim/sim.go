package sim

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"tandem/bench"
	"tandem/kvcache"
	"tandem/planner"
	"tandem/router"
	"tandem/sched"
)

// Config describes a simulated cluster. Zero values take the defaults noted.
type Config struct {
	Workers int // simulated workers (role both); 0 → 4, unless disaggregated
	// PrefillWorkers and DecodeWorkers, both positive, make the cluster disaggregated
	// (disagg.go): workers of role prefill and decode instead of Workers; Disagg is the
	// router's disaggregation policy (MinRemoteTokens 0: 256) and KVBytesPerToken the
	// model's KV bytes per token, which a transfer moves (0: 131072, an 8B model's bf16).
	PrefillWorkers, DecodeWorkers int
	Disagg                        router.DisaggConfig
	KVBytesPerToken               int64
	// Planner, if set, runs the SLA planner in the loop (plan.go): it resizes the pools
	// every LoadInterval of virtual time; a new worker serves Startup after it is asked
	// for, and a removed one drains (its requests finish) before it leaves. Its Perf and
	// Capacity default to this simulation's.
	Planner *planner.Config
	// Scripted, instead of a planner, sizes the pools by script: every 5 s of virtual
	// time each pool is brought to Scripted(t) workers (t from the first arrival; at
	// least one), asked for and removed as the planner's are. A deployment sized in
	// hindsight, knowing the whole workload, is one.
	Scripted       func(t time.Duration) [planner.NumPools]int
	Startup        time.Duration
	Router         router.Config // the policy; its Card is filled in by Run
	Timing         Timing        // compute model; zero → GPUTiming
	BlockSize      int           // KV block size in tokens; 0 → 16
	KVBlocks       int           // KV blocks per worker; 0 → 28672 (≈ 459k tokens)
	TokenBudget    int           // tokens per step (max_num_batched_tokens); 0 → 8192
	MaxSeqs        int           // running sequences per worker; 0 → 256
	ReportInterval time.Duration // load reports; 0 → 100 ms
	// ReportDelay and EventDelay are how long a load report and a KV event take to reach
	// the router (network and queueing); 0: at once. Meanwhile the router decides on what it
	// knew, plus its own in-flight predictions, as the live router does.
	ReportDelay, EventDelay time.Duration
	Seed                    int64     // seeds the router's RNG (random mode, softmax)
	Percentiles             []float64 // nil → 90, 99
	// OnPlan, if set, is called with each step's plan on a worker (its String is what the
	// sched package's tests print), when the plan runs or preempts or drops a sequence;
	// the plan is valid during the call only.
	OnPlan func(worker int, plan fmt.Stringer)
	// ITLTarget is the engine's inter-token latency target (tandem serve --itl-target):
	// a step with decode tokens reads only the prompt tokens that Timing predicts within
	// it (package sched's policy, with Timing as its cost model); 0: none. ITLDecodes, when
	// positive, sets it at each step to that many times the step's decodes alone, as
	// sched.Config.ITLDecodes.
	ITLTarget  time.Duration
	ITLDecodes float64
	// Tiers are each worker's lower KV tiers and their measured costs (tiers.go); the zero
	// value has none.
	Tiers TierModel
}

func (c *Config) defaults() error {
	if c.PrefillWorkers < 0 || c.DecodeWorkers < 0 || (c.PrefillWorkers > 0) != (c.DecodeWorkers > 0) {
		return fmt.Errorf("sim: a disaggregated cluster needs both prefill and decode workers (got %d and %d)", c.PrefillWorkers, c.DecodeWorkers)
	}
	if c.disaggregated() {
		if c.Workers > 0 {
			return fmt.Errorf("sim: workers of role both (%d) and a disaggregated cluster do not mix", c.Workers)
		}
		c.Disagg.MinRemoteTokens = cmp.Or(c.Disagg.MinRemoteTokens, router.DefaultDisaggConfig().MinRemoteTokens)
	} else {
		c.Workers = cmp.Or(c.Workers, 4)
	}
	if c.Planner != nil && c.Scripted != nil {
		return errors.New("sim: a planner and a script both size the pools")
	}
	c.KVBytesPerToken = cmp.Or(c.KVBytesPerToken, 131072)
	if c.Startup < 0 || c.KVBytesPerToken < 0 {
		return fmt.Errorf("sim: start-up time and KV bytes per token must be ≥ 0")
	}
	if c.Timing == (Timing{}) {
		c.Timing = GPUTiming()
	}
	c.BlockSize = cmp.Or(c.BlockSize, 16)
	c.KVBlocks = cmp.Or(c.KVBlocks, 28672)
	c.TokenBudget = cmp.Or(c.TokenBudget, 8192)
	c.MaxSeqs = cmp.Or(c.MaxSeqs, 256)
	c.ReportInterval = cmp.Or(c.ReportInterval, 100*time.Millisecond)
	if c.Percentiles == nil {
		c.Percentiles = []float64{90, 99}
	}
	c.Tiers.defaults()
	if (c.Workers < 1 && !c.disaggregated()) || c.BlockSize < 1 || c.KVBlocks < 1 || c.TokenBudget < 1 || c.MaxSeqs < 1 || c.ReportInterval < 0 {
		return fmt.Errorf("sim: workers, block size, KV blocks, token budget, max seqs and report interval must be positive")
	}
	if c.ReportDelay < 0 || c.EventDelay < 0 || c.ITLTarget < 0 || c.ITLDecodes < 0 {
		return fmt.Errorf("sim: report and event delays and the ITL target must be ≥ 0")
	}
	return c.Timing.validate()
}

func (c *Config) disaggregated() bool { return c.PrefillWorkers > 0 || c.DecodeWorkers > 0 }

// A Request is one request of a replay: its arrival, its prompt as synthetic
// segments (equal segments give equal tokens, hence shared prefixes) and the
// number of tokens it generates. A conversation's later turns are its
// FollowUps: each is sent Think after the previous turn's last token, its
// prompt the whole conversation so far (the earlier prompts and the generated
// answers) followed by its own segments, as tandem bench's multi-turn
// workload sends them.
type Request struct {
	At        time.Duration
	Segments  []bench.Segment
	OutputLen int
	FollowUps []bench.Request
	Think     time.Duration
	Priority  int // on its worker, as llm.Request's: lower first; the follow-ups keep it
}

// FromWorkload takes a workload's sessions, arriving at their At (untimed
// workloads: all at once); see FromSessions.
func FromWorkload(w bench.Workload) ([]Request, error) {
	ss := w.Sessions()
	at := make([]time.Duration, len(ss))
	for i, s := range ss {
		at[i] = s.At
	}
	return FromSessions(ss, at)
}

// FromSessions makes one Request per session, arriving at at[i] (in
// non-decreasing order), its later turns as follow-ups. Prompts must be
// synthetic (segments, not literal text).
func FromSessions(ss []bench.Session, at []time.Duration) ([]Request, error) {
	if len(at) != len(ss) {
		return nil, fmt.Errorf("sim: %d arrival times for %d sessions", len(at), len(ss))
	}
	var reqs []Request
	for i, s := range ss {
		if len(s.Turns) == 0 {
			return nil, fmt.Errorf("sim: session %d has no turns", i)
		}
		for _, t := range s.Turns {
			if len(t.Segments) == 0 {
				return nil, fmt.Errorf("sim: session %d: only synthetic prompts (segments) can be simulated", i)
			}
		}
		reqs = append(reqs, Request{At: at[i], Segments: s.Turns[0].Segments, OutputLen: s.Turns[0].OutputLen,
			FollowUps: s.Turns[1:], Think: s.Think})
	}
	return reqs, nil
}

// WorkerStats is what one simulated worker did.
type WorkerStats struct {
	Requests      int           // requests routed to it
	PrefillTokens int           // prompt tokens computed (cache hits excluded, recomputes included)
	DecodeTokens  int           // tokens decoded
	CachedTokens  int           // prompt tokens served from its prefix cache
	Preemptions   int           // sequences preempted for lack of KV blocks
	Steps         int           // forward passes
	OverTarget    int           // of those, the ones with decode tokens predicted past the ITL target
	Busy          time.Duration // time spent in steps
	MeanActive    float64       // requests on the worker (waiting or running), time-averaged
	Role          string        // both, prefill or decode
	// Alive is how long the worker was paid for: from when it was asked for (the start
	// for the first ones) until it left or the run ended.
	Alive time.Duration
	Tiers TierStats // lower tiers and peer pulls (tiers.go)
}

// Result is a finished simulation.
type Result struct {
	Bench   *bench.Result // the same report tandem bench writes
	Routing router.Mode
	Config  Config

	PromptTokens, CachedTokens int     // over first admissions
	HitRate                    float64 // CachedTokens / PromptTokens
	// IdealHitRate is the hit rate of one prefix cache of unbounded size that every
	// request passes through in arrival order, at the same block size and with the same
	// rule (full blocks, the last prompt token always computed): the most any routing
	// and any KV capacity could reach. The gap to HitRate is what finite per-worker
	// caches (eviction) and spreading prefixes over workers cost.
	IdealHitRate float64
	Workers      []WorkerStats
	// Load imbalance: max/mean and coefficient of variation of per-worker
	// processed tokens (prefill + decode); ActiveImbalance is the mean over
	// load-report ticks with work of max/mean requests on a worker.
	TokenImbalance, TokenCV, ActiveImbalance float64
	RouterQueued                             int // requests that waited in the router (all workers busy)
	Events                                   int // events processed

	// WorkerSeconds is the workers' Alive time summed by pool (planner.Aggregated,
	// Prefill, Decode), from the first arrival to the last token.
	WorkerSeconds [planner.NumPools]float64
	// RemotePrefills counts the requests prefilled on a prefill worker; Transferred the KV
	// bytes their decode workers pulled.
	RemotePrefills int
	Transferred    int64
	Plan           *PlanResult // with Config.Planner: its decisions and the pools over time
}

// sreq is one request of the replay. Its sched.Seq's ID is its index in sim.reqs plus one,
// and Tokens (the prompt, then the generated tokens) is nil until it is routed.
type sreq struct {
	sched.Seq
	session int
	next    *sreq // the conversation's next turn, sent think after this one ends
	think   time.Duration
	at      time.Duration
	segs    []bench.Segment
	outLen  int

	inflight router.Inflight
	worker   int

	first time.Duration
	times []time.Duration // token emission times
	err   string

	// Disaggregated (disagg.go): twin is the record of r's prefill on a prefill worker,
	// parent the request a twin prefills for; overlap is the decode worker's cached
	// leading blocks (not transferred), xferEnd when the last block reaches it, imp the
	// decode worker's import holding the blocks until r is admitted, echo that r's first
	// token on its decode worker is the one its prefill worker sent already.
	twin, parent *sreq
	overlap      int
	xferEnd      time.Duration
	xferBytes    int64
	imp          *kvcache.Seq
	echo         bool
	firstPool    planner.Pool
}

// hits is r's prompt tokens served from a prefix cache where its prompt was computed.
func (r *sreq) hits() int {
	if r.twin != nil {
		return r.twin.Cached()
	}
	return r.Cached()
}

func (r *sreq) index() int { return int(r.ID) - 1 }

type worker struct {
	id        int
	role      string
	state     workerState
	born      time.Duration // asked for
	goneAt    time.Duration
	linkFree  time.Duration // a prefill worker's KV link is busy until then
	imports   int           // requests routed here waiting for their KV (disagg.go)
	hitsAt    int           // CachedTokens at the last plan tick
	pool      *kvcache.Pool
	events    <-chan kvcache.Event
	sched     *sched.Scheduler[*sreq]
	plan      *sched.Plan[*sreq] // the step in flight
	stepping  bool
	kicking   bool // an evKick is queued
	stats     WorkerStats
	activeAt  time.Duration // for the time-weighted active count
	activeNs  float64
	inTransit []delayed // KV events and load reports on their way to the router, in time order
	tiers     tierWorker
	pulling   []pull // requests pulling their prefix from a peer before they are queued
}

// delayed is a KV event or load report that reaches the router at t.
type delayed struct {
	t      time.Duration
	ev     kvcache.Event
	report *router.LoadReport
}

type event struct {
	t    time.Duration
	seq  uint64
	kind int
	w    int
	r    int
}

const (
	evArrival = iota
	evStepEnd
	evReport
	evKick
	evDeliver   // a worker's delayed events and reports arrive
	evImport    // a request's KV reached its decode worker
	evReady     // a new worker has started
	evPlan      // the planner's tick
	evOnboarded // a sequence's loads from lower tiers are done (tiers.go)
	evPulled    // a request's peer pull is done (tiers.go)
)

// workerState is a worker's life: asked for and starting, serving, draining (no new
// requests; it leaves when its last one ends), gone.
type workerState uint8

const (
	starting workerState = iota
	ready
	draining
	gone
)

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// epoch is virtual time zero, for the router's clock.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type sim struct {
	cfg                Config
	salt               uint64
	state              *router.State
	workers            []*worker
	reqs               []*sreq
	queue              eventQueue
	nseq               uint64
	now                time.Duration
	rqueue             []*sreq // router queue: all workers busy
	left               int     // requests not finished
	queued             int
	events             int
	hashes             []uint64
	ideal              map[uint64]struct{} // every block hash seen, for IdealHitRate
	idealHit, idealAll int
	actSum             float64
	actN               int

	t0       time.Duration // the first arrival
	card     router.Card
	counters planner.Counters
	sizer    sizer         // the planner or the script (Config.Scripted)
	sizeTick time.Duration // how often it is asked
	plan     *PlanResult
	remote   int
	moved    int64
}

// Run replays reqs over cfg.Workers simulated workers, routing each request
// with the router's own Decide.
func Run(cfg Config, reqs []Request) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("sim: no requests")
	}
	s := &sim{cfg: cfg, salt: kvcache.Salt("sim", "", ""), ideal: map[uint64]struct{}{}, t0: reqs[0].At, now: reqs[0].At}
	rc := cfg.Router
	rc.Card = router.Card{Model: "sim", HashVersion: kvcache.HashVersion, BlockSize: cfg.BlockSize, Salt: s.salt, KVBlocks: cfg.KVBlocks}
	s.card = rc.Card
	var err error
	if s.state, err = router.NewState(rc, rand.New(rand.NewPCG(uint64(cfg.Seed), 0x51a1))); err != nil {
		return nil, err
	}
	roles := map[string]int{router.RoleBoth: cfg.Workers, router.RolePrefill: cfg.PrefillWorkers, router.RoleDecode: cfg.DecodeWorkers}
	for _, role := range []string{router.RoleBoth, router.RolePrefill, router.RoleDecode} {
		for range roles[role] {
			if _, err := s.addWorker(role, true); err != nil {
				return nil, err
			}
		}
	}
	if cfg.Planner != nil || cfg.Scripted != nil {
		if err := s.startPlanner(); err != nil {
			return nil, err
		}
	}
	var later []*sreq // follow-up turns, numbered after the first turns
	for i, r := range reqs {
		if i > 0 && r.At < reqs[i-1].At {
			return nil, fmt.Errorf("sim: request %d arrives before request %d", i, i-1)
		}
		q := &sreq{Seq: sched.Seq{ID: uint64(i) + 1, Priority: r.Priority}, session: i, at: r.At, segs: r.Segments,
			outLen: max(r.OutputLen, 1), worker: -1, think: r.Think}
		for _, sg := range r.Segments {
			q.PromptLen += sg.Len
		}
		if q.PromptLen == 0 {
			return nil, fmt.Errorf("sim: request %d has an empty prompt", i)
		}
		s.reqs = append(s.reqs, q)
		s.push(event{t: r.At, kind: evArrival, r: i})
		prev := q
		for _, f := range r.FollowUps {
			n := &sreq{Seq: sched.Seq{Priority: r.Priority}, session: i, segs: f.Segments, outLen: max(f.OutputLen, 1), worker: -1, think: r.Think}
			prev.next, prev = n, n
			later = append(later, n)
		}
	}
	for _, q := range later {
		q.ID = uint64(len(s.reqs)) + 1
		s.reqs = append(s.reqs, q)
	}
	s.left = len(s.reqs)
	if cfg.ReportInterval > 0 {
		s.push(event{t: reqs[0].At, kind: evReport})
	}
	for s.queue.Len() > 0 && s.left > 0 {
		e := heap.Pop(&s.queue).(event)
		s.now = e.t
		s.events++
		switch e.kind {
		case evArrival:
			s.route(s.reqs[e.r])
		case evStepEnd:
			s.stepEnd(s.workers[e.w])
			s.retryQueue()
		case evDeliver:
			s.deliver(s.workers[e.w])
			s.retryQueue()
		case evKick:
			s.workers[e.w].kicking = false
			s.kick(s.workers[e.w])
		case evOnboarded:
			s.onboarded(s.workers[e.w], s.reqs[e.r])
		case evPulled:
			s.pulled(s.workers[e.w], s.reqs[e.r])
		case evReport:
			s.report()
			s.retryQueue()
			if s.left > 0 {
				s.push(event{t: s.now + cfg.ReportInterval, kind: evReport})
			}
		case evImport:
			s.importKV(s.reqs[e.r])
		case evReady:
			s.ready(s.workers[e.w])
			s.retryQueue()
		case evPlan:
			s.planTick()
			s.retryQueue()
		}
	}
	return s.result(), nil
}

func (s *sim) push(e event) {
	s.nseq++
	e.seq = s.nseq
	heap.Push(&s.queue, e)
}

// route decides r's worker with the router's policy, or holds it in the
// router queue when every worker is busy.
func (s *sim) route(r *sreq) {
	if r.Tokens == nil {
		r.Tokens = make([]int32, 0, r.PromptLen+r.outLen)
		var buf []uint32
		for _, sg := range r.segs {
			buf = sg.Tokens(buf[:0])
			for _, t := range buf {
				r.Tokens = append(r.Tokens, int32(t&0x7fffffff))
			}
		}
	}
	s.idealMatch(r)
	s.counters.Arrive()
	if len(s.rqueue) > 0 || !s.dispatch(r) { // first come, first served
		s.rqueue = append(s.rqueue, r)
		s.queued++
	}
}

// idealMatch counts r's prompt against the unbounded cache of IdealHitRate, then adds it.
func (s *sim) idealMatch(r *sreq) {
	bs := s.cfg.BlockSize
	s.hashes = kvcache.HashBlocks(s.salt, r.Tokens, bs, s.hashes[:0])
	usable := (r.PromptLen - 1) / bs // Match leaves at least one token to compute
	hit := 0
	for hit < min(usable, len(s.hashes)) {
		if _, ok := s.ideal[s.hashes[hit]]; !ok {
			break
		}
		hit++
	}
	s.idealHit += hit * bs
	s.idealAll += r.PromptLen
	for _, h := range s.hashes {
		s.ideal[h] = struct{}{}
	}
}

// dispatch asks the router for r's worker; false when all are busy.
func (s *sim) dispatch(r *sreq) bool {
	s.hashes = kvcache.HashBlocks(s.salt, r.Tokens, s.cfg.BlockSize, s.hashes[:0])
	req := router.Request{Hashes: s.hashes, PromptTokens: r.PromptLen, Now: epoch.Add(s.now)}
	if s.cfg.disaggregated() {
		return s.dispatchDisagg(r, req)
	}
	d, err := s.state.Decide(req)
	if errors.Is(err, router.ErrAllBusy) || errors.Is(err, router.ErrNoWorkers) && s.waitForWorkers() {
		return false
	}
	if err != nil {
		s.fail(r, err.Error())
		return true
	}
	r.inflight = d.Inflight
	w := s.workers[d.Worker]
	r.worker = w.id
	w.stats.Requests++
	if !w.sched.Fits(len(r.Tokens)) { // as the engine refuses it up front
		s.state.RemoveInflight(r.inflight)
		s.fail(r, fmt.Sprintf("sim: %d tokens exceed the KV capacity of %d blocks", len(r.Tokens), s.cfg.KVBlocks))
		return true
	}
	s.account(w)
	if d.PeerBlocks > 0 && s.startPull(w, r, d) {
		return true // queued when its pull is done
	}
	w.sched.Add(r)
	if !w.stepping && !w.kicking { // start after the other arrivals of this instant
		w.kicking = true
		s.push(event{t: s.now, kind: evKick, w: w.id})
	}
	return true
}

func (s *sim) retryQueue() {
	for len(s.rqueue) > 0 {
		if !s.dispatch(s.rqueue[0]) {
			return
		}
		s.rqueue = s.rqueue[1:]
	}
}

func (s *sim) fail(r *sreq, msg string) {
	r.err = msg
	r.Tokens = nil
	s.left--
	for q := r.next; q != nil; q = q.next {
		q.err = "sim: an earlier turn of the conversation failed"
		s.left--
	}
}

// followUp sends the turn after r, which has just finished: its prompt is r's
// prompt and answer, then its own segments.
func (s *sim) followUp(r *sreq) {
	q := r.next
	q.Tokens = make([]int32, len(r.Tokens), len(r.Tokens)+q.outLen+64)
	copy(q.Tokens, r.Tokens)
	var buf []uint32
	for _, sg := range q.segs {
		buf = sg.Tokens(buf[:0])
		for _, t := range buf {
			q.Tokens = append(q.Tokens, int32(t&0x7fffffff))
		}
	}
	q.PromptLen = len(q.Tokens)
	q.at = s.now + r.think
	s.push(event{t: q.at, kind: evArrival, r: q.index()})
}

// account adds w's requests since the last call to its time-weighted count;
// call it before a request joins or leaves the worker.
func (s *sim) account(w *worker) {
	n := len(w.sched.Waiting()) + len(w.sched.Running()) + len(w.sched.Onboarding()) + len(w.pulling)
	w.activeNs += float64(n) * float64(s.now-w.activeAt)
	w.activeAt = s.now
}

// kick starts a step on w if it is idle and has work.
func (s *sim) kick(w *worker) {
	if w.stepping {
		return
	}
	dur, ok := s.schedule(w)
	s.runTransfers(w)
	s.drain(w)
	if !ok {
		return
	}
	w.stepping = true
	w.stats.Steps++
	w.stats.Busy += dur
	s.push(event{t: s.now + dur, kind: evStepEnd, w: w.id})
}

// schedule plans w's next step with the engine's own policy (package sched) and returns
// its duration in the timing model.
func (s *sim) schedule(w *worker) (time.Duration, bool) {
	s.account(w) // Schedule may drop a sequence
	p := w.sched.Schedule()
	w.plan = p
	if len(p.Onboard) > 0 {
		s.startOnboards(w, p.Onboard)
	}
	for _, r := range p.Admitted {
		w.stats.CachedTokens += r.Cached()
		if r.imp != nil { // the sequence holds the imported blocks now
			r.imp.Release()
			r.imp = nil
		}
	}
	w.stats.Preemptions += len(p.Preempted)
	for _, r := range p.Dropped {
		s.state.RemoveInflight(r.inflight)
		s.fail(r, fmt.Sprintf("sim: %d tokens no longer fit the KV capacity of %d blocks", len(r.Tokens), s.cfg.KVBlocks))
	}
	if s.cfg.OnPlan != nil && (len(p.Chunks) > 0 || len(p.Preempted) > 0 || len(p.Dropped) > 0) {
		s.cfg.OnPlan(w.id, p)
	}
	if len(p.Chunks) == 0 && len(w.sched.Running()) == 0 {
		// The blocks that waiting requests' imports hold (disagg.go) can fill a decode
		// worker's KV so that none of them can start: the latest gives its blocks back to
		// the prefix cache, which it may still match when its turn comes, as an engine
		// evicts; counted as a preemption.
		waiting := w.sched.Waiting()
		for i := len(waiting) - 1; i >= 0; i-- {
			if r := waiting[i]; r.imp != nil {
				r.imp.Release()
				r.imp = nil
				w.stats.Preemptions++
				return s.schedule(w)
			}
		}
	}
	if len(p.Chunks) == 0 {
		return 0, false
	}
	if p.OverTarget {
		w.stats.OverTarget++
	}
	w.stats.PrefillTokens += p.Shape.PrefillTokens
	w.stats.DecodeTokens += p.Shape.DecodeSeqs
	return max(s.cfg.Timing.Step(p.Shape), 1), true
}

// stepEnd commits the step's KV, emits tokens and finishes requests.
func (s *sim) stepEnd(w *worker) {
	w.stepping = false
	w.sched.Commit()
	for _, c := range w.plan.Chunks {
		if c.Seq.parent != nil {
			s.transfer(w, c.Seq, c.From, c.N)
		}
		if c.Samples() {
			s.emit(w, c.Seq)
		}
	}
	s.drain(w)
	s.kick(w)
	s.drained(w)
}

// emit records a generated token of r at the current time.
func (s *sim) emit(w *worker, r *sreq) {
	if r.parent != nil {
		s.prefilled(w, r)
		return
	}
	// The k-th generated token is a function of the request and k, wherever it is computed.
	r.Tokens = append(r.Tokens, int32(splitmix(uint64(r.index())<<20^uint64(r.Generated()+1))&0x7fffffff))
	switch {
	case r.echo: // the prefill worker's first token, sent already
		r.echo = false
		s.state.PrefillDone(&r.inflight)
	case len(r.times) == 0:
		r.first = s.now
		r.firstPool = poolOf(w.role)
		s.counters.FirstToken(r.firstPool, s.now-r.at)
		s.state.PrefillDone(&r.inflight)
		r.times = append(r.times, s.now)
	default:
		r.times = append(r.times, s.now)
	}
	if len(r.times) < r.outLen {
		return
	}
	s.account(w)
	w.sched.Finish(r)
	var tpot time.Duration
	if n := len(r.times); n > 1 {
		tpot = (r.times[n-1] - r.first) / time.Duration(n-1)
	}
	s.counters.Finish(poolOf(w.role), r.PromptLen, r.hits(), len(r.times), tpot)
	if r.next != nil {
		s.followUp(r)
	}
	r.Tokens = nil
	s.state.RemoveInflight(r.inflight)
	s.left--
}

// drain feeds w's KV events to the router's index, resynchronising from a
// snapshot on a gap.
func (s *sim) drain(w *worker) {
	for {
		select {
		case ev := <-w.events:
			if s.cfg.EventDelay > 0 {
				s.send(w, delayed{t: s.now + s.cfg.EventDelay, ev: ev})
				continue
			}
			s.apply(w, ev)
		default:
			return
		}
	}
}

func (s *sim) apply(w *worker, ev kvcache.Event) {
	gap, err := s.state.ApplyEvent(router.WorkerID(w.id), ev)
	if err == nil && gap {
		s.state.ResetWorker(router.WorkerID(w.id), w.pool.Snapshot())
	}
}

// send puts d on its way to the router. Both delays are constant, so one kind arrives in
// the order sent; with two different delays, the queue is kept in arrival-time order.
func (s *sim) send(w *worker, d delayed) {
	i := len(w.inTransit)
	for i > 0 && w.inTransit[i-1].t > d.t {
		i--
	}
	w.inTransit = append(w.inTransit, delayed{})
	copy(w.inTransit[i+1:], w.inTransit[i:])
	w.inTransit[i] = d
	s.push(event{t: d.t, kind: evDeliver, w: w.id})
}

// deliver hands the router what has reached it from w by now.
func (s *sim) deliver(w *worker) {
	n := 0
	for _, d := range w.inTransit {
		if d.t > s.now {
			break
		}
		n++
		if d.report != nil {
			s.state.Report(router.WorkerID(w.id), *d.report, epoch.Add(d.t))
		} else {
			s.apply(w, d.ev)
		}
	}
	w.inTransit = append(w.inTransit[:0], w.inTransit[n:]...)
}

// report sends every worker's load report.
func (s *sim) report() {
	maxA, sumA, n := 0, 0, 0
	for _, w := range s.workers {
		if w.state != ready && w.state != draining {
			continue
		}
		n++
		waiting, running := w.sched.Waiting(), w.sched.Running()
		// What a live worker reports (worker.Load): the same census, the same function.
		lr := w.sched.Census().Load(w.pool.Stats())
		lr.Healthy = w.state == ready // a draining worker says so: the router sends nothing new
		lr.StepsOverTarget = uint64(w.stats.OverTarget)
		s.tierLoad(&lr)
		if s.cfg.ReportDelay > 0 {
			s.send(w, delayed{t: s.now + s.cfg.ReportDelay, report: &lr})
		} else {
			s.state.Report(router.WorkerID(w.id), lr, epoch.Add(s.now))
		}
		a := len(waiting) + len(running)
		maxA, sumA = max(maxA, a), sumA+a
	}
	if sumA > 0 {
		s.actSum += float64(maxA) / (float64(sumA) / float64(n))
		s.actN++
	}
}

func (s *sim) result() *Result {
	cfg := s.cfg
	res := &Result{Routing: cfg.Router.Mode, Config: cfg, Events: s.events, RouterQueued: s.queued}
	if res.Routing == "" {
		res.Routing = router.ModeKV
	}
	t0 := s.reqs[0].at
	var end time.Duration
	reqs := make([]bench.RequestResult, len(s.reqs))
	for i, r := range s.reqs {
		q := bench.RequestResult{Session: r.session, Start: r.at - t0, InputLen: r.PromptLen, OutputLen: len(r.times), CachedTokens: r.hits(), Err: r.err}
		if r.err == "" && len(r.times) > 0 {
			q.TTFT = r.first - r.at
			q.E2E = r.times[len(r.times)-1] - r.at
			q.ITL = make([]time.Duration, len(r.times)-1)
			for j := 1; j < len(r.times); j++ {
				q.ITL[j-1] = r.times[j] - r.times[j-1]
			}
			end = max(end, r.times[len(r.times)-1])
			res.PromptTokens += r.PromptLen
			res.CachedTokens += r.hits()
		} else if r.err == "" {
			q.Err = "sim: not finished"
		}
		reqs[i] = q
	}
	if res.PromptTokens > 0 {
		res.HitRate = float64(res.CachedTokens) / float64(res.PromptTokens)
	}
	if s.idealAll > 0 {
		res.IdealHitRate = float64(s.idealHit) / float64(s.idealAll)
	}
	dur := end - t0
	res.Bench = &bench.Result{
		Date: time.Unix(0, 0).UTC(), BaseURL: "sim", Model: "sim", Endpoint: bench.Endpoint("sim"),
		Workload: "trace", Arrival: bench.Trace, TraceSpeedup: 1, RequestRate: math.Inf(1),
		NumPrompts: len(s.reqs), Percentiles: cfg.Percentiles, Requests: reqs,
		Summary: bench.Summarize(reqs, dur, bench.SLO{}, cfg.Percentiles),
	}
	toks := make([]float64, len(s.workers))
	for i, w := range s.workers {
		s.account(w)
		if dur > 0 {
			w.stats.MeanActive = w.activeNs / float64(dur)
		}
		until := end
		if w.state == gone {
			until = min(w.goneAt, end)
		}
		w.stats.Role, w.stats.Alive = w.role, max(0, until-max(w.born, t0))
		res.WorkerSeconds[poolOf(w.role)] += w.stats.Alive.Seconds()
		w.stats.Tiers = TierStats{Onboarded: w.tiers.onboarded, Pulled: w.tiers.pulled}
		res.Workers = append(res.Workers, w.stats)
		toks[i] = float64(w.stats.PrefillTokens + w.stats.DecodeTokens)
	}
	res.TokenImbalance, res.TokenCV = imbalance(toks)
	res.RemotePrefills, res.Transferred = s.remote, s.moved
	if s.plan != nil {
		res.Plan = s.plan
		s.plan.finish(end - t0)
	}
	if s.actN > 0 {
		res.ActiveImbalance = s.actSum / float64(s.actN)
	}
	return res
}

// imbalance returns max/mean and the coefficient of variation (population
// standard deviation over mean) of xs; 0, 0 when the mean is 0.
func imbalance(xs []float64) (maxOverMean, cv float64) {
	sum, hi := 0.0, 0.0
	for _, x := range xs {
		sum += x
		hi = max(hi, x)
	}
	mean := sum / float64(len(xs))
	if mean == 0 {
		return 0, 0
	}
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return hi / mean, math.Sqrt(ss/float64(len(xs))) / mean
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
