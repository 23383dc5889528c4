package router

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"tandem/kvcache"
	"tandem/llm"
)

// Mode is a routing mode, as the --routing flag names it.
type Mode string

// Routing modes. ModeKV is the default; the others are baselines to compare it
// with.
const (
	ModeKV          Mode = "kv"           // cost function over KV overlap and load
	ModeRoundRobin  Mode = "round-robin"  // next available worker in id order
	ModeRandom      Mode = "random"       // uniform over available workers
	ModeLeastLoaded Mode = "least-loaded" // least predicted load, KV overlap ignored
)

// ParseMode returns the mode named s ("" is ModeKV).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeKV, nil
	case ModeKV, ModeRoundRobin, ModeRandom, ModeLeastLoaded:
		return m, nil
	}
	return "", fmt.Errorf("router: unknown routing mode %q (want kv, round-robin, random or least-loaded)", s)
}

// Config holds the policy's knobs. Start from DefaultConfig; docs/routing.md
// explains the defaults.
type Config struct {
	Mode Mode

	// OverlapWeight weighs prefill blocks against decode blocks in the cost
	// cost(w) = OverlapWeight·prefill(w) + decode(w). Higher favours cache
	// hits and time to first token; lower favours even decode load.
	OverlapWeight float64
	// Temperature of the softmax over costs normalised by the prompt's own (a candidate
	// whose cost exceeds the cheapest's by Temperature × OverlapWeight × the prompt's
	// blocks is e times less likely); 0 picks the cheapest worker deterministically.
	Temperature float64
	// HostWeight, DiskWeight and RemoteWeight are the fraction of a block's prefill that
	// a block held in the host, disk or remote (shared directory) tier saves, until the
	// worker reports what loading one costs it (llm.Load.TierLoadMicros against
	// BlockPrefillMicros: then the fraction is 1 − load/prefill); 0 ignores the tier until
	// then. PeerWeight is the same for a block that another worker holds and the chosen
	// worker would pull (PeerPulls), until it reports its pulls' cost (PullMicros).
	HostWeight, DiskWeight, RemoteWeight, PeerWeight float64
	// PeerPulls lets the policy tell the chosen worker to pull the prompt's blocks it
	// lacks from the worker that holds most of them (Decision.Peer), when pulling them is
	// cheaper than computing them and they are at least PeerMinBlocks blocks.
	PeerPulls     bool
	PeerMinBlocks int

	// A worker is busy when its predicted KV usage reaches BusyKVUsage or its
	// predicted waiting requests reach BusyWaiting; 0 disables a check.
	BusyKVUsage float64
	BusyWaiting int

	// AffinityTTL is how long a session stays bound to its worker after its
	// last request; 0 disables session affinity.
	AffinityTTL time.Duration

	// RequireKVEvents keeps requests off stale workers (SetStale: their KV events are
	// missing) instead of counting their overlap as unknown.
	RequireKVEvents bool

	// AdapterLoadCost is what loading a LoRA adapter on a worker costs, in the cost
	// function's blocks: a request under an adapter the router can load
	// (Request.AdapterLoadable) may go to a worker without it at this extra cost, which
	// then loads it (Decision.LoadAdapter); 0 keeps such requests on the workers that
	// serve the adapter.
	AdapterLoadCost float64

	// Card is the model's card. If its BlockSize is 0 the first worker's card
	// is adopted.
	Card Card
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Mode:          ModeKV,
		OverlapWeight: 16,
		Temperature:   0.03,
		HostWeight:    0.5,
		DiskWeight:    0.3,
		RemoteWeight:  0.2,
		PeerWeight:    0.3,
		PeerMinBlocks: 16,
		BusyKVUsage:   0.95,
		BusyWaiting:   16,
		AffinityTTL:   10 * time.Minute,

		AdapterLoadCost: 64,
	}
}

// WeighsPrefill says whether a router of configuration c weighs the prefill work queued
// on each worker when it places a prompt (planner.Config.PrefillRouting): kv routing
// with an overlap weight, and least-loaded.
func (c Config) WeighsPrefill() bool {
	switch c.Mode {
	case ModeLeastLoaded:
		return true
	case ModeKV, "":
		return c.OverlapWeight > 0
	}
	return false
}

