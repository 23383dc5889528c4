package kvcache

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// contentSaver is a Saver over modelled contents: it checks that the device block it
// copies still holds the block it is said to, and records what each host slot holds.
type contentSaver struct {
	t      *testing.T
	device map[int32]uint64 // device block → hash of what was written into it
	slots  map[Loc]uint64   // lower-tier slot → hash of what it holds
	fail   func() bool      // fail this save
	saves  int
}

func (c *contentSaver) Save(block int32, to Loc, hash uint64) error {
	if got := c.device[block]; got != hash {
		c.t.Fatalf("save of device block %d as %#x, which holds %#x", block, hash, got)
	}
	if c.fail != nil && c.fail() {
		return errors.New("planted save failure")
	}
	c.saves++
	c.slots[to] = hash
	return nil
}

// tierMirror is a router's view of every tier of a pool, from its events.
type tierMirror struct {
	cache  map[Tier]map[uint64]uint64 // tier → hash → parent
	lastID uint64
}

func newTierMirror() *tierMirror { return &tierMirror{cache: map[Tier]map[uint64]uint64{}} }

func (m *tierMirror) tier(t Tier) map[uint64]uint64 {
	if m.cache[t] == nil {
		m.cache[t] = map[uint64]uint64{}
	}
	return m.cache[t]
}

func (m *tierMirror) apply(ev Event) error {
	if ev.ID != m.lastID+1 {
		return fmt.Errorf("event id %d after %d", ev.ID, m.lastID)
	}
	m.lastID = ev.ID
	c := m.tier(ev.Tier)
	switch ev.Kind {
	case EventStored:
		parent := ev.Parent
		for _, h := range ev.Hashes {
			if _, ok := c[h]; ok {
				return fmt.Errorf("event %d stores %#x twice in %v", ev.ID, h, ev.Tier)
			}
			c[h] = parent
			parent = h
		}
	case EventRemoved:
		for _, h := range ev.Hashes {
			if _, ok := c[h]; !ok {
				return fmt.Errorf("event %d removes absent %#x from %v", ev.ID, h, ev.Tier)
			}
			delete(c, h)
		}
	case EventCleared:
		clear(c)
	}
	return nil
}

// equal compares the mirror with a snapshot, tier by tier (hashes only: a lower tier's
// Stored event may name a parent the chain grouping did not see).
func (m *tierMirror) equal(s Snapshot) error {
	if s.LastID != m.lastID {
		return fmt.Errorf("snapshot at %d, events at %d", s.LastID, m.lastID)
	}
	check := func(t Tier, blocks []CachedBlock) error {
		got := map[uint64]bool{}
		for _, b := range blocks {
			got[b.Hash] = true
		}
		want := map[uint64]bool{}
		for h := range m.tier(t) {
			want[h] = true
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("tier %v: snapshot has %d blocks, events %d", t, len(got), len(want))
		}
		return nil
	}
	if err := check(s.Tier, s.Blocks); err != nil {
		return err
	}
	for _, ts := range s.Lower {
		if err := check(ts.Tier, ts.Blocks); err != nil {
			return err
		}
	}
	return nil
}

