package kvcache

import (
	"errors"
	"slices"
	"testing"
)

const testSalt = 0x5EED

// run admits prompt as the engine would: match (leaving 1 token), reserve the
// rest, "compute" it and commit it.
func run(t *testing.T, p *Pool, prompt []int32) *Seq {
	t.Helper()
	s := p.NewSeq(testSalt)
	cached := s.Match(prompt, 1)
	if err := s.Reserve(len(prompt) - cached); err != nil {
		t.Fatalf("Reserve(%d): %v", len(prompt)-cached, err)
	}
	s.Commit(prompt)
	return s
}

// tokens returns n tokens starting at first.
func tokens(first int32, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = first + int32(i)
	}
	return t
}

func wantStats(t *testing.T, p *Pool, used, cached, free int) {
	t.Helper()
	st := p.Stats()
	if st.Used != used || st.Cached != cached || st.Free != free {
		t.Errorf("used/cached/free = %d/%d/%d, want %d/%d/%d", st.Used, st.Cached, st.Free, used, cached, free)
	}
	if st.Used+st.Cached+st.Free != st.Blocks {
		t.Errorf("used+cached+free = %d, want %d", st.Used+st.Cached+st.Free, st.Blocks)
	}
}

func TestReserveSlotsAndRelease(t *testing.T) {
	p := NewPool(4, 4)
	s := p.NewSeq(testSalt)
	if err := s.Reserve(6); err != nil {
		t.Fatal(err)
	}
	if got := s.Blocks(); !slices.Equal(got, []int32{0, 1}) {
		t.Fatalf("blocks %v, want [0 1]", got)
	}
	for _, tt := range []struct {
		pos   int
		block int32
		off   int
	}{{0, 0, 0}, {3, 0, 3}, {4, 1, 0}, {7, 1, 3}} {
		if b, off := s.Slot(tt.pos); b != tt.block || off != tt.off {
			t.Errorf("Slot(%d) = %d, %d; want %d, %d", tt.pos, b, off, tt.block, tt.off)
		}
	}
	if s.Cap() != 8 || s.Len() != 0 {
		t.Errorf("Cap, Len = %d, %d; want 8, 0", s.Cap(), s.Len())
	}
	wantStats(t, p, 2, 0, 2)
	if u := p.Usage(); u != 0.5 {
		t.Errorf("Usage = %v, want 0.5", u)
	}
	// Room in the reserved blocks: no new block.
	if err := s.Reserve(8); err != nil || len(s.Blocks()) != 2 {
		t.Errorf("Reserve(8) = %v with %d blocks, want nil with 2", err, len(s.Blocks()))
	}
	// Too many: nothing taken.
	if err := s.Reserve(17); !errors.Is(err, ErrNoBlocks) {
		t.Errorf("Reserve(17) = %v, want ErrNoBlocks", err)
	}
	wantStats(t, p, 2, 0, 2)
	if err := s.Reserve(16); err != nil || len(s.Blocks()) != 4 {
		t.Errorf("Reserve(16) = %v with %d blocks, want nil with 4", err, len(s.Blocks()))
	}
	wantStats(t, p, 4, 0, 0)
	s.Commit(tokens(0, 6)) // one full block: cached
	s.Release()
	wantStats(t, p, 0, 1, 3)
	if s.Len() != 0 || len(s.Blocks()) != 0 {
		t.Errorf("after Release: Len %d, %d blocks", s.Len(), len(s.Blocks()))
	}
}

func TestCommitPanicsOutsideReservation(t *testing.T) {
	p := NewPool(4, 4)
	s := p.NewSeq(testSalt)
	if err := s.Reserve(4); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("Commit past Cap did not panic")
		}
	}()
	s.Commit(tokens(0, 5))
}