func (c Config) validate() error {
	bad := func(v float64) bool { return v < 0 || math.IsNaN(v) || math.IsInf(v, 0) }
	switch {
	case bad(c.OverlapWeight):
		return fmt.Errorf("router: overlap weight %v must be finite and ≥ 0", c.OverlapWeight)
	case bad(c.Temperature):
		return fmt.Errorf("router: temperature %v must be finite and ≥ 0", c.Temperature)
	case bad(c.HostWeight) || c.HostWeight > 1:
		return fmt.Errorf("router: host weight %v must be in [0, 1]", c.HostWeight)
	case bad(c.DiskWeight) || c.DiskWeight > 1 || bad(c.RemoteWeight) || c.RemoteWeight > 1 || bad(c.PeerWeight) || c.PeerWeight > 1:
		return fmt.Errorf("router: disk, remote and peer weights %v, %v, %v must be in [0, 1]", c.DiskWeight, c.RemoteWeight, c.PeerWeight)
	case c.PeerMinBlocks < 0:
		return fmt.Errorf("router: peer min blocks %d must be ≥ 0", c.PeerMinBlocks)
	case bad(c.BusyKVUsage):
		return fmt.Errorf("router: busy KV usage %v must be finite and ≥ 0", c.BusyKVUsage)
	case bad(c.AdapterLoadCost):
		return fmt.Errorf("router: adapter load cost %v must be finite and ≥ 0", c.AdapterLoadCost)
	case c.BusyWaiting < 0:
		return fmt.Errorf("router: busy waiting %d must be ≥ 0", c.BusyWaiting)
	case c.Card.BlockSize < 0:
		return fmt.Errorf("router: card block size %d must be ≥ 0", c.Card.BlockSize)
	case c.AffinityTTL < 0:
		return fmt.Errorf("router: affinity TTL %v must be ≥ 0", c.AffinityTTL)
	}
	_, err := ParseMode(string(c.Mode))
	return err
}

// LoadReport is a worker's load report (llm.Load: one shape from the worker to the policy).
type LoadReport = llm.Load

// WorkerState is one worker as the policy sees it: its card, its last load
// report and the router's own predictions since that report.
//
// A load report counts the requests the worker had received when it made it:
// every dispatch before it arrived, or, when the report is Tracked, the first
// Received dispatches. It restarts the predictions: the deltas below return to
// the sum of what each dispatch adds to the report (State.Report): its load, for a
// dispatch the report does not count, and, for one it counts, less what the report
// still counts of it that the router knows is gone. Whether the report counted a
// request's first token (or its end) is exact when both carry engine steps (the
// report's Step, the event's): the report counts an event of a step at most its own.
// Without steps (an older worker, the simulator), an event the router saw before the
// report arrived is taken as counted and one after as not. Predicted values are the
// report's plus the deltas, clamped at zero. Reports that a worker sends as soon as
// another router's request reaches it are how several routers share their in-flight
// load.
type WorkerState struct {
	// What a decision reads of every candidate comes first, so that it takes the first two
	// cache lines of the struct (the policy visits a thousand workers per decision).
	stamp uint64         // decision whose overlap ov holds
	ov    [numLevels]int // the prompt's runs by tier level (Match's fields)
	// The cost's prefill and decode terms (PrefillBlocks and DecodeBlocks with the model
	// card's block size) and busy's verdict, kept by State.refresh whenever the report or
	// the deltas change rather than computed per decision.
	pre, dec    float64
	isBusy      bool
	lacks       bool // this decision: the worker lacks the request's adapter (AdapterLoadCost)
	prefillRole bool // Card.Role is RolePrefill
	// own: the worker is in this router's share of the workers (SetShare), which its ties
	// go to first; every worker is while the router has no share.
	own     bool
	Healthy bool // from the last report or SetHealthy; true at registration
	// Stale: the worker's KV events are missing (SetStale), so the index's view of its
	// cache cannot be trusted: its overlap counts as unknown (the other candidates' mean),
	// or, with RequireKVEvents, it gets no requests.
	Stale  bool
	credit [numLevels]float64 // fraction of a block's prefill a block of each tier saves
	pull   float64            // … a block pulled from a peer saves
	ix     *workerRec         // the index's record: its block count

	// The grouped decision's bookkeeping (groups.go, State.track): whether the worker is
	// counted healthy, a candidate in State.ord (under key okey), a stale candidate; its
	// index slot as of State.slotEpoch and its position in State.workers.
	counted, inOrd, staleCand bool
	okey                      float64
	nodeHash                  uint64 // orders the workers for the routers' shares (reshare)
	slot                      uint32
	pos                       int32

	ID         WorkerID
	Card       Card
	Report     LoadReport
	ReportedAt time.Time // zero until the first report
	Inflight   int       // router requests dispatched and not yet removed

	gen    uint64 // registration generation, matched by Inflight handles
	sent   uint64 // dispatches numbered so far
	counts uint64 // the report counts dispatches 1…counts
	nrep   uint64 // reports applied: the ordering of events without steps
	// pending are the dispatches whose share of the prediction is not the report's alone,
	// by seq: those the report does not count, and those it counts but whose first token
	// or end the router has seen from a later step (kept until a report covers them).
	pending  []dispatch
	dPrefill int // the pending dispatches' prefill blocks (dispatch.add)
	dDecode  int // … decode blocks
	dWaiting int // … requests before their first token
}