func tieredPool(t *testing.T, blocks int, o Options) *Pool {
	t.Helper()
	p, err := NewPoolWith(blocks, 4, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// compute reserves, "writes" and commits tokens for s, recording the content.
func compute(t *testing.T, s *Seq, toks []int32, device map[int32]uint64) bool {
	t.Helper()
	if err := s.Reserve(len(toks) - s.Len()); err != nil {
		return false
	}
	want := HashBlocks(testSalt, toks, s.pool.blockSize, nil)
	for b := s.Len() / s.pool.blockSize; b < len(want); b++ {
		device[s.blocks[b]] = want[b]
	}
	s.Commit(toks)
	return true
}

func TestWriteBackOnboards(t *testing.T) {
	device := map[int32]uint64{}
	sv := &contentSaver{t: t, device: device, slots: map[Loc]uint64{}}
	p := tieredPool(t, 8, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 16}}, Saver: sv})
	events, cancel := p.Subscribe(1 << 10)
	defer cancel()
	a := tokens(0, 17) // 4 full blocks and one token
	s := p.NewSeq(testSalt)
	if s.Match(a, 1) != 0 || !compute(t, s, a, device) {
		t.Fatal("first prompt")
	}
	s.Release()
	// Another prompt fills the device: a's blocks go down to host.
	b := tokens(1000, 29)
	s2 := p.NewSeq(testSalt)
	s2.Match(b, 1)
	if !compute(t, s2, b, device) {
		t.Fatal("second prompt")
	}
	s2.Release()
	if st := p.TierStats()[0]; st.Ready == 0 || sv.saves != st.Ready {
		t.Fatalf("host tier %+v after %d saves", st, sv.saves)
	}
	// a again: the device misses, host has its leading blocks.
	s3 := p.NewSeq(testSalt)
	cached := s3.Match(a, 1)
	loads := s3.MatchLower(a, 1, 1, nil)
	if cached+len(loads)*4 != 16 {
		t.Fatalf("matched %d on the device and %d blocks below, want 16 tokens in all", cached, len(loads))
	}
	want := HashBlocks(testSalt, a, 4, nil)
	for i, l := range loads {
		if l.From.Tier != TierHost || sv.slots[l.From] != l.Hash || l.Hash != want[cached/4+i] {
			t.Fatalf("load %d: %+v holds %#x", i, l, sv.slots[l.From])
		}
		device[l.Block] = l.Hash // the copy
	}
	if s3.Len() != cached {
		t.Fatalf("Len %d before the loads are done", s3.Len())
	}
	s3.OnboardDone(loads, len(loads), false)
	if s3.Len() != 16 || !slices.Equal(s3.Hashes(), want) {
		t.Fatalf("after onboarding: Len %d, hashes %x", s3.Len(), s3.Hashes())
	}
	if st := p.Stats(); st.Onboarded != uint64(len(loads)*4) {
		t.Fatalf("stats %+v", st)
	}
	s3.Release()
	s4 := p.NewSeq(testSalt)
	if n := s4.Match(a, 1); n != 16 {
		t.Fatalf("after onboarding the device holds %d tokens of a, want 16", n)
	}
	s4.Release()
	m := newTierMirror()
	for len(events) > 0 {
		if err := m.apply(<-events); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.equal(p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if len(m.tier(TierHost)) == 0 {
		t.Fatal("no host blocks announced")
	}
}

func TestWriteThroughCopiesAtCommit(t *testing.T) {
	device := map[int32]uint64{}
	sv := &contentSaver{t: t, device: device, slots: map[Loc]uint64{}}
	p := tieredPool(t, 8, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 16}}, Offload: WriteThrough, Saver: sv})
	s := p.NewSeq(testSalt)
	a := tokens(0, 17)
	s.Match(a, 1)
	compute(t, s, a, device)
	if sv.saves != 4 {
		t.Fatalf("%d saves at commit, want 4", sv.saves)
	}
	s.Release()
	// Evicting them copies nothing more: host has them.
	s2 := p.NewSeq(testSalt)
	b := tokens(1000, 29)
	s2.Match(b, 1)
	compute(t, s2, b, device)
	if sv.saves != 4+7 {
		t.Fatalf("%d saves, want the 4 of a and the 7 of b at their commits", sv.saves)
	}
}

