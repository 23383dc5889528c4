package kvcache

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkInvariants verifies the pool's bookkeeping. If seqs is not nil, it holds
// every live sequence and the reference counts must equal their table entries.
// If content is not nil, it maps each block to the hash of what was last written
// into it, and every cached hash must name a block holding that content.
func checkInvariants(t *testing.T, p *Pool, seqs []*Seq, content ...map[int32]uint64) {
	t.Helper()
	n := len(p.blocks)
	if seqs != nil {
		refs := make([]int32, n)
		for _, s := range seqs {
			for _, id := range s.blocks {
				refs[id]++
			}
		}
		for i := range n {
			if p.blocks[i].ref != refs[i] {
				t.Fatalf("block %d: ref %d, want %d", i, p.blocks[i].ref, refs[i])
			}
		}
	}
	onFree := make([]bool, n)
	for _, id := range p.free {
		if onFree[id] {
			t.Fatalf("block %d twice on the free list", id)
		}
		onFree[id] = true
	}
	var used, cached, free int
	for i := range n {
		b := &p.blocks[i]
		switch {
		case b.ref < 0:
			t.Fatalf("block %d: ref %d", i, b.ref)
		case b.ref > 0:
			used++
			if onFree[i] || b.list != onNone {
				t.Fatalf("block %d referenced and free (free list %v, list %d)", i, onFree[i], b.list)
			}
		case b.cached:
			cached++
			if onFree[i] || b.list == onNone {
				t.Fatalf("cached block %d: free list %v, list %d", i, onFree[i], b.list)
			}
		default:
			free++
			if !onFree[i] || b.list != onNone {
				t.Fatalf("free block %d: free list %v, list %d", i, onFree[i], b.list)
			}
		}
		if b.cached {
			if id, ok := p.index[b.hash]; !ok || id != int32(i) {
				t.Fatalf("cached block %d: index has %d, %v", i, id, ok)
			}
		}
	}
	if used+cached+free != n || used != p.used || free != len(p.free) || cached != p.leaves.n+p.inner.n {
		t.Fatalf("used/cached/free %d/%d/%d (pool says %d/%d/%d) of %d",
			used, cached, free, p.used, p.leaves.n+p.inner.n, len(p.free), n)
	}
	for h, id := range p.index {
		b := &p.blocks[id]
		if !b.cached || b.hash != h {
			t.Fatalf("index %#x → block %d (cached %v, hash %#x)", h, id, b.cached, b.hash)
		}
		if len(content) > 0 && content[0][id] != h {
			t.Fatalf("index %#x → block %d whose content is %#x", h, id, content[0][id])
		}
	}
	// Children counts follow the live links.
	children := make([]int32, n)
	for i := range n {
		b := &p.blocks[i]
		if b.cached && b.up != none && p.blocks[b.up].gen == b.upGen {
			if !p.blocks[b.up].cached {
				t.Fatalf("block %d linked to uncached parent %d", i, b.up)
			}
			children[b.up]++
		}
	}
	for i := range n {
		if b := &p.blocks[i]; b.cached && b.children != children[i] {
			t.Fatalf("block %d: children %d, want %d", i, b.children, children[i])
		}
	}
	// Lists: oldest first, consistent links, leaves without children.
	for _, l := range []struct {
		l     *list
		which uint8
	}{{&p.leaves, onLeaves}, {&p.inner, onInner}} {
		count, prev := 0, none
		for id := l.l.head; id != none; id = p.blocks[id].next {
			b := &p.blocks[id]
			if b.list != l.which || b.prev != prev || b.ref != 0 || !b.cached {
				t.Fatalf("list %d: block %d list %d prev %d (want %d) ref %d cached %v",
					l.which, id, b.list, b.prev, prev, b.ref, b.cached)
			}
			if (b.children == 0) != (l.which == onLeaves) {
				t.Fatalf("list %d: block %d has %d children", l.which, id, b.children)
			}
			if prev != none && p.blocks[prev].lastUse > b.lastUse {
				t.Fatalf("list %d out of LRU order at block %d", l.which, id)
			}
			prev = id
			count++
		}
		if count != l.l.n || prev != l.l.tail {
			t.Fatalf("list %d: walked %d ending at %d, n %d tail %d", l.which, count, prev, l.l.n, l.l.tail)
		}
	}
}