// refresh recomputes w's load terms (pre, dec, isBusy) from its report and deltas: called
// by every method that changes them, so that a decision reads them as the same
// expressions of the same fields would give at the decision.
func (s *State) refresh(w *WorkerState) {
	inv := 1 / float64(s.card.BlockSize)
	w.pre = max(0, float64(w.Report.PrefillTokens)*inv+float64(w.dPrefill))
	w.dec = float64(max(0, w.Report.DecodeBlocks+w.dDecode))
	w.isBusy = w.busy(&s.cfg)
	s.track(w, false)
}

// credits sets w's tier credits from its report's measured costs, or cfg's priors.
func (w *WorkerState) credits(cfg *Config) {
	prior := [numLevels]float64{1, cfg.HostWeight, cfg.DiskWeight, cfg.RemoteWeight}
	pb := float64(w.Report.BlockPrefillMicros)
	w.credit[0] = 1
	for t := 1; t < numLevels; t++ {
		w.credit[t] = prior[t]
		if l := w.Report.TierLoadMicros[t]; l > 0 && pb > 0 {
			w.credit[t] = max(0, 1-float64(l)/pb)
		}
	}
	w.pull = cfg.PeerWeight
	if l := w.Report.PullMicros; l > 0 && pb > 0 {
		w.pull = max(0, 1-float64(l)/pb)
	}
}

// Credits returns the fractions of a block's prefill that a block of each tier level
// saves on the worker (device 1, host, disk, remote), and one pulled from a peer: measured
// from its reports, or the configured priors.
func (w *WorkerState) Credits() (tiers [numLevels]float64, pull float64) { return w.credit, w.pull }

// dispatch is the router's record of a request sent to a worker, while it adds to the
// worker's last report (WorkerState.pending).
type dispatch struct {
	seq             uint64
	prefill, decode int
	// first and ended: the router has seen the request's first token, its end. Their
	// steps (0: none sent) and the reports applied before them (WorkerState.nrep) say
	// which reports count them.
	first, ended       bool
	firstStep, endStep uint64
	firstAt, endAt     uint64
}

// covers reports whether w's report counts an event of step step that the router saw
// after at reports. With both steps, the report counts it when it was made after the step;
// without, when it arrived after the event.
func (w *WorkerState) covers(step, at uint64) bool {
	if step != 0 && w.Report.Step != 0 {
		return step <= w.Report.Step
	}
	return at < w.nrep
}

// settled reports whether every later report counts an event of step step seen by now.
// Before the first report, one with steps may yet come from before the event.
func (w *WorkerState) settled(step uint64) bool {
	switch {
	case step == 0:
		return true
	case w.Report.Step != 0:
		return step <= w.Report.Step
	}
	return w.nrep > 0 // the worker's reports have no steps: they count by arrival
}

// counting says how w's report counts d: whether it counts d's first token and its end
// (of the ones the router has seen), and whether it counts d at all. A report that counts
// a first token or an end by their steps counts the dispatch, even when it was made
// before the worker recorded its number (Received).
func (w *WorkerState) counting(d *dispatch) (firstIn, endIn, counted bool) {
	firstIn = d.first && w.covers(d.firstStep, d.firstAt)
	endIn = d.ended && w.covers(d.endStep, d.endAt) && (!d.first || firstIn) // an end comes after its first token
	stepped := w.Report.Step != 0
	counted = d.seq <= w.counts || stepped && (firstIn && d.firstStep != 0 || endIn && d.endStep != 0)
	return firstIn, endIn, counted
}