// TestDiskFrequencyFilter: a block reaches the disk tier only once it has been used twice.
func TestDiskFrequencyFilter(t *testing.T) {
	device := map[int32]uint64{}
	sv := &contentSaver{t: t, device: device, slots: map[Loc]uint64{}}
	p := tieredPool(t, 8, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 16}, {Tier: TierDisk, Blocks: 64, MinUses: 2}}, Saver: sv})
	run := func(prompt []int32) {
		s := p.NewSeq(testSalt)
		s.Match(prompt, 1)
		if loads := s.MatchLower(prompt, 1, 1, nil); len(loads) > 0 {
			for _, l := range loads {
				device[l.Block] = l.Hash
			}
			s.OnboardDone(loads, len(loads), false)
		}
		if !compute(t, s, prompt, device) {
			t.Fatal("compute")
		}
		s.Release()
	}
	a, b := tokens(0, 17), tokens(1000, 29)
	run(a)
	run(b) // evicts a's blocks (used once) to host
	if xs := p.TakeTransfers(nil); len(xs) != 0 {
		t.Fatalf("%d transfers of blocks used once", len(xs))
	}
	run(a) // onboards a from host: its blocks are used twice now
	xs := p.TakeTransfers(nil)
	if len(xs) == 0 {
		t.Fatal("no transfer to disk of blocks used twice")
	}
	for _, x := range xs {
		if x.From.Tier != TierHost || x.To.Tier != TierDisk || sv.slots[x.From] != x.Hash {
			t.Fatalf("transfer %+v from a slot holding %#x", x, sv.slots[x.From])
		}
		sv.slots[x.To] = x.Hash
		p.TransferDone(x, nil)
	}
	if st := p.TierStats()[1]; st.Ready != len(xs) {
		t.Fatalf("disk %+v after %d transfers", st, len(xs))
	}
}

func TestBadLoadDropsBlock(t *testing.T) {
	device := map[int32]uint64{}
	sv := &contentSaver{t: t, device: device, slots: map[Loc]uint64{}}
	p := tieredPool(t, 8, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 16}}, Saver: sv})
	a, b := tokens(0, 17), tokens(1000, 29)
	for _, pr := range [][]int32{a, b} {
		s := p.NewSeq(testSalt)
		s.Match(pr, 1)
		compute(t, s, pr, device)
		s.Release()
	}
	s := p.NewSeq(testSalt)
	cached := s.Match(a, 1)
	loads := s.MatchLower(a, 1, 1, nil)
	if len(loads) < 2 {
		t.Fatalf("%d loads", len(loads))
	}
	device[loads[0].Block] = loads[0].Hash
	s.OnboardDone(loads, 1, true) // the second block was corrupt
	if s.Len() != cached+4 {
		t.Fatalf("Len %d, want %d", s.Len(), cached+4)
	}
	if p.Holds(TierHost, loads[1].Hash) || !p.Holds(TierHost, loads[0].Hash) {
		t.Fatal("the bad block is still held, or the good one was dropped")
	}
	if st := p.TierStats()[0]; st.Bad != 1 || st.Pinned != 0 {
		t.Fatalf("host %+v", st)
	}
	// The rest is computed in the blocks reserved for it.
	if !compute(t, s, a, device) {
		t.Fatal("compute the rest")
	}
	s.Release()
}

func TestRestoreAndClearTier(t *testing.T) {
	p := tieredPool(t, 8, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 4}, {Tier: TierDisk, Blocks: 8}}})
	events, cancel := p.Subscribe(64)
	defer cancel()
	n := p.Restore(TierDisk, []Restored{{Slot: 3, Hash: 10}, {Slot: 5, Hash: 11, Parent: 10}, {Slot: 5, Hash: 12}, {Slot: 9, Hash: 13}, {Slot: 1, Hash: 10}})
	if n != 2 {
		t.Fatalf("restored %d, want 2 (a taken slot, a slot past the capacity and a duplicate hash skipped)", n)
	}
	m := newTierMirror()
	for len(events) > 0 {
		m.apply(<-events)
	}
	if len(m.tier(TierDisk)) != 2 {
		t.Fatalf("announced %v", m.cache)
	}
	if p.ClearTier(TierDisk) != 2 || p.Holds(TierDisk, 10) {
		t.Fatal("clear")
	}
	for len(events) > 0 {
		m.apply(<-events)
	}
	if err := m.equal(p.Snapshot()); err != nil {
		t.Fatal(err)
	}
}

// TestTiersRandomized runs random sequences through a small pool with host and disk tiers
// (write-back or write-through): saves, transfers and loads that fail at random, bad
// blocks, cleared tiers. Every copy is checked against what its source holds (a load never
// reads a slot that holds another block), the books after every step, and the event
// stream of every tier against snapshots.
func TestTiersRandomized(t *testing.T) {
	for _, policy := range []OffloadPolicy{WriteBack, WriteThrough} {
		t.Run(policy.String(), func(t *testing.T) { randomTiers(t, policy) })
	}
}

