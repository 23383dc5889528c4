package router

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"tandem/kvcache"
	"tandem/llm"
)

// A Request is what the policy needs to know of a request.
type Request struct {
	// Hashes are the sequence hashes of the prompt's full blocks,
	// kvcache.HashBlocks with the model card's salt and block size.
	Hashes []uint64
	// PromptTokens is the prompt's length in tokens (0: len(Hashes) full
	// blocks).
	PromptTokens int
	// SessionID binds the request to its session's worker ("" for none): the
	// X-Session-Id header, or the OpenAI user field.
	SessionID string
	// Now is the time of the decision, for session expiry.
	Now time.Time
	// Pool restricts the decision to the workers of some roles (disagg.go); PoolAny, the
	// zero value, considers every worker.
	Pool Pool
	// Key names the request for breaking ties between equally good workers (see
	// State.Decide); 0 derives one from Hashes and PromptTokens.
	Key uint64
	// Adapter, if set, is the LoRA adapter the request runs under: only workers whose
	// reports list it are considered (and Hashes are salted with it: State.AdapterSalt),
	// unless AdapterLoadable says the caller can load it on another, which then costs
	// Config.AdapterLoadCost more.
	Adapter         string
	AdapterLoadable bool
	// KVFormat, if set, admits only workers whose card names no KV format or this one: a
	// prefill decision for a decode worker, whose pull of blocks in another format would be
	// refused (DecideDisagg).
	KVFormat string
}

// Cost is the breakdown of cost(w) = OverlapWeight·Prefill + Decode, in
// blocks.
type Cost struct {
	Prefill float64 // uncached prompt blocks plus the worker's pending prefill
	Decode  float64 // the worker's predicted decode blocks
	Total   float64
}

// Reasons a Decision gives.
const (
	ReasonKV          = "kv"                    // cheapest (or sampled) by the cost function
	ReasonAffinity    = "affinity"              // the session's worker
	ReasonRoundRobin  = "round-robin"           // next in turn
	ReasonRandom      = "random"                // drawn uniformly
	ReasonLeastLoaded = "least-loaded"          // least predicted load
	ReasonOnlyWorker  = "only available worker" // a single healthy worker that is not busy
)

// A Decision is where a request goes, and why.
type Decision struct {
	Worker       WorkerID
	Reason       string
	PromptBlocks int // blocks of the prompt, the last one possibly partial
	Overlap      int // leading prompt blocks cached on the worker's device tier
	HostOverlap  int // leading prompt blocks cached on its device or host tier (≥ Overlap)
	// Runs are the leading prompt blocks the worker holds in the tiers up to each level
	// (device, host, disk, remote: Match's fields); Runs[0] is Overlap, Runs[1] HostOverlap.
	Runs [numLevels]int
	// Peer, when PeerBlocks > 0, is the worker to pull the prompt's first PeerBlocks
	// blocks from (those the chosen worker lacks): PeerPulls found pulling them cheaper
	// than computing them.
	Peer       WorkerID
	PeerBlocks int
	Cost       Cost // the worker's cost, whatever the mode
	Candidates int  // workers that were healthy and not busy
	// Inflight is the record Decide added to the worker's predicted load; see
	// State.PrefillDone and State.RemoveInflight.
	Inflight Inflight
	// LoadAdapter says the worker lacks the request's adapter: the caller loads it there
	// first (Request.AdapterLoadable).
	LoadAdapter bool
}

// Decide routes req with s's policy; it is s.Decide.
func Decide(s *State, req Request) (Decision, error) { return s.Decide(req) }