// add returns what d adds to w's report, in waiting requests, prefill blocks and decode
// blocks. A dispatch the report does not count adds its load: waiting and prefill until
// its first token, decode until its end. One it counts adds nothing the report has right:
// it takes off the waiting request and the prefill the report counts when the router has
// seen its first token or end from after the report, and the decode blocks when it has
// seen its end from after the report.
func (w *WorkerState) add(d *dispatch) (waiting, prefill, decode int, counted bool) {
	firstIn, endIn, counted := w.counting(d)
	if !counted {
		if !d.first && !d.ended {
			waiting, prefill = 1, d.prefill
		}
		if !d.ended {
			decode = d.decode
		}
		return
	}
	if (d.first || d.ended) && !firstIn && !endIn {
		waiting, prefill = -1, -d.prefill
	}
	if d.ended && !endIn {
		decode = -d.decode
	}
	return
}

// done reports whether d, adding waiting, prefill and decode now (counted: the report
// counts it), adds nothing under any later report either, and so needs no record: the
// report counts it (or it has ended) and every later report counts what the router has
// seen of it.
func (w *WorkerState) done(d *dispatch, waiting, prefill, decode int, counted bool) bool {
	if waiting != 0 || prefill != 0 || decode != 0 || !counted && !d.ended {
		return false // what it adds, or will add to a report that does not count it
	}
	return (!d.first || w.settled(d.firstStep)) && (!d.ended || w.settled(d.endStep))
}

// PrefillBlocks is the predicted prefill work queued on the worker, in blocks.
func (w *WorkerState) PrefillBlocks() float64 {
	b := 0.0
	if w.Card.BlockSize > 0 {
		b = float64(w.Report.PrefillTokens) / float64(w.Card.BlockSize)
	}
	return max(0, b+float64(w.dPrefill))
}

// DecodeBlocks is the predicted number of KV blocks held by decoding requests.
func (w *WorkerState) DecodeBlocks() float64 {
	return float64(max(0, w.Report.DecodeBlocks+w.dDecode))
}

// Waiting is the predicted number of requests not yet past their prefill:
// the report's waiting ones plus the router's dispatches since.
func (w *WorkerState) Waiting() int { return max(0, w.Report.Waiting+w.dWaiting) }

// KVUsage is the predicted fraction of KV blocks in use.
func (w *WorkerState) KVUsage() float64 {
	capacity := w.Report.KVBlocks
	if capacity <= 0 {
		capacity = w.Card.KVBlocks
	}
	u := w.Report.KVUsage
	if capacity > 0 {
		u += float64(w.dDecode) / float64(capacity)
	}
	return max(0, u)
}

// Load is the predicted work on the worker, in blocks: prefill plus decode.
// Least-loaded routing and cost ties use it.
func (w *WorkerState) Load() float64 { return w.PrefillBlocks() + w.DecodeBlocks() }

func (w *WorkerState) busy(c *Config) bool {
	return (c.BusyKVUsage > 0 && w.KVUsage() >= c.BusyKVUsage) ||
		(c.BusyWaiting > 0 && w.Waiting() >= c.BusyWaiting)
}

// Errors of State's methods and of Decide.
var (
	// ErrNoWorkers: no registered worker is healthy (answer 503).
	ErrNoWorkers = fmt.Errorf("router: no healthy worker: %w", llm.ErrUnavailable)
	// ErrAllBusy: every healthy worker is busy; the caller queues the
	// request with a timeout, then answers 429 (or 503) with Retry-After.
	ErrAllBusy = fmt.Errorf("router: every healthy worker is busy: %w", llm.ErrQueueFull)
	// ErrNoAdapter: healthy workers are there, but none serves the request's LoRA adapter
	// (answer 400).
	ErrNoAdapter = fmt.Errorf("router: no healthy worker serves the LoRA adapter: %w", llm.ErrInvalid)
	// ErrUnknownWorker: the worker is not registered.
	ErrUnknownWorker = errors.New("router: unknown worker")
)

