package router

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"tandem/kvcache"
)

// exhaustivePick is the decision's choice as it was computed before the fast path
// (commit 1022de5): every worker's health, busyness and cost recomputed from its report and
// deltas, every candidate costed, the softmax over all of them. It is kept here, frozen, as
// the reference TestDecideMatchesExhaustive holds State.Decide to. Like Decide it advances
// s.seq, stamps the workers' overlaps and draws from s.rng; unlike it, it records nothing.
// Added since: a router's share (SetShare), the tie's own-first rule (shared code) and the
// softmax's cheapest of other shares left out, when one of the share's is among them, and
// their weight given to the share's cheapest.
func exhaustivePick(s *State, r Request) (WorkerID, bool) {
	s.seq++
	busy := func(w *WorkerState) bool {
		c := &s.cfg
		return (c.BusyKVUsage > 0 && w.KVUsage() >= c.BusyKVUsage) ||
			(c.BusyWaiting > 0 && w.Waiting() >= c.BusyWaiting)
	}
	var cands []*WorkerState
	stale := 0
	for _, w := range s.workers {
		if !w.Healthy || !r.Pool.admits(w.Card.Role) || w.Stale && s.cfg.RequireKVEvents {
			continue
		}
		w.lacks = !w.serves(r.Adapter)
		if w.lacks && (!r.AdapterLoadable || s.cfg.AdapterLoadCost <= 0) {
			continue
		}
		if !busy(w) {
			cands = append(cands, w)
			if w.Stale {
				stale++
			}
		}
	}
	if len(cands) == 0 {
		return 0, false
	}
	tokens := r.PromptTokens
	if tokens <= 0 {
		tokens = len(r.Hashes) * s.card.BlockSize
	}
	s.peer1, s.peer2 = peerRun{}, peerRun{}
	for _, m := range s.index.OverlapInto(r.Hashes, nil) {
		if w := s.lookup(m.Worker); w != nil {
			w.stamp, w.ov = s.seq, [numLevels]int{m.Device, m.Host, m.Disk, m.Remote}
			if s.cfg.PeerPulls && w.Healthy && !w.Stale {
				s.offerPeer(w, m.Disk)
			}
		}
	}
	if stale > 0 {
		s.unknownOverlap(cands)
	}
	if len(cands) == 1 {
		return cands[0].ID, true
	}
	blocks := float64(tokens) / float64(s.card.BlockSize)
	inv := 1 / float64(s.card.BlockSize)
	cost := func(w *WorkerState) (total, load float64) {
		var cached float64
		own := 0
		if w.stamp == s.seq {
			for t, r := range w.ov {
				cached += w.credit[t] * float64(r-own)
				own = r
			}
		}
		if s.cfg.PeerPulls && w.pull > 0 {
			p := s.peer1
			if p.w == w {
				p = s.peer2
			}
			if p.w != nil && p.run-own >= max(s.cfg.PeerMinBlocks, 1) {
				cached += w.pull * float64(p.run-own)
			}
		}
		pre := max(0, float64(w.Report.PrefillTokens)*inv+float64(w.dPrefill))
		dec := float64(max(0, w.Report.DecodeBlocks+w.dDecode))
		total = s.cfg.OverlapWeight*(max(0, blocks-cached)+pre) + dec
		if w.lacks {
			total += s.cfg.AdapterLoadCost
		}
		return total, pre + dec
	}
	key := s.tieKey(r)
	if s.cfg.Temperature == 0 {
		var t tie
		for _, w := range cands {
			c, l := cost(w)
			t.offerLoad(s, w, c, l, key)
		}
		return t.best.ID, true
	}
	ws := make([]float64, len(cands))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, w := range cands {
		ws[i], _ = cost(w)
		lo, hi = min(lo, ws[i]), max(hi, ws[i])
	}
	n, own := 0, 0
	for i, w := range cands {
		if ws[i] == lo {
			n++
			if w.own {
				own++
			}
		}
	}
	ownOnly := s.shares > 1 && own > 0
	sum := 0.0
	for i, c := range ws {
		x := 0.0
		if span := s.cfg.OverlapWeight * blocks; span > 0 {
			x = (c - lo) / span
		} else if hi > lo {
			x = (c - lo) / (hi - lo)
		}
		if x > 20*s.cfg.Temperature || ownOnly && c == lo && !cands[i].own {
			ws[i] = 0
			continue
		}
		ws[i] = math.Exp(-x / s.cfg.Temperature)
		if ownOnly && c == lo {
			ws[i] *= float64(n) / float64(own)
		}
		sum += ws[i]
	}
	u := s.rng.Float64() * sum
	last := 0
	for i, wt := range ws {
		if wt == 0 {
			continue
		}
		if u < wt {
			return cands[i].ID, true
		}
		u -= wt
		last = i
	}
	return cands[last].ID, true
}