// mirror is a subscriber's copy of a pool's cache, as a router keeps it.
type mirror struct {
	cache  map[uint64]uint64 // hash → parent
	lastID uint64
}

// apply applies ev, reporting an error for a gap or an event that does not fit.
func (m *mirror) apply(ev Event) error {
	if ev.ID != m.lastID+1 {
		return fmt.Errorf("event id %d after %d", ev.ID, m.lastID)
	}
	m.lastID = ev.ID
	if ev.Tier != TierDevice {
		return fmt.Errorf("tier %v", ev.Tier)
	}
	switch ev.Kind {
	case EventStored:
		if len(ev.Hashes) == 0 {
			return fmt.Errorf("event %d stores nothing", ev.ID)
		}
		parent := ev.Parent
		for _, h := range ev.Hashes {
			if _, ok := m.cache[h]; ok {
				return fmt.Errorf("event %d stores %#x twice", ev.ID, h)
			}
			m.cache[h] = parent
			parent = h
		}
	case EventRemoved:
		if len(ev.Hashes) == 0 {
			return fmt.Errorf("event %d removes nothing", ev.ID)
		}
		for _, h := range ev.Hashes {
			if _, ok := m.cache[h]; !ok {
				return fmt.Errorf("event %d removes absent %#x", ev.ID, h)
			}
			delete(m.cache, h)
		}
	case EventCleared:
		clear(m.cache)
	default:
		return fmt.Errorf("event kind %v", ev.Kind)
	}
	return nil
}

// resync replaces the mirror's content with a snapshot.
func (m *mirror) resync(s Snapshot) {
	m.cache = snapshotMap(s)
	m.lastID = s.LastID
}

func snapshotMap(s Snapshot) map[uint64]uint64 {
	m := make(map[uint64]uint64, len(s.Blocks))
	for _, b := range s.Blocks {
		m[b.Hash] = b.Parent
	}
	return m
}