// Decide picks a worker for req, among the healthy workers that are not busy:
// the session's worker if it is one of them, else by the configured mode
// (binding the session to the result). It records the request as in flight on
// the chosen worker (Decision.Inflight), so the next decision sees its load
// before any load report. It returns ErrNoWorkers when no worker is healthy
// and ErrAllBusy when every healthy one is busy.
func (s *State) Decide(req Request) (Decision, error) {
	s.seq++
	if len(s.workers) == 0 {
		return Decision{}, ErrNoWorkers
	}
	bs := s.card.BlockSize
	tokens := req.PromptTokens
	if tokens <= 0 {
		tokens = len(req.Hashes) * bs
	}
	promptBlocks := (tokens + bs - 1) / bs
	blocksF := float64(tokens) / float64(bs)
	key := s.tieKey(req)
	var (
		pick   *WorkerState
		reason string
		cands  int
		err    error
		done   bool
	)
	if s.groupable(req) {
		pick, reason, cands, err, done = s.pickGrouped(req, blocksF, key)
	}
	if !done {
		pick, reason, cands, err = s.pickAll(req, blocksF, key)
	}
	if err != nil {
		return Decision{}, err
	}
	if req.SessionID != "" && s.cfg.AffinityTTL > 0 {
		if len(s.sessions) >= s.sweepAt {
			s.Sweep(req.Now)
		}
		s.sessions[req.SessionID] = session{worker: pick.ID, gen: pick.gen, expires: req.Now.Add(s.cfg.AffinityTTL)}
	}

	runs := s.overlap(pick)
	d := Decision{
		Worker:       pick.ID,
		Reason:       reason,
		PromptBlocks: promptBlocks,
		Overlap:      runs[0],
		HostOverlap:  runs[1],
		Runs:         runs,
		Cost:         s.cost(pick, blocksF),
		Candidates:   cands,
	}
	cached := runs[numLevels-1]
	if p, n := s.pullFor(pick); n > 0 {
		d.Peer, d.PeerBlocks, cached = p, n, n
	}
	d.Inflight = s.AddInflight(pick.ID, promptBlocks, cached)
	d.LoadAdapter = pick.lacks
	return d, nil
}

// affinity returns the worker req's session is bound to, if the binding holds and the
// worker can take req; nil otherwise.
func (s *State) affinity(req Request) *WorkerState {
	if req.SessionID == "" || s.cfg.AffinityTTL <= 0 {
		return nil
	}
	b, ok := s.sessions[req.SessionID]
	if !ok || !req.Now.Before(b.expires) {
		return nil
	}
	if w := s.lookup(b.worker); w != nil && w.gen == b.gen && w.Healthy && !w.isBusy && req.Pool.admits(w.Card.Role) && w.serves(req.Adapter) && req.admitsFormat(w) {
		return w
	}
	return nil
}