// Decide's fast paths pick exactly the worker the exhaustive computation picks, at
// temperature 0 and (drawing the same random numbers) above it: two States fed the same
// random history of reports, health, staleness, KV events, dispatches and completions,
// one deciding with Decide and the other with exhaustivePick, agree on every decision.
// Each case runs with the grouped decision from its usual size (64 workers) and forced at
// any size; the pools of a thousand workers share a system prompt (most hold it, a few
// hold it on the host tier, a few nothing) so that the walk's groups and the grouped
// decision's bounds, ties and draws are exercised at the scale they are for.
func TestDecideMatchesExhaustive(t *testing.T) {
	for _, tc := range []exhaustiveCase{
		{name: "argmin", weight: 1, workers: 40, stale: true},
		{name: "argmin-weight16", weight: 16, workers: 200, stale: true},
		{name: "argmin-peers", weight: 16, workers: 70, peer: true, stale: true},
		{name: "softmax", temp: 0.02, weight: 16, workers: 200, stale: true},
		{name: "softmax-hot", temp: 0.5, weight: 4, workers: 70, stale: true},
		{name: "softmax-peers", temp: 0.02, weight: 16, workers: 130, peer: true, stale: true},
		{name: "argmin-fresh", weight: 16, workers: 40},
		{name: "softmax-fresh", temp: 0.02, weight: 16, workers: 200},
		{name: "softmax-odd-weight", temp: 0.02, weight: 0.7, workers: 90},
		{name: "shared-softmax", temp: 0.02, weight: 16, workers: 1000, shared: true},
		{name: "shared-argmin", weight: 16, workers: 1000, shared: true},
		{name: "shared-softmax-hot", temp: 0.3, weight: 2.5, workers: 1000, shared: true},
		{name: "shared-require-events", temp: 0.02, weight: 16, workers: 300, shared: true, stale: true, require: true},
		{name: "shares-softmax", temp: 0.02, weight: 16, workers: 200, shares: 2, stale: true},
		{name: "shares-argmin", weight: 16, workers: 200, shares: 3},
		{name: "shared-shares-softmax", temp: 0.02, weight: 16, workers: 1000, shared: true, shares: 2},
		{name: "shared-shares-argmin", weight: 16, workers: 1000, shared: true, shares: 3},
	} {
		for _, forced := range []bool{false, true} {
			seeds := uint64(4)
			if tc.workers >= 1000 {
				seeds = 2
			}
			for seed := range seeds {
				t.Run(fmt.Sprintf("%s/forced=%v/seed%d", tc.name, forced, seed), func(t *testing.T) {
					runExhaustive(t, tc, forced, seed)
				})
			}
		}
	}
}

type exhaustiveCase struct {
	name    string
	temp    float64
	weight  float64
	workers int
	peer    bool
	shared  bool // workers start holding a shared system prompt (and some their chains)
	stale   bool // workers turn stale (a stale candidate makes a decision visit every worker)
	require bool // RequireKVEvents
	shares  int  // the States are the second of shares routers (SetShare)
}