// TestRandomized runs random sequences sharing prefixes through a small pool —
// chunked prefill, decode, release, preemption, duplicates, clears — checking
// the invariants after every step and the event stream against snapshots.
func TestRandomized(t *testing.T) {
	const bs = 4
	r := rand.New(rand.NewPCG(7, 11))
	p := NewPool(48, bs)
	events, cancel := p.Subscribe(1 << 16)
	defer cancel()
	m := &mirror{cache: map[uint64]uint64{}}
	drain := func() {
		for {
			select {
			case ev := <-events:
				if err := m.apply(ev); err != nil {
					t.Fatal(err)
				}
			default:
				return
			}
		}
	}

	prefixes := make([][]int32, 5)
	for i := range prefixes {
		prefixes[i] = tokens(int32(1000*i), r.IntN(20))
	}
	content := map[int32]uint64{} // block → hash of the full block written into it
	type live struct {
		s    *Seq
		toks []int32
	}
	var seqs []*live
	var dups int // blocks computed while an identical one was cached
	all := func() []*Seq {
		out := make([]*Seq, len(seqs))
		for i, l := range seqs {
			out[i] = l.s
		}
		return out
	}
	// compute reserves n more tokens of l, "writes" them and commits them.
	compute := func(l *live, toks []int32) bool {
		s := l.s
		old := len(s.blocks)
		if err := s.Reserve(len(toks) - s.Len()); err != nil {
			if !errors.Is(err, ErrNoBlocks) {
				t.Fatal(err)
			}
			if len(s.blocks) != old {
				t.Fatal("failed Reserve took blocks")
			}
			return false
		}
		for _, id := range s.blocks[old:] {
			content[id] = 0 // garbage until written
		}
		want := HashBlocks(testSalt, toks, bs, nil)
		for b := s.Len() / bs; b < len(want); b++ {
			content[s.blocks[b]] = want[b]
			if _, ok := p.index[want[b]]; ok {
				dups++
			}
		}
		s.Commit(toks)
		l.toks = toks
		return true
	}
	remove := func(i int) {
		seqs[i].s.Release()
		seqs = slices.Delete(seqs, i, i+1)
	}

	var admitted, preempted, hits int
	for step := range 4000 {
		switch op := r.IntN(20); {
		case op < 6 || len(seqs) == 0: // admit
			prompt := slices.Clone(prefixes[r.IntN(len(prefixes))])
			for range r.IntN(10) {
				prompt = append(prompt, int32(r.IntN(3)))
			}
			if len(prompt) == 0 {
				prompt = append(prompt, 1)
			}
			l := &live{s: p.NewSeq(testSalt)}
			cached := l.s.Match(prompt, 1)
			if cached >= len(prompt) || cached%bs != 0 {
				t.Fatalf("Match(%d tokens) = %d", len(prompt), cached)
			}
			hits += cached
			seqs = append(seqs, l)
			// Chunked prefill.
			ok := true
			for done := cached; ok && done < len(prompt); {
				done = min(len(prompt), done+1+r.IntN(9))
				ok = compute(l, prompt[:done])
			}
			if !ok {
				remove(len(seqs) - 1)
				preempted++
			} else {
				admitted++
			}
		case op < 16: // decode
			i := r.IntN(len(seqs))
			l := seqs[i]
			if !compute(l, append(slices.Clone(l.toks), int32(r.IntN(3)))) {
				remove(i) // preempted: recompute later
				preempted++
			}
		case op < 19: // finish or abort
			remove(r.IntN(len(seqs)))
		default:
			if r.IntN(10) == 0 {
				p.Clear()
			}
		}
		checkInvariants(t, p, all(), content)
		for _, l := range seqs {
			want := HashBlocks(testSalt, l.toks, bs, nil)
			if !slices.Equal(l.s.Hashes(), want) {
				t.Fatalf("step %d: seq hashes %#x, want %#x", step, l.s.Hashes(), want)
			}
			for b, h := range want {
				if content[l.s.blocks[b]] != h {
					t.Fatalf("step %d: block %d of a sequence holds %#x, want %#x", step, l.s.blocks[b], content[l.s.blocks[b]], h)
				}
			}
		}
		if step%100 == 0 {
			drain()
			snap := p.Snapshot()
			if snap.LastID != m.lastID {
				t.Fatalf("snapshot id %d, replayed to %d", snap.LastID, m.lastID)
			}
			if got := snapshotMap(snap); !maps.Equal(got, m.cache) {
				t.Fatalf("step %d: snapshot (%d) != replay (%d)", step, len(got), len(m.cache))
			}
		}
	}
	for len(seqs) > 0 {
		remove(0)
	}
	checkInvariants(t, p, all(), content)
	st := p.Stats()
	if st.Used != 0 || st.Dropped != 0 || st.Hits != uint64(hits) || st.Hits > st.Queries {
		t.Errorf("final stats %+v (hits seen %d)", st, hits)
	}
	// The workload must have exercised what it claims to.
	if admitted < 500 || preempted == 0 || hits == 0 || st.Evictions == 0 || dups == 0 {
		t.Errorf("weak workload: admitted %d preempted %d hit tokens %d evictions %d duplicates %d",
			admitted, preempted, hits, st.Evictions, dups)
	}
	t.Logf("admitted %d, preempted %d, hit tokens %d of %d, evictions %d, duplicates %d, events %d",
		admitted, preempted, hits, st.Queries, st.Evictions, dups, st.LastEventID)
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