func TestPrefixMatchReusesBlocks(t *testing.T) {
	p := NewPool(16, 4)
	prompt := tokens(100, 14) // 3 full blocks + 2
	a := run(t, p, prompt)
	aBlocks := slices.Clone(a.Blocks())
	if !slices.Equal(a.Hashes(), HashBlocks(testSalt, prompt, 4, nil)) {
		t.Errorf("Hashes %#x, want HashBlocks of the prompt", a.Hashes())
	}

	// While a holds them, b shares them.
	b := p.NewSeq(testSalt)
	if got := b.Match(prompt, 1); got != 12 {
		t.Fatalf("Match = %d, want 12", got)
	}
	if !slices.Equal(b.Blocks(), aBlocks[:3]) {
		t.Errorf("b blocks %v, want %v", b.Blocks(), aBlocks[:3])
	}
	for _, id := range aBlocks[:3] {
		if r := p.blocks[id].ref; r != 2 {
			t.Errorf("block %d ref %d, want 2", id, r)
		}
	}
	if b.Len() != 12 {
		t.Errorf("Len = %d", b.Len())
	}
	// b diverges after the shared prefix: its 4th block is its own.
	if err := b.Reserve(2); err != nil {
		t.Fatal(err)
	}
	if b.Blocks()[3] == aBlocks[3] {
		t.Error("b's partial block is a's")
	}
	st := p.Stats()
	if st.Queries != 28 || st.Hits != 12 {
		t.Errorf("queries/hits = %d/%d, want 28/12", st.Queries, st.Hits)
	}

	// After both leave, a third request still hits.
	a.Release()
	b.Release()
	wantStats(t, p, 0, 3, 13)
	c := p.NewSeq(testSalt)
	if got := c.Match(append(slices.Clone(prompt[:8]), 7, 7, 7, 7, 7), 1); got != 8 {
		t.Errorf("diverging prompt Match = %d, want 8", got)
	}
	if !slices.Equal(c.Blocks(), aBlocks[:2]) {
		t.Errorf("c blocks %v, want %v", c.Blocks(), aBlocks[:2])
	}
	// Another salt (LoRA, namespace) shares nothing.
	d := p.NewSeq(testSalt + 1)
	if got := d.Match(prompt, 1); got != 0 {
		t.Errorf("other salt Match = %d, want 0", got)
	}
}

func TestMatchLeavesTokensToCompute(t *testing.T) {
	p := NewPool(16, 4)
	run(t, p, tokens(0, 16)).Release() // 4 cached blocks
	tests := []struct {
		n, keep, want int
	}{
		{16, 1, 12}, // whole prompt cached: the last block is recomputed
		{16, 0, 16},
		{13, 1, 12},
		{12, 1, 8},
		{16, 5, 8},
		{16, 16, 0},
		{16, 100, 0},
		{3, 1, 0},
		{0, 1, 0},
	}
	for _, tt := range tests {
		s := p.NewSeq(testSalt)
		if got := s.Match(tokens(0, tt.n), tt.keep); got != tt.want || s.Len() != tt.want {
			t.Errorf("Match(%d tokens, keep %d) = %d (Len %d), want %d", tt.n, tt.keep, got, s.Len(), tt.want)
		}
		if tt.n-tt.want < min(tt.keep, tt.n) {
			t.Errorf("Match(%d, keep %d) left %d to compute", tt.n, tt.keep, tt.n-tt.want)
		}
		s.Release()
	}
}

func TestMatchOnNonEmptySeqPanics(t *testing.T) {
	p := NewPool(4, 4)
	s := p.NewSeq(testSalt)
	if err := s.Reserve(1); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	s.Match(tokens(0, 8), 1)
}

// Two sequences compute the same prefix at once: one copy becomes canonical,
// the other stays private and is freed on release.
func TestDuplicateCommit(t *testing.T) {
	p := NewPool(8, 4)
	events, cancel := p.Subscribe(16)
	defer cancel()
	prompt := tokens(0, 9)
	a, b := p.NewSeq(testSalt), p.NewSeq(testSalt)
	for _, s := range []*Seq{a, b} {
		if got := s.Match(prompt, 1); got != 0 {
			t.Fatalf("Match = %d", got)
		}
		if err := s.Reserve(len(prompt)); err != nil {
			t.Fatal(err)
		}
	}
	a.Commit(prompt)
	b.Commit(prompt)
	aBlocks := slices.Clone(a.Blocks())
	if ev := <-events; ev.Kind != EventStored || len(ev.Hashes) != 2 {
		t.Errorf("first event %+v, want Stored of 2", ev)
	}
	select {
	case ev := <-events:
		t.Errorf("duplicate commit emitted %+v", ev)
	default:
	}
	for i, h := range HashBlocks(testSalt, prompt, 4, nil) {
		if id := p.index[h]; id != aBlocks[i] {
			t.Errorf("hash %d maps to block %d, want a's %d", i, id, aBlocks[i])
		}
	}
	wantStats(t, p, 6, 0, 2)
	b.Release() // b's copies are private: freed
	wantStats(t, p, 3, 0, 5)
	a.Release()
	wantStats(t, p, 0, 2, 6)
	// The canonical copies serve later requests.
	c := p.NewSeq(testSalt)
	if c.Match(prompt, 1) != 8 || !slices.Equal(c.Blocks(), aBlocks[:2]) {
		t.Errorf("c matched %v, want a's %v", c.Blocks(), aBlocks[:2])
	}
}