func randomTiers(t *testing.T, policy OffloadPolicy) {
	const bs = 4
	r := rand.New(rand.NewPCG(3, uint64(policy)))
	device := map[int32]uint64{}
	sv := &contentSaver{t: t, device: device, slots: map[Loc]uint64{}, fail: func() bool { return r.IntN(20) == 0 }}
	p, err := NewPoolWith(24, bs, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 12}, {Tier: TierDisk, Blocks: 40, MinUses: 2}},
		Offload: policy, Saver: sv, MaxTransfers: 8})
	if err != nil {
		t.Fatal(err)
	}
	events, cancel := p.Subscribe(1 << 16)
	defer cancel()
	m := newTierMirror()
	prefixes := make([][]int32, 8)
	for i := range prefixes {
		prefixes[i] = tokens(int32(1000*i), 8+r.IntN(24))
	}
	var pendingX []Transfer
	runTransfers := func(all bool) {
		pendingX = p.TakeTransfers(pendingX)
		for len(pendingX) > 0 && (all || r.IntN(3) > 0) {
			x := pendingX[0]
			pendingX = pendingX[1:]
			if got := sv.slots[x.From]; got != x.Hash {
				t.Fatalf("transfer of %#x from %+v, which holds %#x", x.Hash, x.From, got)
			}
			if r.IntN(10) == 0 {
				p.TransferDone(x, errors.New("planted write failure"))
				continue
			}
			sv.slots[x.To] = x.Hash
			p.TransferDone(x, nil)
		}
	}
	var onboarded, bad, hits int
	var live []*Seq
	for step := range 3000 {
		switch op := r.IntN(10); {
		case op < 6:
			prompt := slices.Clone(prefixes[r.IntN(len(prefixes))])
			prompt = append(prompt, tokens(int32(100000+step), r.IntN(6))...)
			s := p.NewSeq(testSalt)
			hits += s.Match(prompt, 1)
			loads := s.MatchLower(prompt, 1, 1, nil)
			if r.IntN(30) == 0 {
				p.ClearTier(TierDisk) // while loads hold some of its blocks
			}
			ok, isBad := len(loads), false
			for i, l := range loads {
				if got := sv.slots[l.From]; got != l.Hash {
					t.Fatalf("step %d: load of %#x from %+v, which holds %#x", step, l.Hash, l.From, got)
				}
				if r.IntN(15) == 0 { // a corrupt block
					ok, isBad = i, true
					break
				}
				device[l.Block] = l.Hash
			}
			if len(loads) > 0 {
				s.OnboardDone(loads, ok, isBad)
				onboarded += ok
				if isBad {
					bad++
				}
			}
			if compute(t, s, prompt, device) && r.IntN(3) == 0 {
				live = append(live, s)
			} else {
				s.Release()
			}
		case op < 8:
			runTransfers(false)
		case op < 9 && len(live) > 0:
			i := r.IntN(len(live))
			live[i].Release()
			live = slices.Delete(live, i, i+1)
		default:
			if r.IntN(50) == 0 {
				runTransfers(true)
				p.ClearTier(TierDisk)
			}
		}
		checkInvariants(t, p, nil, device)
		checkTiers(t, p, sv.slots, len(pendingX))
		if step%50 == 0 {
			for len(events) > 0 {
				if err := m.apply(<-events); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.equal(p.Snapshot()); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	for _, s := range live {
		s.Release()
	}
	runTransfers(true)
	checkTiers(t, p, sv.slots, 0)
	st := p.TierStats()
	if onboarded == 0 || bad == 0 || st[0].Evicted == 0 || st[1].Stored == 0 || st[0].Failed == 0 {
		t.Errorf("weak workload: onboarded %d, bad %d, tiers %+v", onboarded, bad, st)
	}
	t.Logf("%v: device hits %d tokens, onboarded %d blocks (%d bad), tiers %+v", policy, hits, onboarded, bad, st)
}

// checkTiers verifies the lower tiers' books: every ready block's slot holds it, counts
// agree, the LRU holds exactly the ready unpinned blocks, and nothing is pinned but by
// the transfers still to run.
func checkTiers(t *testing.T, p *Pool, slots map[Loc]uint64, transfers int) {
	t.Helper()
	pins := 0
	for _, lt := range p.lower {
		ready, filling, pinned, lru := 0, 0, 0, 0
		for s := range lt.ents {
			e := &lt.ents[s]
			loc := Loc{lt.cfg.Tier, int32(s)}
			switch e.state {
			case entReady:
				ready++
				if got := slots[loc]; got != e.hash {
					t.Fatalf("%v slot %d is ready with %#x but holds %#x", lt.cfg.Tier, s, e.hash, got)
				}
				if e.ref > 0 {
					pinned++
					pins += int(e.ref)
				}
				if e.inLRU != (e.ref == 0) {
					t.Fatalf("%v slot %d: ref %d, in LRU %v", lt.cfg.Tier, s, e.ref, e.inLRU)
				}
			case entFilling:
				filling++
			}
			if e.state != entFree {
				if got, ok := lt.index[e.hash]; !ok || got != int32(s) {
					t.Fatalf("%v slot %d (%#x) not indexed", lt.cfg.Tier, s, e.hash)
				}
			}
		}
		for h := lt.head; h != none; h = lt.ents[h].next {
			lru++
		}
		if ready != lt.ready || filling != lt.filling || pinned != lt.pinned || lru != lt.lruN || lru != ready-pinned || len(lt.index) != ready+filling {
			t.Fatalf("%v: ready %d/%d filling %d/%d pinned %d/%d lru %d/%d index %d", lt.cfg.Tier, ready, lt.ready, filling, lt.filling, pinned, lt.pinned, lru, lt.lruN, len(lt.index))
		}
	}
	union := map[uint64]bool{}
	for h := range p.index {
		union[h] = true
	}
	for _, lt := range p.lower {
		for s := range lt.ents {
			if lt.ents[s].state == entReady {
				union[lt.ents[s].hash] = true
			}
		}
	}
	if len(union) != p.held {
		t.Fatalf("the pool holds %d distinct blocks, its count says %d", len(union), p.held)
	}
	transfers += len(p.xfers) // queued, not taken yet
	if pins != transfers || p.xferN != transfers {
		t.Fatalf("%d pins and %d transfers in the books, %d transfers pending", pins, p.xferN, transfers)
	}
}

func TestSetLoadableBypassesTier(t *testing.T) {
	// A tier that measured slower than computing is not loaded from: the prompt computes
	// the blocks it holds, the bypass is counted, and loading resumes when it is allowed.
	device := map[int32]uint64{}
	sv := &contentSaver{t: t, device: device, slots: map[Loc]uint64{}}
	p := tieredPool(t, 8, Options{Tiers: []TierConfig{{Tier: TierHost, Blocks: 16}}, Saver: sv})
	a, b := tokens(0, 17), tokens(1000, 29)
	for _, toks := range [][]int32{a, b} { // b evicts a's blocks to host memory
		s := p.NewSeq(testSalt)
		s.Match(toks, 1)
		if !compute(t, s, toks, device) {
			t.Fatal("prompt did not fit")
		}
		s.Release()
	}
	p.SetLoadable(TierHost, false)
	s := p.NewSeq(testSalt)
	cached := s.Match(a, 1)
	if loads := s.MatchLower(a, 1, 1, nil); len(loads) != 0 {
		t.Fatalf("%d loads from a tier that is not loadable", len(loads))
	}
	if st := p.TierStats()[0]; st.Loadable || st.Bypassed != 1 || st.Ready == 0 {
		t.Fatalf("host tier %+v: want not loadable, 1 bypass, blocks held", st)
	}
	s.Release()
	p.SetLoadable(TierHost, true)
	s = p.NewSeq(testSalt)
	if c := s.Match(a, 1); c != cached {
		t.Fatalf("matched %d, then %d", cached, c)
	}
	loads := s.MatchLower(a, 1, 1, nil)
	if len(loads) == 0 {
		t.Fatal("no loads once the tier is loadable again")
	}
	s.OnboardDone(loads, 0, false)
	s.Release()
	if st := p.TierStats()[0]; !st.Loadable || st.Bypassed != 1 {
		t.Fatalf("host tier %+v: want loadable, still 1 bypass", st)
	}
}