// Inflight is the router's record of one dispatched request, returned in a
// Decision. Keep it with the request: pass it to PrefillDone at the first token
// and to RemoveInflight when the request ends, however it ends.
type Inflight struct {
	Worker       WorkerID
	PromptBlocks int // blocks of the prompt, the last one possibly partial
	CachedBlocks int // of those, cached on the worker
	Prefilled    bool

	gen uint64
	seq uint64 // the worker's dispatch number: 1, 2, … per registration
	// The step of the first token and the reports applied before it (dispatch's fields):
	// the record of a dispatch whose record was dropped is rebuilt from them.
	firstStep, firstAt uint64
}

// Seq is the dispatch's number at its worker (1, 2, …), which load reports refer to.
func (in Inflight) Seq() uint64 { return in.seq }

type session struct {
	worker  WorkerID
	gen     uint64
	expires time.Time
}

// State is the router's world: the workers, their load, the KV index, the
// session bindings and the policy's configuration. Decide reads it and records
// its decisions in it. A State is not safe for concurrent use: the live router
// holds a lock around each call, the simulator and the tests own theirs.
type State struct {
	cfg     Config
	card    Card
	rng     *rand.Rand
	tieSeed uint64 // drawn from rng: each router breaks ties its own way
	// This router's share of the workers among shares routers (SetShare): 0 of 0 when it
	// has none.
	share, shares int
	index         *Index
	walk          Walk
	stamp         runStamp       // walk's, during a decision
	workers       []*WorkerState // sorted by ID
	byID          map[WorkerID]*WorkerState
	dense         []*WorkerState // byID for ids below denseIDs: no map lookup per match
	gen           uint64
	sessions      map[string]session
	sweepAt       int

	rrLast  WorkerID
	rrValid bool

	seq        uint64 // decisions made
	prefillers int    // registered workers of role prefill: most models have none

	cands        []*WorkerState
	matches      []Match
	weights      []float64
	peer1, peer2 peerRun // the decision's two longest runs a peer pull could take

	// The grouped decision (groups.go): the candidates by load key, as bitmaps by index
	// slot and by position in workers; counts of healthy workers, of stale candidates and
	// of candidates without a slot; the index's slot epoch the slots were read at.
	ord                   []ordEntry
	eligSlots, eligPos    []uint64
	nHealthy, nStaleCands int
	nSlotless             int
	slotEpoch             uint64
	slotsSynced           bool
	groupFrom             int    // workers from which Decide decides by groups
	byGroups              uint64 // decisions taken by groups (tests)
	sp                    []special
	grp                   []costGroup
	group0                int // index in grp of the workers without the first block, -1: none
	nbits                 int // grp's groups with a bitmap: grp[:nbits]
	pickBits              []uint64
	wtPos                 []float64
	// By index slot (as of slotEpoch): the workers and their load terms, so that a decision
	// costs the walk's workers without reading each one's state.
	slotW            []*WorkerState
	slotPre, slotDec []float64
	slotPos          []int32
	// drawGrouped's: the candidates without load, by slot; its classes of idle candidates by
	// position.
	idleSlots  []uint64
	cls0, cls1 []uint64
	// The workers of the router's share (SetShare), by slot and by position.
	ownSlots, ownPos []uint64
	shareOrder       []*WorkerState // reshare's scratch
}

// NewState returns an empty State with configuration cfg. rng drives the
// random mode, softmax sampling and the seed of tie-breaking; nil means a fixed seed,
// so runs repeat. Routers that share workers should each have their own seed.
func NewState(cfg Config, rng *rand.Rand) (*State, error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeKV
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if rng == nil {
		rng = rand.New(rand.NewPCG(1, 2))
	}
	return &State{
		cfg:       cfg,
		card:      cfg.Card,
		rng:       rng,
		tieSeed:   rng.Uint64(),
		index:     NewIndex(),
		byID:      make(map[WorkerID]*WorkerState),
		sessions:  make(map[string]session),
		sweepAt:   1024,
		groupFrom: groupFrom,
	}, nil
}

// Config returns the configuration.
func (s *State) Config() Config { return s.cfg }

// Card returns the model's card, and false until one is known.
func (s *State) Card() (Card, bool) { return s.card, s.card.BlockSize > 0 }

// Index returns the KV index. Feed it through ApplyEvent and ResetWorker,
// which check that the worker is registered.
func (s *State) Index() *Index { return s.index }