// evicted fills the pool's free blocks, then reserves one block at a time and
// reports which cached hashes each reservation evicted.
func evicted(t *testing.T, p *Pool, n int) [][]uint64 {
	t.Helper()
	events, cancel := p.Subscribe(64)
	defer cancel()
	hold := p.NewSeq(1)
	if err := hold.Reserve(len(p.free) * p.blockSize); err != nil {
		t.Fatal(err)
	}
	var out [][]uint64
	for range n {
		if err := hold.Reserve(hold.Cap() - hold.Len() + 1); err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		select {
		case ev := <-events:
			if ev.Kind != EventRemoved {
				t.Fatalf("event %v, want removed", ev.Kind)
			}
			out = append(out, ev.Hashes)
		default:
			t.Fatal("no Removed event")
		}
	}
	return out
}

func TestEvictionIsLRU(t *testing.T) {
	p := NewPool(8, 4)
	var h [3]uint64
	for i := range h {
		s := run(t, p, tokens(int32(100*i), 5))
		h[i] = s.Hashes()[0]
		s.Release() // released in order 0, 1, 2
	}
	// Touch 0: now 1 is the least recently used.
	s := p.NewSeq(testSalt)
	if s.Match(tokens(0, 5), 1) != 4 {
		t.Fatal("no hit")
	}
	s.Release()
	got := evicted(t, p, 3)
	want := [][]uint64{{h[1]}, {h[2]}, {h[0]}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("evicted %#x, want %#x", got, want)
	}
	if st := p.Stats(); st.Evictions != 3 || st.Cached != 0 {
		t.Errorf("evictions %d cached %d, want 3, 0", st.Evictions, st.Cached)
	}
	if s.Match(tokens(0, 5), 1) != 0 {
		t.Error("evicted block still matches")
	}
}

func TestEvictionPrefersLeaves(t *testing.T) {
	t.Run("chain", func(t *testing.T) {
		// An old chain a1→a2→a3 and a newer single block b: the chain is
		// eaten from its leaf up, before b.
		p := NewPool(8, 4)
		a := run(t, p, tokens(0, 13))
		ha := slices.Clone(a.Hashes())
		a.Release()
		b := run(t, p, tokens(1000, 5))
		hb := b.Hashes()[0]
		b.Release()
		got := evicted(t, p, 4)
		want := [][]uint64{{ha[2]}, {ha[1]}, {ha[0]}, {hb}}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("evicted %#x, want %#x", got, want)
		}
	})
	t.Run("older parent", func(t *testing.T) {
		// x holds the canonical first block; y computed it privately and
		// committed the second block under it. x leaves first, so the parent
		// is older than its child: plain LRU would evict the parent and
		// strand the child. Leaf-first evicts the child.
		p := NewPool(8, 4)
		prompt := tokens(0, 9)
		x, y := p.NewSeq(testSalt), p.NewSeq(testSalt)
		x.Match(prompt, 1)
		y.Match(prompt, 1)
		if x.Reserve(4) != nil || y.Reserve(9) != nil {
			t.Fatal("reserve")
		}
		x.Commit(prompt[:4])
		y.Commit(prompt)
		h := HashBlocks(testSalt, prompt, 4, nil)
		x.Release()
		y.Release()
		got := evicted(t, p, 2)
		want := [][]uint64{{h[1]}, {h[0]}}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("evicted %#x, want %#x", got, want)
		}
	})
}

func TestEvictInnerWhenNoLeaf(t *testing.T) {
	p := NewPool(4, 4)
	prompt := tokens(0, 9)
	// x and y both compute block 0; x's copy is canonical, y's private.
	x, y := p.NewSeq(testSalt), p.NewSeq(testSalt)
	x.Match(prompt, 1)
	y.Match(prompt, 1)
	if x.Reserve(4) != nil || y.Reserve(9) != nil {
		t.Fatal("reserve")
	}
	x.Commit(prompt[:4])
	y.Commit(prompt) // y's block 1 is cached, child of x's block 0
	x.Release()      // x's block 0: evictable, with a cached (held) child
	wantStats(t, p, 3, 1, 0)
	z := p.NewSeq(testSalt + 1)
	if err := z.Reserve(4); err != nil {
		t.Fatalf("Reserve with only an inner block evictable: %v", err)
	}
	if _, ok := p.index[HashBlocks(testSalt, prompt, 4, nil)[0]]; ok {
		t.Error("parent still cached")
	}
	y.Release() // the stranded child must not corrupt the tree
	z.Release()
	checkInvariants(t, p, nil)
}