// pickAll is the decision that visits every worker: the candidates' pass over all of
// them, every candidate costed. Decide takes it for the modes other than kv, for
// adapters, KV formats, pools of roles, peer pulls and stale workers, and for small pools
// (pickGrouped is the rest).
func (s *State) pickAll(req Request, blocksF float64, key uint64) (*WorkerState, string, int, error) {
	if !s.cfg.PeerPulls {
		// The walk stamps the workers' runs itself; peer pulls need every Match (below).
		s.stamp = runStamp{dense: s.dense, seq: s.seq}
		s.walk.stamp = &s.stamp
	}
	s.matches = s.index.OverlapWith(&s.walk, req.Hashes, s.matches)
	s.walk.stamp = nil
	s.peer1, s.peer2 = peerRun{}, peerRun{}
	for _, m := range s.matches {
		if w := s.lookup(m.Worker); w != nil {
			w.stamp, w.ov = s.seq, [numLevels]int{m.Device, m.Host, m.Disk, m.Remote}
			if s.cfg.PeerPulls && w.Healthy && !w.Stale {
				s.offerPeer(w, m.Disk) // what a peer can send: its device, host and disk
			}
		}
	}

	// One pass over the workers finds the candidates and, in kv mode, costs them as it
	// goes (the argmin's tie, or the softmax's costs and their range): the same costs in
	// the same order as kv computes them. A stale candidate's overlap is the others' mean,
	// known only after the pass: then kv costs them all again.
	costed := s.cfg.Mode == ModeKV
	var t tie
	ws := s.weights[:0]
	lo, hi := math.Inf(1), math.Inf(-1)
	cands := s.cands[:0]
	healthy, stale := 0, 0
	lacking := 0 // healthy workers without the request's adapter
	for _, w := range s.workers {
		if !w.Healthy || !req.Pool.admitsWorker(w) || w.Stale && s.cfg.RequireKVEvents || !req.admitsFormat(w) {
			continue
		}
		w.lacks = !w.serves(req.Adapter)
		if w.lacks && (!req.AdapterLoadable || s.cfg.AdapterLoadCost <= 0) {
			lacking++
			continue
		}
		healthy++
		if w.isBusy {
			continue
		}
		cands = append(cands, w)
		if w.Stale {
			stale++
		}
		if costed {
			c, l := s.fastCost(w, blocksF)
			if s.cfg.Temperature == 0 {
				t.offerLoad(s, w, c, l, key)
			} else {
				// Plain comparisons, not min and max, whose NaN and signed-zero cases cost
				// branches: costs are finite and ≥ 0, and a -0 against a +0 bound changes
				// neither the range nor any weight.
				ws = append(ws, c)
				if c < lo {
					lo = c
				}
				if c > hi {
					hi = c
				}
			}
		}
	}
	s.cands, s.weights = cands, ws
	if healthy == 0 && lacking > 0 {
		return nil, "", 0, fmt.Errorf("%w: %q", ErrNoAdapter, req.Adapter)
	}
	if healthy == 0 {
		return nil, "", 0, ErrNoWorkers
	}
	if len(cands) == 0 {
		return nil, "", 0, ErrAllBusy
	}
	if stale > 0 {
		s.unknownOverlap(cands)
		costed = false
	}

	if w := s.affinity(req); w != nil {
		return w, ReasonAffinity, len(cands), nil
	}
	var pick *WorkerState
	var reason string
	switch {
	case len(cands) == 1:
		pick, reason = cands[0], ReasonOnlyWorker
	case s.cfg.Mode == ModeRoundRobin:
		pick, reason = s.roundRobin(cands), ReasonRoundRobin
	case s.cfg.Mode == ModeRandom:
		pick, reason = cands[s.rng.IntN(len(cands))], ReasonRandom
	case s.cfg.Mode == ModeLeastLoaded:
		pick, reason = s.leastLoaded(cands, key), ReasonLeastLoaded
	case costed && s.cfg.Temperature == 0:
		pick, reason = t.best, ReasonKV
	case costed:
		pick, reason = s.draw(cands, ws, lo, s.span(lo, hi, blocksF)), ReasonKV
	default:
		pick, reason = s.kv(cands, blocksF, key), ReasonKV
	}
	if s.cfg.Mode == ModeRoundRobin {
		s.rrLast, s.rrValid = pick.ID, true
	}
	return pick, reason, len(cands), nil
}

// peerRun is a worker whose blocks a peer pull could take, and its run.
type peerRun struct {
	w   *WorkerState
	run int
}

// offerPeer keeps the two workers with the longest runs of the current decision's prompt.
func (s *State) offerPeer(w *WorkerState, run int) {
	switch {
	case run > s.peer1.run:
		s.peer2, s.peer1 = s.peer1, peerRun{w, run}
	case run > s.peer2.run:
		s.peer2 = peerRun{w, run}
	}
}

// pullFor returns the peer that w would pull the prompt's leading blocks from, and the
// run it would have then, when PeerPulls is on, the peer holds at least PeerMinBlocks
// blocks more than w does in any tier, and a pull saves something (w's pull credit).
func (s *State) pullFor(w *WorkerState) (WorkerID, int) {
	if !s.cfg.PeerPulls || w.pull <= 0 {
		return 0, 0
	}
	p := s.peer1
	if p.w == w {
		p = s.peer2
	}
	own := 0
	if w.stamp == s.seq {
		own = w.ov[numLevels-1]
	}
	if p.w == nil || p.run-own < max(s.cfg.PeerMinBlocks, 1) {
		return 0, 0
	}
	return p.w.ID, p.run
}