// AddWorker registers worker id with its card, healthy and idle, after
// CheckCard against the model's card (the first worker's card becomes the
// model's card if none was configured). Registering an id again replaces the
// worker: its index entries, load and in-flight records are dropped.
func (s *State) AddWorker(id WorkerID, card Card) error {
	if s.card.BlockSize == 0 {
		if err := CheckCard(card, card); err != nil {
			return err
		}
		s.card = card
	} else if err := CheckCard(s.card, card); err != nil {
		return err
	}
	s.RemoveWorker(id)
	s.gen++
	w := &WorkerState{ID: id, Card: card, Healthy: true, gen: s.gen, ix: s.index.rec(id), prefillRole: card.Role == RolePrefill, slot: noSlot}
	w.nodeHash = nodeHash(card.Node)
	w.credits(&s.cfg)
	s.slotsSynced = false
	s.refresh(w)
	if card.KVBlocks > 0 {
		s.index.Reserve(card.KVBlocks)
	}
	i, _ := slices.BinarySearchFunc(s.workers, id, func(w *WorkerState, id WorkerID) int { return cmpID(w.ID, id) })
	s.workers = slices.Insert(s.workers, i, w)
	s.reshare()
	s.renumber()
	s.byID[id] = w
	if id < denseIDs {
		for int(id) >= len(s.dense) {
			s.dense = append(s.dense, nil)
		}
		s.dense[id] = w
	}
	if card.Role == RolePrefill {
		s.prefillers++
	}
	return nil
}

// SetShare makes this router the share-th of shares routers that front the same workers
// (0 ≤ share < shares; shares ≤ 1: the only one). The workers are dealt out to the shares
// in the order of a hash of their node names (the same in every router that knows the same
// workers), every shares-th to each, so the shares differ by at most one worker. Where
// workers tie, a router picks from its own share first, so that routers deciding a burst at
// the same instant, which see nothing of each other's decisions, spread it over different
// workers (docs/routing.md, "Several routers").
func (s *State) SetShare(share, shares int) error {
	if shares <= 1 {
		share, shares = 0, 0
	} else if share < 0 || share >= shares {
		return fmt.Errorf("router: share %d of %d routers (want 0 ≤ share < routers)", share, shares)
	}
	s.share, s.shares = share, shares
	s.reshare()
	s.renumber()
	s.slotsSynced = false
	return nil
}

// Share returns this router's share and the number of shares (0 of 0: none).
func (s *State) Share() (share, shares int) { return s.share, s.shares }

// reshare deals the workers out to the shares again (SetShare); called when they change.
// The caller renumbers and resynchronises the slots after it, which rebuild the share's
// bitmaps.
func (s *State) reshare() {
	if s.shares <= 1 {
		for _, w := range s.workers {
			w.own = true
		}
		return
	}
	order := s.shareOrder[:0]
	order = append(order, s.workers...)
	slices.SortFunc(order, func(a, b *WorkerState) int {
		if c := cmp.Compare(a.nodeHash, b.nodeHash); c != 0 {
			return c
		}
		return strings.Compare(a.Card.Node, b.Card.Node)
	})
	for i, w := range order {
		w.own = i%s.shares == s.share
	}
	clear(order)
	s.shareOrder = order[:0]
}

// nodeHash orders workers for the shares: FNV-1a of the node name, finalised, so that the
// deal does not follow the names' order.
func nodeHash(node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	return finalize(h.Sum64())
}

// RemoveWorker forgets worker id: its index entries, load and session
// bindings (lazily: a session bound to it rebinds on its next request).
func (s *State) RemoveWorker(id WorkerID) {
	s.index.RemoveWorker(id)
	w := s.lookup(id)
	if w == nil {
		return
	}
	if w.Card.Role == RolePrefill {
		s.prefillers--
	}
	s.track(w, true)
	s.slotsSynced = false
	delete(s.byID, id)
	if id < denseIDs {
		s.dense[id] = nil
	}
	s.workers = slices.DeleteFunc(s.workers, func(w *WorkerState) bool { return w.ID == id })
	s.reshare()
	s.renumber()
}

// denseIDs bounds the worker ids kept in State.dense (a slice indexed by id): the live
// registry numbers workers 1, 2, … and the simulator 0, 1, …; larger ids use the map.
const denseIDs = 1 << 20