func runExhaustive(t *testing.T, tc exhaustiveCase, forced bool, seed uint64) {
	cfg := DefaultConfig()
	cfg.Temperature, cfg.OverlapWeight, cfg.PeerPulls, cfg.RequireKVEvents = tc.temp, tc.weight, tc.peer, tc.require
	cfg.AffinityTTL = 0
	fast, ref := newTestState(t, cfg), newTestState(t, cfg)
	if forced {
		fast.groupFrom = 0
	}
	for _, s := range []*State{fast, ref} {
		if err := s.SetShare(1, tc.shares); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(tc.workers), 9+seed))
	// A few shared prefixes and their continuations: workers hold prefixes of them.
	var chains [][]uint64
	for c := range 6 {
		sys := toks(1+c%2*7919, 8*testBlock) // two system prompts shared by the chains
		chains = append(chains, hashes(cat(sys, toks(100000*(c+1), 56*testBlock))))
	}
	both := func(f func(s *State) error) {
		t.Helper()
		for _, s := range []*State{fast, ref} {
			if err := f(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventID := map[WorkerID]uint64{}
	apply := func(w WorkerID, tier kvcache.Tier, hs []uint64) {
		eventID[w]++
		ev := stored(eventID[w], tier, 0, hs...)
		both(func(s *State) error { _, err := s.ApplyEvent(w, ev); return err })
	}
	var inflight [][2]Inflight // fast's and ref's record of each dispatch
	for i := range WorkerID(tc.workers) {
		w := i
		if seed%2 == 1 {
			w = WorkerID(tc.workers) - 1 - i // registered in reverse: slots against the workers' order
		}
		card := testCard
		card.Node = fmt.Sprintf("worker-%d", w)
		both(func(s *State) error { return s.AddWorker(w, card) })
		if !tc.shared {
			continue
		}
		c := chains[2*rng.IntN(3)] // the first system prompt's chains
		switch r := rng.IntN(20); {
		case r == 0: // nothing
		case r == 1: // the system prompt on the host tier
			apply(w, kvcache.TierHost, c[:8])
		case r < 5: // part of a conversation past it
			apply(w, kvcache.TierDevice, c[:9+rng.IntN(len(c)-9)])
		case r < 10: // a second shared level: runs of 16 on each chain (a second group)
			apply(w, kvcache.TierDevice, c[:16])
		default:
			apply(w, kvcache.TierDevice, c[:8])
		}
	}
	decisions, disagreements := 0, 0
	for step := range 3000 {
		w := WorkerID(rng.IntN(tc.workers))
		switch op := rng.IntN(20); {
		case op < 5: // a load report, small numbers so that costs tie
			l := LoadReport{Healthy: rng.IntN(30) != 0, DecodeBlocks: rng.IntN(4) * 8, PrefillTokens: rng.IntN(3) * 2 * testBlock,
				Waiting: rng.IntN(20), KVUsage: float64(rng.IntN(100)) / 100}
			if rng.IntN(4) == 0 {
				l.BlockPrefillMicros, l.TierLoadMicros[1], l.PullMicros = 100, rng.IntN(150), rng.IntN(150)
			}
			both(func(s *State) error { return s.Report(w, l, t0) })
		case op < 7:
			healthy := rng.IntN(3) != 0
			both(func(s *State) error { return s.SetHealthy(w, healthy) })
		case op < 8:
			stale := tc.stale && rng.IntN(4) == 0
			both(func(s *State) error { return s.SetStale(w, stale) })
		case op < 12: // the worker caches a prefix of a chain, in some tier
			c := chains[rng.IntN(len(chains))]
			n := 1 + rng.IntN(len(c))
			tier := kvcache.Tier(0)
			if rng.IntN(4) == 0 {
				tier = kvcache.Tier(1 + rng.IntN(3))
			}
			apply(w, tier, c[:n])
		case op == 12 && rng.IntN(8) == 0: // a resync: the worker's entries replaced by a snapshot
			c := chains[rng.IntN(len(chains))]
			eventID[w] += 5
			snap := kvcache.Snapshot{LastID: eventID[w]}
			for _, h := range c[:rng.IntN(len(c))] {
				snap.Blocks = append(snap.Blocks, kvcache.CachedBlock{Hash: h})
			}
			both(func(s *State) error { return s.ResetWorker(w, snap) })
		case op < 14 && len(inflight) > 0: // a dispatch gets its first token or ends
			i := rng.IntN(len(inflight))
			if rng.IntN(2) == 0 {
				fast.PrefillDone(&inflight[i][0])
				ref.PrefillDone(&inflight[i][1])
			} else {
				fast.RemoveInflight(inflight[i][0])
				ref.RemoveInflight(inflight[i][1])
				inflight = append(inflight[:i], inflight[i+1:]...)
			}
		default: // a decision
			c := chains[rng.IntN(len(chains))]
			r := Request{Hashes: c[:1+rng.IntN(len(c))], Now: t0, Key: uint64(step + 1)}
			r.PromptTokens = len(r.Hashes)*testBlock - rng.IntN(testBlock)
			want, ok := exhaustivePick(ref, r)
			d, err := fast.Decide(r)
			if !ok {
				if err == nil {
					t.Fatalf("step %d: Decide picked %d where no worker is available", step, d.Worker)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: Decide: %v, want worker %d", step, err, want)
			}
			decisions++
			if d.Worker != want {
				disagreements++
				t.Errorf("step %d: Decide picked %d, the exhaustive cost %d", step, d.Worker, want)
				continue
			}
			if m := ref.overlap(ref.lookup(want)); d.Runs != m {
				t.Errorf("step %d: worker %d's runs %v, the exhaustive walk's %v", step, want, d.Runs, m)
			}
			in := ref.AddInflight(want, d.Inflight.PromptBlocks, d.Inflight.CachedBlocks)
			inflight = append(inflight, [2]Inflight{d.Inflight, in})
		}
	}
	if decisions < 300 {
		t.Fatalf("only %d decisions were made: the history tests too little", decisions)
	}
	grouped := !tc.peer && (forced || tc.workers >= groupFrom)
	if grouped && (tc.require || !tc.stale) && fast.byGroups < uint64(decisions)/2 {
		t.Errorf("%d of %d decisions taken by groups, want most", fast.byGroups, decisions)
	}
	if !grouped && fast.byGroups > 0 {
		t.Errorf("%d decisions taken by groups, want none", fast.byGroups)
	}
	t.Logf("%d decisions (%d by groups), %d disagreements", decisions, fast.byGroups, disagreements)
}

// TestDecideEqualCostsShares: with shares, a draw over candidates that all cost the same
// (idle workers, a prompt nobody holds) picks what the exhaustive draw picks: the grouped
// decision's shortcut for equal costs weighs the share's candidates as State.draw does.
func TestDecideEqualCostsShares(t *testing.T) {
	for _, shares := range []int{2, 3} {
		fast, ref := newTestState(t, DefaultConfig()), newTestState(t, DefaultConfig())
		for _, s := range []*State{fast, ref} {
			if err := s.SetShare(1, shares); err != nil {
				t.Fatal(err)
			}
			for w := range WorkerID(100) {
				addNamed(t, s, w, fmt.Sprintf("node-%d", w))
			}
		}
		for i := range 300 {
			r := Request{Hashes: hashes(toks(1000*(i+1), 4*testBlock)), PromptTokens: 4 * testBlock, Now: t0, Key: uint64(i + 1)}
			want, _ := exhaustivePick(ref, r)
			d, err := fast.Decide(r)
			if err != nil {
				t.Fatal(err)
			}
			if d.Worker != want {
				t.Fatalf("%d shares, decision %d: Decide picked %d, the exhaustive draw %d", shares, i, d.Worker, want)
			}
			fast.RemoveInflight(d.Inflight) // every worker idle again: every cost equal
		}
		if fast.byGroups == 0 {
			t.Errorf("%d shares: no decision taken by groups", shares)
		}
	}
}