// serves reports whether w serves the LoRA adapter (the base model: "").
func (w *WorkerState) serves(adapter string) bool {
	if adapter == "" {
		return true
	}
	_, ok := w.Report.Adapter(adapter)
	return ok
}

// AdapterSalt returns the block hash salt of the adapter's sequences as the workers that
// serve it hash them (kvcache.Salt of the model and NAME@ID, docs/block-hashing.md), from
// the first one's report that lists it; false when none does.
func (s *State) AdapterSalt(adapter string) (uint64, bool) {
	for _, w := range s.workers {
		if id, ok := w.Report.Adapter(adapter); ok {
			return kvcache.Salt(s.card.Model, "", adapter+"@"+id), true
		}
	}
	return 0, false
}

// NoteAdapter records that worker id serves the LoRA adapter name of content ID id (it
// answered a load) until its next load report says otherwise.
func (s *State) NoteAdapter(worker WorkerID, name, id string) {
	w := s.lookup(worker)
	if w == nil || w.serves(name) {
		return
	}
	if w.Report.Adapters != "" {
		w.Report.Adapters += " "
	}
	w.Report.Adapters += name + "@" + id
}

// Adapters lists the LoRA adapters the workers serve, each once, with the ID the first
// report listing it gave.
func (s *State) Adapters() []llm.AdapterInfo {
	var out []llm.AdapterInfo
	seen := map[string]bool{}
	for _, w := range s.workers {
		rest := w.Report.Adapters
		for rest != "" {
			var one string
			one, rest, _ = strings.Cut(rest, " ")
			name, id, _ := strings.Cut(one, "@")
			if name != "" && !seen[name] {
				seen[name] = true
				out = append(out, llm.AdapterInfo{Name: name, ID: id, Resident: true})
			}
		}
	}
	slices.SortFunc(out, func(a, b llm.AdapterInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// unknownOverlap gives the stale candidates, whose index entries cannot be trusted, the
// mean overlap of the others: unknown, neither a cache hit to chase nor a miss to avoid.
func (s *State) unknownOverlap(cands []*WorkerState) {
	n := 0
	var sum [numLevels]int
	for _, w := range cands {
		if w.Stale {
			continue
		}
		n++
		if w.stamp == s.seq {
			for t := range sum {
				sum[t] += w.ov[t]
			}
		}
	}
	if n > 0 {
		for t := range sum {
			sum[t] /= n
		}
	}
	for _, w := range cands {
		if w.Stale {
			w.stamp, w.ov = s.seq, sum
		}
	}
}

// overlap returns w's runs of the prompt of the current decision, by tier level.
func (s *State) overlap(w *WorkerState) [numLevels]int {
	if w.stamp != s.seq {
		return [numLevels]int{}
	}
	return w.ov
}

// cached is the prompt blocks w need not compute, in blocks of prefill: each block of
// its runs weighs what loading it from its tier saves, and with PeerPulls a block a peer
// holds beyond them what pulling it saves.
func (s *State) cached(w *WorkerState) float64 {
	var c float64
	own := 0
	switch {
	case w.stamp != s.seq:
	case w.ov[0] == w.ov[numLevels-1]:
		// A run on the device alone (the common case): the loop's other terms are credits
		// times zero and the device's credit is 1 (credits), so this is its sum exactly,
		// read from the struct's first cache line alone.
		own = w.ov[0]
		c = float64(own)
	default:
		for t, r := range w.ov {
			c += w.credit[t] * float64(r-own)
			own = r
		}
	}
	if s.cfg.PeerPulls && w.pull > 0 {
		p := s.peer1
		if p.w == w {
			p = s.peer2
		}
		if p.w != nil && p.run-own >= max(s.cfg.PeerMinBlocks, 1) {
			c += w.pull * float64(p.run-own)
		}
	}
	return c
}

// fastCost is cost(w, blocks).Total and w.Load(): the decision loop's form, which reads
// the load terms State.refresh keeps.
func (s *State) fastCost(w *WorkerState, blocks float64) (total, load float64) {
	cached := s.cached(w)
	pre, dec := w.pre, w.dec // State.refresh's
	total = s.cfg.OverlapWeight*(max(0, blocks-cached)+pre) + dec
	if w.lacks {
		total += s.cfg.AdapterLoadCost
	}
	return total, pre + dec
}

// cost is w's cost for a prompt of blocks blocks.
func (s *State) cost(w *WorkerState, blocks float64) Cost {
	cached := s.cached(w)
	prefill := max(0, blocks-cached) + w.PrefillBlocks()
	decode := w.DecodeBlocks()
	c := Cost{Prefill: prefill, Decode: decode, Total: s.cfg.OverlapWeight*prefill + decode}
	if w.lacks {
		c.Total += s.cfg.AdapterLoadCost
	}
	return c
}

// kv picks by the cost function: the cheapest worker at temperature 0 (ties broken by
// s.tieBreak), else a softmax draw over the costs normalised by the prompt's (State.span).
func (s *State) kv(cands []*WorkerState, blocks float64, key uint64) *WorkerState {
	if s.cfg.Temperature == 0 {
		var t tie
		for _, w := range cands {
			c, l := s.fastCost(w, blocks)
			t.offerLoad(s, w, c, l, key)
		}
		return t.best
	}
	ws := s.weights[:0]
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, w := range cands {
		c, _ := s.fastCost(w, blocks)
		ws = append(ws, c)
		lo, hi = min(lo, c), max(hi, c)
	}
	s.weights = ws
	return s.draw(cands, ws, lo, s.span(lo, hi, blocks))
}

// draw is the softmax draw over the candidates' costs ws (lo their least), each above lo
// divided by span (State.span), at the configured temperature; it overwrites ws with the
// weights.
//
// With shares (State.SetShare), when a worker of this router's share is among the cheapest
// (costs exactly lo), the cheapest workers of other shares are left to their routers (weight
// 0): routers that draw at the same instant would otherwise meet on them. The cheapest
// workers of the share take their weight instead (each n/own, n of them the cheapest and
// own of those in the share), so that the draw is as likely as without shares to go to a
// cheapest worker rather than to a dearer one: a router that gets all the traffic while the
// others get none spreads it as widely as without shares. Dearer workers weigh as without
// shares.
func (s *State) draw(cands []*WorkerState, ws []float64, lo, span float64) *WorkerState {
	ownOnly, boost := false, 1.0
	if s.shares > 1 {
		n, own := 0, 0
		for i, c := range ws {
			if c == lo {
				n++
				if cands[i].own {
					own++
				}
			}
		}
		if own > 0 {
			ownOnly, boost = true, float64(n)/float64(own)
		}
	}
	sum := 0.0
	for i, c := range ws {
		if ownOnly && c == lo && !cands[i].own {
			ws[i] = 0
			continue
		}
		x := 0.0
		if span > 0 {
			x = (c - lo) / span
		}
		if x > 20*s.cfg.Temperature {
			// Weight under e⁻²⁰ = 2·10⁻⁹ of the cheapest's: dropped, and no exponential to
			// compute (a thousand such candidates are 2·10⁻⁶ of the draw).
			ws[i] = 0
			continue
		}
		ws[i] = math.Exp(-x / s.cfg.Temperature)
		if ownOnly && c == lo {
			ws[i] *= boost
		}
		sum += ws[i]
	}
	r := s.rng.Float64() * sum
	last := 0
	for i, wt := range ws {
		if wt == 0 {
			continue
		}
		if r < wt {
			return cands[i]
		}
		r -= wt
		last = i
	}
	return cands[last] // rounding: the last one with a weight
}

// span is what the softmax divides a candidate's cost above the cheapest's lo by: the cost
// of computing the whole prompt of blocks blocks, else (an overlap weight of 0) the
// candidates' range hi − lo.
//
// The prompt's cost, not the range: divided by the range, the same difference counted for
// everything when the other candidates cost the same (a worker without the trace's shared
// system prompt was never drawn while a thousand idle ones held it) and for little when one
// candidate was far dearer (a long queue anywhere made the draw nearly uniform). Against the
// prompt's cost the scale is the request's own: at 256 and 1,000 simulated workers the hit
// rate rose from 0.347 and 0.337 to 0.367 and 0.366 (docs/routing-study.md).
func (s *State) span(lo, hi, blocks float64) float64 {
	if p := s.cfg.OverlapWeight * blocks; p > 0 {
		return p
	}
	return hi - lo
}

// roundRobin picks the first candidate after the last pick in id order,
// wrapping around.
func (s *State) roundRobin(cands []*WorkerState) *WorkerState {
	if s.rrValid {
		for _, w := range cands {
			if w.ID > s.rrLast {
				return w
			}
		}
	}
	return cands[0]
}

// leastLoaded picks the candidate with the least predicted load, ties broken as kv's.
func (s *State) leastLoaded(cands []*WorkerState, key uint64) *WorkerState {
	var t tie
	for _, w := range cands {
		t.offer(s, w, w.Load(), key)
	}
	return t.best
}

// A tie is the best worker so far of an argmin over a score. Among workers of equal score
// the one with the lower predicted load wins, then the one whose cache the index finds
// emptier (a new prefix there evicts the least), then the lower tie hash of (request key,
// worker, the State's seed): a different worker for each request, so that idle workers
// share the requests and their caches fill evenly, and, with each router's own seed, a
// different one in each router, so that routers do not converge on the same workers. A
// router with a share (State.SetShare) takes its own share's workers before all of that.
type tie struct {
	best   *WorkerState
	score  float64
	load   float64
	cached int // -1: not looked up yet
	hash   uint64
}

func (t *tie) offer(s *State, w *WorkerState, score float64, key uint64) {
	t.offerLoad(s, w, score, w.Load(), key)
}

// offerLoad is offer with w's load computed by the caller.
func (t *tie) offerLoad(s *State, w *WorkerState, score, l float64, key uint64) {
	if t.best == nil || score < t.score {
		*t = tie{best: w, score: score, load: l, cached: -1}
		return
	}
	if score > t.score {
		return
	}
	if w.own != t.best.own {
		// Routers with shares (State.SetShare) take their own share's workers first.
		if w.own {
			*t = tie{best: w, score: score, load: l, cached: -1}
		}
		return
	}
	switch {
	case l > t.load:
		return
	case l == t.load:
		if t.cached < 0 {
			t.cached, t.hash = int(t.best.ix.blocks.Load()), s.tieHash(key, t.best.ID)
		}
		c := int(w.ix.blocks.Load())
		if c > t.cached {
			return
		}
		h := s.tieHash(key, w.ID)
		if c == t.cached && h >= t.hash {
			return
		}
		*t = tie{best: w, score: score, load: l, cached: c, hash: h}
		return
	}
	*t = tie{best: w, score: score, load: l, cached: -1}
}

// tieKey is req's key for tie-breaking: its own, else one from its prompt.
func (s *State) tieKey(req Request) uint64 {
	if req.Key != 0 {
		return req.Key
	}
	k := uint64(req.PromptTokens)
	if n := len(req.Hashes); n > 0 {
		k ^= req.Hashes[n-1] // the chain's last hash names the whole prefix
	} else {
		k ^= s.seq << 32 // no full block: this decision
	}
	return k
}

// tieHash mixes a request key, a worker and the State's seed.
func (s *State) tieHash(key uint64, w WorkerID) uint64 {
	return finalize(key ^ s.tieSeed ^ uint64(w)*0x9e3779b97f4a7c15)
}

// finalize is splitmix64's finaliser: every bit of x moves about half of the result's.
func finalize(x uint64) uint64 {
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// admitsFormat reports whether a worker's KV blocks are of the format the request asks for
// (Request.KVFormat); a worker or request that names none admits any.
func (req *Request) admitsFormat(w *WorkerState) bool {
	return req.KVFormat == "" || w.Card.KVFormat == "" || w.Card.KVFormat == req.KVFormat
}