// lookup returns worker id's state, nil if it is not registered.
func (s *State) lookup(id WorkerID) *WorkerState {
	if int(id) < len(s.dense) {
		return s.dense[id]
	}
	return s.byID[id]
}

// Workers returns the registered workers' ids in order.
func (s *State) Workers() []WorkerID {
	ids := make([]WorkerID, len(s.workers))
	for i, w := range s.workers {
		ids[i] = w.ID
	}
	return ids
}

// Worker returns a copy of worker id's state.
func (s *State) Worker(id WorkerID) (WorkerState, bool) {
	w := s.lookup(id)
	if w == nil {
		return WorkerState{}, false
	}
	return *w, true
}

// Report records worker id's load report received at now and restarts the
// predictions from it (see WorkerState). Its Healthy field sets the worker's
// health.
func (s *State) Report(id WorkerID, r LoadReport, now time.Time) error {
	w := s.lookup(id)
	if w == nil {
		return fmt.Errorf("%w %d", ErrUnknownWorker, id)
	}
	w.Report, w.ReportedAt, w.Healthy = r, now, r.Healthy
	w.nrep++
	w.counts = w.sent // without Tracked, every dispatch so far
	if r.Tracked {
		w.counts = r.Received
	}
	w.dPrefill, w.dDecode, w.dWaiting = 0, 0, 0
	w.credits(&s.cfg)
	keep := w.pending[:0]
	for _, d := range w.pending {
		waiting, prefill, decode, counted := w.add(&d)
		w.dWaiting += waiting
		w.dPrefill += prefill
		w.dDecode += decode
		if !w.done(&d, waiting, prefill, decode, counted) {
			keep = append(keep, d)
		}
	}
	clear(w.pending[len(keep):])
	w.pending = keep
	s.refresh(w)
	return nil
}

// SetHealthy marks worker id healthy or not (for example when its heartbeats
// stop) until the next load report.
func (s *State) SetHealthy(id WorkerID, healthy bool) error {
	w := s.lookup(id)
	if w == nil {
		return fmt.Errorf("%w %d", ErrUnknownWorker, id)
	}
	w.Healthy = healthy
	s.track(w, false)
	return nil
}

// SetStale marks worker id's index entries as untrustworthy or trustworthy again; see
// WorkerState.Stale.
func (s *State) SetStale(id WorkerID, stale bool) error {
	w := s.lookup(id)
	if w == nil {
		return fmt.Errorf("%w %d", ErrUnknownWorker, id)
	}
	w.Stale = stale
	s.track(w, false)
	return nil
}

// Busy reports whether worker id is over a busy threshold (predicted KV usage
// or waiting requests). Unknown workers are not busy.
func (s *State) Busy(id WorkerID) bool {
	w := s.lookup(id)
	return w != nil && w.isBusy
}

// ApplyEvent applies a KV event of worker id to the index; see Index.Apply.
func (s *State) ApplyEvent(id WorkerID, ev kvcache.Event) (gap bool, err error) {
	if s.lookup(id) == nil {
		return false, fmt.Errorf("%w %d", ErrUnknownWorker, id)
	}
	return s.index.Apply(id, ev), nil
}

// ResetWorker replaces worker id's index entries by a snapshot; see
// Index.Reset.
func (s *State) ResetWorker(id WorkerID, snap kvcache.Snapshot) error {
	if s.lookup(id) == nil {
		return fmt.Errorf("%w %d", ErrUnknownWorker, id)
	}
	s.index.Reset(id, snap)
	return nil
}

// AddInflight records a request dispatched to worker id outside Decide (Decide
// records its own): promptBlocks blocks of prompt of which cachedBlocks are
// cached there. It raises the worker's predicted prefill blocks by the
// uncached blocks, its decode blocks by the prompt's and its waiting requests
// by one, until PrefillDone, RemoveInflight or the next load report.
func (s *State) AddInflight(id WorkerID, promptBlocks, cachedBlocks int) Inflight {
	cachedBlocks = min(max(cachedBlocks, 0), max(promptBlocks, 0))
	in := Inflight{Worker: id, PromptBlocks: max(promptBlocks, 0), CachedBlocks: cachedBlocks}
	w := s.lookup(id)
	if w == nil {
		return in
	}
	in.gen = w.gen
	w.sent++
	in.seq = w.sent
	w.pending = append(w.pending, dispatch{seq: in.seq, prefill: in.PromptBlocks - in.CachedBlocks, decode: in.PromptBlocks})
	w.dPrefill += in.PromptBlocks - in.CachedBlocks
	w.dDecode += in.PromptBlocks
	w.dWaiting++
	w.Inflight++
	s.refresh(w)
	return in
}