func TestErrNoBlocksCountsEvictable(t *testing.T) {
	p := NewPool(4, 4)
	run(t, p, tokens(0, 8)).Release() // 2 cached
	hold := p.NewSeq(2)
	if err := hold.Reserve(4); err != nil { // 1 used, 2 cached, 1 free
		t.Fatal(err)
	}
	s := p.NewSeq(3)
	if err := s.Reserve(13); !errors.Is(err, ErrNoBlocks) {
		t.Errorf("Reserve(4 blocks) = %v, want ErrNoBlocks", err)
	}
	wantStats(t, p, 1, 2, 1)
	if err := s.Reserve(12); err != nil {
		t.Errorf("Reserve(3 blocks) = %v, want nil (1 free + 2 evictable)", err)
	}
	wantStats(t, p, 4, 0, 0)
	if err := p.NewSeq(4).Reserve(1); !errors.Is(err, ErrNoBlocks) {
		t.Errorf("full pool: %v", err)
	}
}

func TestClear(t *testing.T) {
	p := NewPool(8, 4)
	run(t, p, tokens(0, 8)).Release()
	held := run(t, p, tokens(100, 8))
	events, cancel := p.Subscribe(4)
	defer cancel()
	p.Clear()
	if ev := <-events; ev.Kind != EventCleared || ev.ID != 3 {
		t.Errorf("event %+v, want Cleared id 3", ev)
	}
	if n := len(p.Snapshot().Blocks); n != 0 {
		t.Errorf("%d blocks cached after Clear", n)
	}
	wantStats(t, p, 2, 0, 6)
	if s := p.NewSeq(testSalt); s.Match(tokens(0, 8), 0) != 0 {
		t.Error("match after Clear")
	}
	held.Release()
	wantStats(t, p, 0, 0, 8)
	checkInvariants(t, p, nil)
}

func TestMatchHashes(t *testing.T) {
	p := NewPool(8, 4)
	salt := Salt("m", "", "")
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	s := p.NewSeq(salt)
	s.Match(tokens, 1)
	if err := s.Reserve(len(tokens)); err != nil {
		t.Fatal(err)
	}
	s.Commit(tokens)
	before := p.Stats()
	hs := HashBlocks(salt, append(tokens, 11, 12, 13, 14), 4, nil) // 3 full blocks, 2 cached
	e := p.NewSeq(salt)
	if n := e.MatchHashes(hs); n != 8 || len(e.Blocks()) != 2 || e.Blocks()[1] != s.Blocks()[1] {
		t.Fatalf("MatchHashes: %d tokens, blocks %v (the sequence's %v)", n, e.Blocks(), s.Blocks())
	}
	if after := p.Stats(); after.Queries != before.Queries || after.Hits != before.Hits {
		t.Errorf("MatchHashes counted prefix queries: %+v then %+v", before, after)
	}
	s.Release()
	if p.Stats().Used != 2 {
		t.Errorf("the export's references do not hold the blocks: %+v", p.Stats())
	}
	e.Release()
	if st := p.Stats(); st.Used != 0 || st.Cached != 2 {
		t.Errorf("after release: %+v", st)
	}
}

// Trim gives back the blocks reserved past Len and keeps the written ones.
func TestTrimFreesUnwrittenBlocks(t *testing.T) {
	p := NewPool(8, 4)
	s := p.NewSeq(testSalt)
	if err := s.Reserve(20); err != nil { // 5 blocks
		t.Fatal(err)
	}
	prompt := tokens(1, 8)
	s.Commit(prompt[:6]) // one full block, one partial
	wantStats(t, p, 5, 0, 3)
	s.Trim()
	wantStats(t, p, 2, 0, 6)
	if len(s.Blocks()) != 2 || s.Cap() != 8 {
		t.Fatalf("after Trim: %d blocks, cap %d; want 2 and 8", len(s.Blocks()), s.Cap())
	}
	s.Trim() // nothing past Len: a no-op
	wantStats(t, p, 2, 0, 6)
	s.Commit(prompt) // the kept partial block still takes its tokens
	s.Release()
	wantStats(t, p, 0, 2, 6)
	if got := p.NewSeq(testSalt).Match(prompt, 0); got != 8 {
		t.Errorf("the written blocks are not cached: matched %d of 8", got)
	}
}