// PrefillDone records that the request's first token arrived: its prefill is
// no longer pending. It is idempotent. PrefillDoneAt is PrefillDone for a first token
// that carries the engine step that produced it (llm.Event.Step).
func (s *State) PrefillDone(in *Inflight) { s.PrefillDoneAt(in, 0) }

// PrefillDoneAt is PrefillDone for a first token of engine step step (0: none sent):
// a load report of that step or a later one already counts the request past it.
func (s *State) PrefillDoneAt(in *Inflight, step uint64) {
	if in.Prefilled {
		return
	}
	w := s.live(*in)
	if w == nil {
		in.Prefilled = true
		return
	}
	s.event(w, in, false, step)
	in.Prefilled, in.firstStep, in.firstAt = true, step, w.nrep
}

// RemoveInflight records that the request ended (finished, failed, cancelled
// or never dispatched). Call it once per Inflight; records of a worker that
// has since left or re-registered are ignored.
func (s *State) RemoveInflight(in Inflight) { s.RemoveInflightAt(in, 0) }

// RemoveInflightAt is RemoveInflight for an end that carries the engine step that
// produced it (the last event's llm.Event.Step; 0: none sent, as when the router itself
// cancels the request): a load report of that step or a later one no longer counts it.
func (s *State) RemoveInflightAt(in Inflight, step uint64) {
	w := s.live(in)
	if w == nil {
		return
	}
	w.Inflight--
	s.event(w, &in, true, step)
}

// event records in's first token (or its end) of step step in w's record of it, rebuilt
// if it was dropped (WorkerState.done: it then added nothing to the report, and in has what
// the router has seen of it), and moves the deltas by the change in what it adds to the
// report. A record done after the event is dropped (or not rebuilt).
func (s *State) event(w *WorkerState, in *Inflight, end bool, step uint64) {
	i, found := slices.BinarySearchFunc(w.pending, in.seq, cmpSeq)
	d := dispatch{seq: in.seq, prefill: in.PromptBlocks - in.CachedBlocks, decode: in.PromptBlocks,
		first: in.Prefilled, firstStep: in.firstStep, firstAt: in.firstAt}
	if found {
		d = w.pending[i]
	}
	waiting, prefill, decode, _ := w.add(&d)
	w.dWaiting -= waiting
	w.dPrefill -= prefill
	w.dDecode -= decode
	if end {
		d.ended, d.endStep, d.endAt = true, step, w.nrep
	} else {
		d.first, d.firstStep, d.firstAt = true, step, w.nrep
	}
	waiting, prefill, decode, counted := w.add(&d)
	w.dWaiting += waiting
	w.dPrefill += prefill
	w.dDecode += decode
	switch done := w.done(&d, waiting, prefill, decode, counted); {
	case found && done:
		w.pending = slices.Delete(w.pending, i, i+1)
	case found:
		w.pending[i] = d
	case !done:
		w.pending = slices.Insert(w.pending, i, d)
	}
	s.refresh(w)
}

func cmpSeq(d dispatch, seq uint64) int {
	switch {
	case d.seq < seq:
		return -1
	case d.seq > seq:
		return 1
	}
	return 0
}

func (s *State) live(in Inflight) *WorkerState {
	w := s.lookup(in.Worker)
	if w == nil || w.gen != in.gen {
		return nil
	}
	return w
}

// Sessions returns the number of session bindings kept.
func (s *State) Sessions() int { return len(s.sessions) }

// Sweep drops the session bindings expired at now and returns how many. Decide
// sweeps by itself when the table doubles; a caller may sweep on a timer.
func (s *State) Sweep(now time.Time) int {
	n := 0
	for k, b := range s.sessions {
		if !now.Before(b.expires) {
			delete(s.sessions, k)
			n++
		}
	}
	s.sweepAt = max(1024, 2*len(s.sessions))
	return n
}

func cmpID(a, b WorkerID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
