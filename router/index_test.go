package router

import (
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"tandem/kvcache"
)

const testBlock = 16

var testSalt = kvcache.Salt("Qwen/Qwen3-0.6B", "", "")

// toks returns n token ids starting at base.
func toks(base, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(base + i)
	}
	return t
}

func cat(parts ...[]int32) []int32 { return slices.Concat(parts...) }

func hashes(tokens []int32) []uint64 {
	return kvcache.HashBlocks(testSalt, tokens, testBlock, nil)
}

func stored(id uint64, tier kvcache.Tier, parent uint64, hs ...uint64) kvcache.Event {
	return kvcache.Event{ID: id, Kind: kvcache.EventStored, Tier: tier, Parent: parent, Hashes: hs}
}

func removed(id uint64, tier kvcache.Tier, hs ...uint64) kvcache.Event {
	return kvcache.Event{ID: id, Kind: kvcache.EventRemoved, Tier: tier, Hashes: hs}
}

func cleared(id uint64, tier kvcache.Tier) kvcache.Event {
	return kvcache.Event{ID: id, Kind: kvcache.EventCleared, Tier: tier}
}

func TestIndexApplyGapReset(t *testing.T) {
	h := hashes(toks(0, 5*testBlock)) // 5 chained blocks
	dev := kvcache.TierDevice
	type step struct {
		ev      kvcache.Event
		gap     bool
		last    uint64
		overlap int // worker 1's device overlap with h after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"in order", []step{
			{ev: stored(1, dev, 0, h[0], h[1]), last: 1, overlap: 2},
			{ev: stored(2, dev, h[1], h[2], h[3], h[4]), last: 2, overlap: 5},
			{ev: removed(3, dev, h[4]), last: 3, overlap: 4},
			{ev: removed(4, dev, h[1]), last: 4, overlap: 1}, // a hole cuts the run
			{ev: cleared(5, dev), last: 5, overlap: 0},
		}},
		{"first event not 1 is a gap", []step{
			{ev: stored(7, dev, 0, h[0]), gap: true, last: 0, overlap: 0},
		}},
		{"gap is not applied and repeats", []step{
			{ev: stored(1, dev, 0, h[0]), last: 1, overlap: 1},
			{ev: stored(3, dev, h[0], h[1]), gap: true, last: 1, overlap: 1},
			{ev: stored(4, dev, h[1], h[2]), gap: true, last: 1, overlap: 1},
		}},
		{"stale and duplicate ids ignored", []step{
			{ev: stored(1, dev, 0, h[0]), last: 1, overlap: 1},
			{ev: stored(1, dev, 0, h[0], h[1]), last: 1, overlap: 1},
			{ev: removed(0, dev, h[0]), last: 1, overlap: 1},
			{ev: stored(2, dev, h[0], h[1]), last: 2, overlap: 2},
		}},
		{"unknown kind and tier advance the id", []step{
			{ev: kvcache.Event{ID: 1, Kind: 9, Hashes: h[:1]}, last: 1},
			{ev: stored(2, 12, 0, h[0]), last: 2},
			{ev: stored(3, dev, 0, h[0]), last: 3, overlap: 1},
		}},
		{"removing what is not held is harmless", []step{
			{ev: removed(1, dev, h[0], h[3]), last: 1},
			{ev: stored(2, dev, 0, h[0], h[0]), last: 2, overlap: 1},
			{ev: removed(3, kvcache.TierHost, h[0]), last: 3, overlap: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex()
			for i, s := range tt.steps {
				if gap := x.Apply(1, s.ev); gap != s.gap {
					t.Fatalf("step %d: gap %v, want %v", i, gap, s.gap)
				}
				if last, _ := x.LastID(1); last != s.last {
					t.Fatalf("step %d: last id %d, want %d", i, last, s.last)
				}
				if got := x.Overlap(h)[1]; got != s.overlap {
					t.Fatalf("step %d: overlap %d, want %d", i, got, s.overlap)
				}
			}
		})
	}
}

func TestIndexResetAndRemove(t *testing.T) {
	a := hashes(toks(0, 4*testBlock))
	b := hashes(toks(1000, 3*testBlock))
	x := NewIndex()
	x.Apply(1, stored(1, kvcache.TierDevice, 0, a...))
	x.Apply(2, stored(1, kvcache.TierDevice, 0, a[:2]...))
	if gap := x.Apply(1, stored(5, kvcache.TierDevice, 0, b...)); !gap {
		t.Fatal("no gap reported")
	}
	// The snapshot replaces worker 1's view entirely: a is gone, b is there.
	snap := kvcache.Snapshot{LastID: 5, Tier: kvcache.TierDevice}
	for i, hh := range b {
		p := uint64(0)
		if i > 0 {
			p = b[i-1]
		}
		snap.Blocks = append(snap.Blocks, kvcache.CachedBlock{Hash: hh, Parent: p})
	}
	x.Reset(1, snap)
	if got, want := x.Overlap(a), map[WorkerID]int{2: 2}; !maps.Equal(got, want) {
		t.Fatalf("overlap(a) after reset = %v, want %v", got, want)
	}
	if got, want := x.Overlap(b), map[WorkerID]int{1: 3}; !maps.Equal(got, want) {
		t.Fatalf("overlap(b) after reset = %v, want %v", got, want)
	}
	if x.Apply(1, removed(5, kvcache.TierDevice, b[2])); x.Overlap(b)[1] != 3 {
		t.Fatal("event covered by the snapshot was applied")
	}
	if gap := x.Apply(1, removed(6, kvcache.TierDevice, b[2])); gap || x.Overlap(b)[1] != 2 {
		t.Fatalf("event after the snapshot: gap %v, overlap %d", gap, x.Overlap(b)[1])
	}
	if !x.Behind(1, 7) || x.Behind(1, 6) {
		t.Fatal("Behind wrong")
	}
	x.Compact() // worker 1's entries from before the snapshot
	if x.Len() != 4 || x.Blocks(1) != 2 || x.Blocks(2) != 2 {
		t.Fatalf("len %d, blocks %d %d", x.Len(), x.Blocks(1), x.Blocks(2))
	}

	x.RemoveWorker(1)
	if len(x.Overlap(b)) != 0 || x.Len() != 4 {
		t.Fatalf("worker 1 still indexed: %v, len %d (4 until swept)", x.Overlap(b), x.Len())
	}
	x.Compact()
	if len(x.Overlap(b)) != 0 || x.Len() != 2 {
		t.Fatalf("worker 1 still indexed: %v, len %d", x.Overlap(b), x.Len())
	}
	if _, ok := x.LastID(1); ok {
		t.Fatal("removed worker still has a last id")
	}
	x.RemoveWorker(2)
	x.RemoveWorker(3) // unknown: no-op
	x.Compact()
	if x.Len() != 0 {
		t.Fatalf("index not empty: %d", x.Len())
	}
}

// Overlap across several workers holding chained prefixes of real token
// sequences: a shared system prompt followed by different conversations.
func TestIndexOverlapChained(t *testing.T) {
	sys := toks(1, 4*testBlock)
	convA := cat(sys, toks(500, 3*testBlock))
	convB := cat(sys, toks(900, 2*testBlock))
	prompt := cat(convA, toks(7000, 2*testBlock+5)) // conversation A, next turn
	hA, hB, hp := hashes(convA), hashes(convB), hashes(prompt)
	other := hashes(cat(toks(2, 4*testBlock), toks(500, 3*testBlock))) // same tail, other head

	x := NewIndex()
	x.Apply(1, stored(1, kvcache.TierDevice, 0, hA...))         // all of A
	x.Apply(2, stored(1, kvcache.TierDevice, 0, hB...))         // B shares the system prompt
	x.Apply(3, stored(1, kvcache.TierDevice, 0, hp[1:]...))     // misses block 0: nothing
	x.Apply(4, stored(1, kvcache.TierDevice, 0, other...))      // same tokens later, other prefix
	x.Apply(5, stored(1, kvcache.TierDevice, 0, hA[:2]...))     // first two blocks
	x.Apply(5, stored(2, kvcache.TierDevice, hA[2], hA[3:]...)) // and a later run after a hole
	x.Apply(6, stored(1, kvcache.TierHost, 0, hp...))           // all of it, host tier only
	x.Apply(7, stored(1, kvcache.TierDevice, 0, hp[:3]...))     // device prefix,
	x.Apply(7, stored(2, kvcache.TierHost, hp[2], hp[3:8]...))  // host continuation
	x.Apply(8, stored(1, kvcache.TierDisk, 0, hp...))           // all of it, on disk
	x.Apply(9, stored(1, kvcache.TierRemote, 0, hp[:4]...))     // a shared directory's
	x.Apply(10, stored(1, kvcache.TierDevice, 0, hp[:2]...))    // device,
	x.Apply(10, stored(2, kvcache.TierHost, hp[1], hp[2:4]...)) // host,
	x.Apply(10, stored(3, kvcache.TierDisk, hp[3], hp[4:6]...)) // disk,
	x.Apply(10, stored(4, kvcache.TierRemote, hp[5], hp[6]))    // and remote
	x.Apply(11, stored(1, kvcache.Tier(4), 0, hp...))           // a tier lookups do not count

	if got, want := x.Overlap(hp), map[WorkerID]int{1: len(hA), 2: 4, 5: 2, 7: 3, 10: 2}; !maps.Equal(got, want) {
		t.Fatalf("Overlap = %v, want %v", got, want)
	}
	ms := x.OverlapInto(hp, nil)
	slices.SortFunc(ms, func(a, b Match) int { return cmpID(a.Worker, b.Worker) })
	n := len(hp)
	want := []Match{{1, 7, 7, 7, 7}, {2, 4, 4, 4, 4}, {5, 2, 2, 2, 2}, {6, 0, n, n, n}, {7, 3, 8, 8, 8}, {8, 0, 0, n, n},
		{9, 0, 0, 0, 4}, {10, 2, 4, 6, 7}}
	if !slices.Equal(ms, want) {
		t.Fatalf("OverlapInto = %v, want %v", ms, want)
	}
	if len(x.Overlap(nil)) != 0 || len(x.Overlap(hashes(toks(99999, 64)))) != 0 {
		t.Fatal("overlap of empty or unknown prompt")
	}
}

// The index agrees with a naive per-worker set model on random event streams.
func TestIndexMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const workers, seqs, blocks = 6, 8, 12
	var chains [][]uint64
	for s := range seqs {
		prefix := toks(0, (s%3)*testBlock) // some chains share leading blocks
		chains = append(chains, hashes(cat(prefix, toks(100*s+10, (blocks-s%3)*testBlock))))
	}
	x := NewIndex()
	naive := make([]map[uint64]uint8, workers)
	ids := make([]uint64, workers)
	for i := range naive {
		naive[i] = map[uint64]uint8{}
	}
	children := childrenOf(chains)
	for range 3000 {
		w := rng.IntN(workers)
		tier := kvcache.Tier(w % numLevels) // one tier per worker: what it holds stays prefix-closed
		ids[w]++
		ev := poolEvent(rng, ids[w], tier, chains[rng.IntN(seqs)], naive[w], children)
		if x.Apply(WorkerID(w), ev) {
			t.Fatal("unexpected gap")
		}
		c := chains[rng.IntN(seqs)]
		got := map[WorkerID]Match{}
		for _, m := range x.OverlapInto(c, nil) {
			got[m.Worker] = m
		}
		for w := range workers {
			m := naiveMatch(WorkerID(w), c, naive[w])
			if m.Remote == 0 {
				if g, ok := got[m.Worker]; ok {
					t.Fatalf("worker %d: got %v, want none", w, g)
				}
				continue
			}
			if got[m.Worker] != m {
				t.Fatalf("worker %d: got %v, want %v", w, got[m.Worker], m)
			}
		}
	}
	total := 0
	for w := range workers {
		n := 0
		for _, m := range naive[w] {
			if m != 0 {
				n++
			}
		}
		if x.Blocks(WorkerID(w)) != n {
			t.Fatalf("worker %d: %d blocks, want %d", w, x.Blocks(WorkerID(w)), n)
		}
		total += n
	}
	if total > 0 && x.Len() == 0 {
		t.Fatal("empty index")
	}
}

// Following a real kvcache.Pool's events (with a forced gap and snapshot)
// leaves the index holding exactly the pool's cache.
func TestIndexFollowsPool(t *testing.T) {
	pool := kvcache.NewPool(24, testBlock)
	events, cancel := pool.Subscribe(4096)
	defer cancel()
	x := NewIndex()
	gaps := 0
	drain := func() {
		for {
			select {
			case ev := <-events:
				if x.Apply(1, ev) {
					gaps++
					x.Reset(1, pool.Snapshot())
				}
			default:
				return
			}
		}
	}
	run := func(prompt []int32) {
		s := pool.NewSeq(testSalt)
		n := s.Match(prompt, 1)
		if err := s.Reserve(len(prompt) - n); err != nil {
			t.Fatal(err)
		}
		s.Commit(prompt)
		s.Release()
	}
	sys := toks(1, 3*testBlock)
	for i := range 12 {
		run(cat(sys, toks(100*i, 5*testBlock+3)))
		if i == 6 { // lose an event: the next one shows a gap
			select {
			case <-events:
			default:
				t.Fatal("no event to lose")
			}
		}
		drain()
	}
	if gaps != 1 {
		t.Fatalf("%d gaps, want 1", gaps)
	}
	snap := pool.Snapshot()
	if x.Blocks(1) != len(snap.Blocks) {
		t.Fatalf("index holds %d blocks, pool %d", x.Blocks(1), len(snap.Blocks))
	}
	for _, b := range snap.Blocks {
		if len(x.Overlap([]uint64{b.Hash})) != 1 {
			t.Fatalf("hash %#x missing", b.Hash)
		}
	}
	if last, _ := x.LastID(1); last != pool.Stats().LastEventID {
		t.Fatalf("last id %d, pool %d", last, pool.Stats().LastEventID)
	}
}

// Following tiered pools (device, host, disk and remote, bytes modelled) through their
// events and snapshots: the index holds each pool's blocks of every tier, its block count
// is the pool's Held, and its lookups give each tier level's run as the pools' books do.
// Many workers on few chains make holder sets grow into bitmaps.
func TestIndexFollowsTieredPools(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const workers = 70
	var chains [][]int32
	for s := range 6 {
		chains = append(chains, cat(toks(1, (s%3)*testBlock), toks(1000*(s+1), 6*testBlock+5)))
	}
	type wk struct {
		pool   *kvcache.Pool
		events <-chan kvcache.Event
	}
	ws := make([]wk, workers)
	x := NewIndex()
	for i := range ws {
		p, err := kvcache.NewPoolWith(8+rng.IntN(8), testBlock, kvcache.Options{Tiers: []kvcache.TierConfig{
			{Tier: kvcache.TierHost, Blocks: 2 + rng.IntN(8)}, {Tier: kvcache.TierDisk, Blocks: 4 + rng.IntN(16), MinUses: 1 + rng.IntN(2)},
			{Tier: kvcache.TierRemote, Blocks: 4, MinUses: 2}}, Offload: kvcache.OffloadPolicy(rng.IntN(2))})
		if err != nil {
			t.Fatal(err)
		}
		ev, cancel := p.Subscribe(1 << 12)
		defer cancel()
		ws[i] = wk{p, ev}
	}
	// levels is what a pool's books hold of chain c, level by level.
	levels := func(p *kvcache.Pool, c []uint64) Match {
		snap := p.Snapshot()
		mask := map[uint64]uint8{}
		for _, b := range snap.Blocks {
			mask[b.Hash] |= 1
		}
		for _, ts := range snap.Lower {
			for _, b := range ts.Blocks {
				mask[b.Hash] |= 1 << ts.Tier
			}
		}
		return naiveMatch(0, c, mask)
	}
	for step := range 600 {
		i := rng.IntN(workers)
		p := ws[i].pool
		prompt := chains[rng.IntN(len(chains))]
		s := p.NewSeq(testSalt)
		s.Match(prompt, 1)
		if loads := s.MatchLower(prompt, 1, 1, nil); len(loads) > 0 {
			s.OnboardDone(loads, len(loads), false)
		}
		if s.Reserve(len(prompt)-s.Len()) == nil {
			s.Commit(prompt)
		}
		s.Release()
		for _, tr := range p.TakeTransfers(nil) {
			p.TransferDone(tr, nil)
		}
		for drained := false; !drained; {
			select {
			case ev := <-ws[i].events:
				if x.Apply(WorkerID(i), ev) {
					t.Fatal("gap")
				}
			default:
				drained = true
			}
		}
		if step%50 == 49 {
			w := rng.IntN(workers)
			x.Reset(WorkerID(w), ws[w].pool.Snapshot())
		}
		c := hashes(chains[rng.IntN(len(chains))])
		got := map[WorkerID]Match{}
		for _, m := range x.OverlapInto(c, nil) {
			got[m.Worker] = m
		}
		for w := range workers {
			want := levels(ws[w].pool, c)
			want.Worker = WorkerID(w)
			if g, ok := got[WorkerID(w)]; want.Remote == 0 && ok || want.Remote > 0 && g != want {
				t.Fatalf("step %d: worker %d: got %+v (%v), books say %+v", step, w, g, ok, want)
			}
			if x.Blocks(WorkerID(w)) != ws[w].pool.Stats().Held {
				t.Fatalf("step %d: worker %d: index holds %d blocks, pool %d", step, w, x.Blocks(WorkerID(w)), ws[w].pool.Stats().Held)
			}
		}
	}
}

// With many workers on few chains, holder sets grow past lists into bitmaps and back;
// resets, removals and sweeps retire and reuse slots. The index agrees with a naive model
// throughout.
func TestIndexManyWorkersMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const workers, seqs, blocks = 120, 4, 10
	var chains [][]uint64
	for s := range seqs {
		chains = append(chains, hashes(cat(toks(0, (s%2)*testBlock), toks(100*s+10, (blocks-s%2)*testBlock))))
	}
	x := NewIndex()
	naive := make([]map[uint64]uint8, workers)
	ids := make([]uint64, workers)
	for i := range naive {
		naive[i] = map[uint64]uint8{}
	}
	check := func(step int) {
		t.Helper()
		c := chains[rng.IntN(seqs)]
		got := map[WorkerID]Match{}
		for _, m := range x.OverlapInto(c, nil) {
			if _, dup := got[m.Worker]; dup {
				t.Fatalf("step %d: worker %d matched twice", step, m.Worker)
			}
			got[m.Worker] = m
		}
		for w := range workers {
			m := naiveMatch(WorkerID(w), c, naive[w])
			if g, ok := got[m.Worker]; m.Remote == 0 && ok || m.Remote > 0 && g != m {
				t.Fatalf("step %d: worker %d: got %v (%v), want %v", step, w, g, ok, m)
			}
			n := 0
			for _, mk := range naive[w] {
				if mk != 0 {
					n++
				}
			}
			if x.Blocks(WorkerID(w)) != n {
				t.Fatalf("step %d: worker %d holds %d blocks, want %d", step, w, x.Blocks(WorkerID(w)), n)
			}
		}
	}
	children := childrenOf(chains)
	for step := range 6000 {
		w := rng.IntN(workers)
		tier := kvcache.Tier(w % numLevels)
		c := chains[rng.IntN(seqs)]
		switch r := rng.IntN(100); {
		case r < 1: // a snapshot of part of one chain, in the worker's tier
			n := rng.IntN(len(c))
			ids[w] += 3
			snap := kvcache.Snapshot{LastID: ids[w], Tier: tier}
			clear(naive[w])
			for _, h := range c[:n] {
				snap.Blocks = append(snap.Blocks, kvcache.CachedBlock{Hash: h})
				naive[w][h] = uint8(1) << tier
			}
			x.Reset(WorkerID(w), snap)
		case r < 2:
			x.RemoveWorker(WorkerID(w))
			clear(naive[w])
			ids[w] = 0
		case r < 4:
			x.Sweep(1 + rng.IntN(3000))
		default:
			ids[w]++
			ev := poolEvent(rng, ids[w], tier, c, naive[w], children)
			if x.Apply(WorkerID(w), ev) {
				t.Fatalf("step %d: unexpected gap", step)
			}
		}
		if step%7 == 0 {
			check(step)
			checkFingerprints(t, x)
		}
	}
	check(-1)
	x.Compact()
	check(-2)
	distinct := map[uint64]bool{}
	for w := range workers {
		for h, m := range naive[w] {
			if m != 0 {
				distinct[h] = true
			}
		}
	}
	if x.Len() != len(distinct) {
		t.Fatalf("after Compact: %d hashes, want %d", x.Len(), len(distinct))
	}
}

// Lookups, events of several workers, resets and sweeps at once (run with -race): every
// lookup sees each worker's run as some prefix of its chain, and the end state is exact.
func TestIndexConcurrent(t *testing.T) {
	const workers, blocks = 64, 40
	sys := toks(1, 8*testBlock)
	chain := hashes(cat(sys, toks(1000, (blocks-8)*testBlock)))
	x := NewIndex()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var wk Walk
			var dst []Match
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				dst = x.OverlapWith(&wk, chain[:1+(i+r)%blocks], dst)
				for _, m := range dst {
					if m.Host > blocks || m.Device > m.Host {
						t.Errorf("match %v", m)
						return
					}
				}
			}
		}()
	}
	var writers sync.WaitGroup
	for g := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for w := WorkerID(g); w < workers; w += 4 {
				id := uint64(0)
				for range 50 {
					n := 1 + rng.IntN(blocks)
					id++
					x.Apply(w, stored(id, kvcache.TierDevice, 0, chain[:n]...))
					id++
					x.Apply(w, removed(id, kvcache.TierDevice, chain[rng.IntN(n):n]...))
					if rng.IntN(10) == 0 {
						id += 5
						x.Reset(w, kvcache.Snapshot{LastID: id, Blocks: []kvcache.CachedBlock{{Hash: chain[0]}}})
					}
					x.Sweep(100)
				}
				// End state: worker w holds the first w%blocks+1 blocks.
				id++
				x.Apply(w, removed(id, kvcache.TierDevice, chain...))
				id++
				x.Apply(w, stored(id, kvcache.TierDevice, 0, chain[:int(w)%blocks+1]...))
			}
		}()
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	x.Compact()
	got := x.Overlap(chain)
	for w := range WorkerID(workers) {
		if got[w] != int(w)%blocks+1 || x.Blocks(w) != int(w)%blocks+1 {
			t.Fatalf("worker %d: overlap %d, blocks %d, want %d", w, got[w], x.Blocks(w), int(w)%blocks+1)
		}
	}
	if x.Len() != blocks {
		t.Fatalf("%d hashes, want %d", x.Len(), blocks)
	}
}

// A lookup reads each block under its own shard's lock, at its own moment (walk), so
// that events applied while it walks show in some blocks and not in others. What it
// reports of a worker must still lie between what the worker held at some moment of the
// lookup and what it held at another. Here every worker's holdings of a chain lie, at
// every moment, between its leading lo and hi blocks: an applier widens the bounds to an
// event's outcome before applying it and narrows them after. In a round, growers extend
// their prefix and shrinkers cut theirs from the tail, so the bounds only move one way,
// and a lookup's run for a worker must lie between the least lo and the greatest hi read
// before and after it; the next round swaps the roles. Decisions (the grouped walk) run
// beside them and must not fail.
func TestIndexLookupsDuringEvents(t *testing.T) {
	const workers, blocks, rounds = 160, 256, 6
	chain := make([]uint64, blocks)
	rng := rand.New(rand.NewPCG(5, 8))
	for i := range chain {
		chain[i] = rng.Uint64() | 1
	}
	s := replayState(t, workers)
	x := s.Index()
	type bounds struct{ lo, hi atomic.Int64 }
	b := make([]bounds, workers)
	ids := make([]uint64, workers)
	for w := 1; w < workers; w += 2 { // the first round's shrinkers start with the whole chain
		ids[w]++
		x.Apply(WorkerID(w), stored(ids[w], kvcache.TierDevice, 0, chain...))
		b[w].lo.Store(blocks)
		b[w].hi.Store(blocks)
	}
	var lookedUp, decided atomic.Int64
	for round := range rounds {
		var appliers sync.WaitGroup
		for g := range 2 {
			appliers.Add(1)
			go func() {
				defer appliers.Done()
				rng := rand.New(rand.NewPCG(uint64(g), uint64(round)))
				for busy := true; busy; {
					busy = false
					for w := g; w < workers; w += 2 {
						n := int(b[w].lo.Load())
						if (w%2 == 0) == (round%2 == 0) { // grower
							if n == blocks {
								continue
							}
							m := min(blocks, n+1+rng.IntN(6))
							parent := uint64(0)
							if n > 0 {
								parent = chain[n-1]
							}
							ids[w]++
							b[w].hi.Store(int64(m))
							x.Apply(WorkerID(w), stored(ids[w], kvcache.TierDevice, parent, chain[n:m]...))
							b[w].lo.Store(int64(m))
						} else { // shrinker
							if n == 0 {
								continue
							}
							m := max(0, n-1-rng.IntN(6))
							ids[w]++
							b[w].lo.Store(int64(m))
							x.Apply(WorkerID(w), removed(ids[w], kvcache.TierDevice, chain[m:n]...))
							b[w].hi.Store(int64(m))
						}
						busy = true
					}
				}
			}()
		}
		stop := make(chan struct{})
		var lookups sync.WaitGroup
		// untilStop runs step(0), step(1), … on a goroutine of its own until stop is closed
		// or step returns false.
		untilStop := func(step func(i int) bool) {
			lookups.Add(1)
			go func() {
				defer lookups.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if !step(i) {
						return
					}
				}
			}()
		}
		// A writer that takes each shard's lock in turn and holds it a little, as an
		// event's chunk does, so that most walks go by probes (a walk holds every shard's
		// read lock while no writer holds or wants one).
		untilStop(func(i int) bool {
			sh := &x.shards[i%numShards]
			sh.lock(x.spins)
			for range 200 {
				spinPause()
			}
			sh.mu.Unlock()
			return true
		})
		for r := range 2 {
			var wk Walk
			var dst []Match
			lo, hi := make([]int64, workers), make([]int64, workers)
			seen := make([]bool, workers)
			untilStop(func(i int) bool {
				n := 1 + (i*37+r*101)%blocks
				for w := range b {
					lo[w], hi[w] = b[w].lo.Load(), b[w].hi.Load()
				}
				dst = x.OverlapWith(&wk, chain[:n], dst)
				for w := range b {
					lo[w], hi[w] = min(lo[w], b[w].lo.Load()), max(hi[w], b[w].hi.Load())
				}
				lookedUp.Add(1)
				clear(seen)
				for _, m := range dst {
					w := int(m.Worker)
					if w >= workers || seen[w] {
						t.Errorf("lookup of %d blocks: unknown or repeated worker in %v", n, m)
						return false
					}
					seen[w] = true
					if m.Device != m.Host || m.Host != m.Disk || m.Disk != m.Remote {
						t.Errorf("lookup of %d blocks: %v, device tier only", n, m)
						return false
					}
					if got := int64(m.Device); got < min(lo[w], int64(n)) || got > min(hi[w], int64(n)) {
						t.Errorf("lookup of %d blocks: worker %d run %d, held between %d and %d", n, w, got, lo[w], hi[w])
						return false
					}
				}
				for w := range seen {
					if !seen[w] && lo[w] > 0 {
						t.Errorf("lookup of %d blocks: worker %d missing, held at least %d", n, w, lo[w])
						return false
					}
				}
				return true
			})
		}
		untilStop(func(i int) bool {
			n := 1 + (i*53)%blocks
			d, err := s.Decide(Request{Hashes: chain[:n], PromptTokens: n * replayBlock})
			if err != nil {
				t.Errorf("decide: %v", err)
				return false
			}
			s.RemoveInflight(d.Inflight)
			decided.Add(1)
			return true
		})
		appliers.Wait()
		close(stop)
		lookups.Wait()
		if t.Failed() {
			return
		}
	}
	got := x.Overlap(chain)
	for w := range WorkerID(workers) {
		if want := int(b[w].lo.Load()); got[w] != want || x.Blocks(w) != want {
			t.Errorf("worker %d at the end: overlap %d, blocks %d, want %d", w, got[w], x.Blocks(w), want)
		}
	}
	t.Logf("%d lookups, %d decisions beside the events", lookedUp.Load(), decided.Load())
}

// naiveMatch is worker w's Match of chain c in the naive model (hash → tier mask): each
// level's leading run of blocks held in the tiers up to it.
func naiveMatch(w WorkerID, c []uint64, naive map[uint64]uint8) Match {
	m := Match{Worker: w}
	for t := range numLevels {
		n := 0
		for n < len(c) && naive[c[n]]&(uint8(1)<<(t+1)-1) != 0 {
			n++
		}
		m.setRun(t, n)
	}
	return m
}

// checkFingerprints recomputes every holder set's fingerprint.
func checkFingerprints(t *testing.T, x *Index) {
	t.Helper()
	for si := range x.shards {
		sh := &x.shards[si]
		for i, hs := range sh.sets {
			if hs.list == nil && hs.bits == nil {
				continue // free
			}
			var fp uint64
			for _, h := range hs.list {
				fp ^= holderFP(h)
			}
			if b := hs.bits; b != nil {
				n, upper := 0, 0
				for w := range b.tier[0] {
					for rest := b.any(w); rest != 0; rest &= rest - 1 {
						slot := uint32(w*64 + bits.TrailingZeros64(rest))
						fp ^= holderFP(holder(slot, b.mask(slot)))
						n++
						if b.mask(slot)&^devBit != 0 {
							upper++
						}
					}
				}
				if n != b.n || upper != b.upper {
					t.Fatalf("shard %d set %d: %d holders, %d above the device; counted %d, %d", si, i, b.n, b.upper, n, upper)
				}
			}
			if fp != hs.fp {
				t.Fatalf("shard %d set %d: fingerprint %#x, recomputed %#x", si, i, hs.fp, fp)
			}
		}
	}
}

// childrenOf maps each block of the chains to the blocks that follow it in some chain.
func childrenOf(chains [][]uint64) map[uint64][]uint64 {
	ch := map[uint64][]uint64{}
	for _, c := range chains {
		for i := 1; i < len(c); i++ {
			if !slices.Contains(ch[c[i-1]], c[i]) {
				ch[c[i-1]] = append(ch[c[i-1]], c[i])
			}
		}
	}
	return ch
}

// poolEvent is a random event id of a worker holding held (hash → tier mask, one tier),
// which it applies to held, made as a pool makes them: what the worker holds of a chain
// stays a prefix (the index's lookups rely on it, see nextChange). Stored adds a prefix of
// c; Removed evicts leaves from the end of c's held prefix (blocks no held block follows);
// Cleared empties the tier.
func poolEvent(rng *rand.Rand, id uint64, tier kvcache.Tier, c []uint64, held map[uint64]uint8, children map[uint64][]uint64) kvcache.Event {
	bit := uint8(1) << tier
	ev := kvcache.Event{ID: id, Tier: tier}
	switch r := rng.IntN(20); {
	case r < 11:
		ev.Kind = kvcache.EventStored
		n := 1 + rng.IntN(len(c))
		from := rng.IntN(n) // the event names only the new part, as a pool's does
		for from > 0 && held[c[from-1]]&bit == 0 {
			from--
		}
		ev.Hashes = c[from:n]
		for _, h := range ev.Hashes {
			held[h] |= bit
		}
	case r < 19:
		ev.Kind = kvcache.EventRemoved
		end := 0
		for end < len(c) && held[c[end]]&bit != 0 {
			end++
		}
		for k := 1 + rng.IntN(len(c)); k > 0 && end > 0; k-- {
			h := c[end-1]
			if slices.ContainsFunc(children[h], func(ch uint64) bool { return held[ch]&bit != 0 }) {
				break // not a leaf
			}
			held[h] &^= bit
			ev.Hashes = append(ev.Hashes, h)
			end--
		}
	default:
		ev.Kind = kvcache.EventCleared
		for h := range held {
			held[h] &^= bit
		}
	}
	return ev
}

// Lookups assume that what a worker holds of a chain is a prefix of it, as a pool's cache
// always is (nextChange): a hole at the start of a stretch of blocks with the same holders
// ends the run, one deep inside such a stretch is jumped over. This test pins both, so that
// a change of the trade-off is a decision.
func TestIndexRunsAssumePrefixes(t *testing.T) {
	h := hashes(toks(0, 64*testBlock))
	x := NewIndex()
	x.Apply(1, stored(1, kvcache.TierDevice, 0, h...))
	x.Apply(1, removed(2, kvcache.TierDevice, h[1]))
	if got := x.Overlap(h)[1]; got != 1 {
		t.Errorf("hole at block 1: overlap %d, want 1", got)
	}
	x.Apply(1, stored(3, kvcache.TierDevice, h[0], h[1]))
	x.Apply(1, removed(4, kvcache.TierDevice, h[37]))
	if got := x.Overlap(h)[1]; got != 64 {
		t.Errorf("hole at block 37 of 64 held by the same worker: overlap %d, want 64 (jumped over)", got)
	}
}

// unFP inverts holderFP for every holder a lookup counts, and names no holder for the XOR
// of two holders' shares (a block that lost two holders, or changed one's tiers).
func TestUnFP(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 100000 {
		h := holder(uint32(rng.IntN(maxSlots)), uint8(1+rng.IntN(int(usedBits))))
		got, ok := unFP(holderFP(h))
		if !ok || got != h {
			t.Fatalf("unFP(holderFP(%#x)) = %#x, %v", h, got, ok)
		}
		h2 := holder(uint32(rng.IntN(maxSlots)), uint8(1+rng.IntN(int(usedBits))))
		if h2 == h {
			continue
		}
		if got, ok := unFP(holderFP(h) ^ holderFP(h2)); ok {
			t.Fatalf("unFP of two holders %#x, %#x names %#x", h, h2, got)
		}
	}
}

// Applying an event's hashes in batches of shards (updateAll, with its inline cases) leaves
// the index as applying them one at a time does: events of up to several thousand hashes
// (more than applyChunk in one shard), hash 0, hashes stored again in another tier,
// removed when absent, and blocks held by one worker, by a few (lists) and by many
// (bitmaps).
func TestIndexBatchesMatchSingles(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 17))
	const workers = 60
	pool := []uint64{0}
	for range 40000 {
		pool = append(pool, rng.Uint64())
	}
	shared := pool[:200] // held by many workers: lists, then bitmaps
	batched, single := NewIndex(), NewIndex()
	ids := make([]uint64, workers)
	singleIDs := make([]uint64, workers)
	stored := make([][]uint64, workers) // what each worker was sent, to remove from
	for range 400 {
		w := rng.IntN(workers)
		kind := kvcache.EventStored
		if rng.IntN(3) == 0 && len(stored[w]) > 0 {
			kind = kvcache.EventRemoved
		}
		var hs []uint64
		n := 1 + rng.IntN(600)
		if rng.IntN(20) == 0 {
			n = 4200 + rng.IntN(2000)
		}
		for range n {
			switch r := rng.IntN(8); {
			case kind == kvcache.EventRemoved && r > 0:
				hs = append(hs, stored[w][rng.IntN(len(stored[w]))])
			case r < 2:
				hs = append(hs, shared[rng.IntN(len(shared))])
			default:
				hs = append(hs, pool[rng.IntN(len(pool))])
			}
		}
		if kind == kvcache.EventStored {
			stored[w] = append(stored[w], hs...)
		}
		tier := kvcache.Tier(rng.IntN(3))
		ids[w]++
		if batched.Apply(WorkerID(w), kvcache.Event{ID: ids[w], Kind: kind, Tier: tier, Hashes: hs}) {
			t.Fatal("gap")
		}
		for _, h := range hs {
			singleIDs[w]++
			if single.Apply(WorkerID(w), kvcache.Event{ID: singleIDs[w], Kind: kind, Tier: tier, Hashes: []uint64{h}}) {
				t.Fatal("gap")
			}
		}
	}
	if batched.Len() != single.Len() {
		t.Fatalf("Len %d, want %d", batched.Len(), single.Len())
	}
	for w := range WorkerID(workers) {
		if batched.Blocks(w) != single.Blocks(w) {
			t.Fatalf("worker %d: %d blocks, want %d", w, batched.Blocks(w), single.Blocks(w))
		}
	}
	byWorker := func(a, b Match) int { return int(a.Worker) - int(b.Worker) }
	var got, want []Match
	for _, h := range pool {
		got = slices.SortedFunc(slices.Values(batched.OverlapInto([]uint64{h}, got)), byWorker)
		want = slices.SortedFunc(slices.Values(single.OverlapInto([]uint64{h}, want)), byWorker)
		if !slices.Equal(got, want) {
			t.Fatalf("hash %#x: holders %v, want %v", h, got, want)
		}
	}
}

// Clearing one tier of a worker that holds blocks in others too walks the tables
// (clearTier): it leaves the index as if the worker had only ever stored the other tiers'
// blocks, with hash 0, blocks held by it alone, by a few and by many.
func TestIndexClearOneOfTiers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	const workers = 70
	pool := []uint64{0}
	for range 3000 {
		pool = append(pool, rng.Uint64())
	}
	got, want := NewIndex(), NewIndex()
	ids := make([]uint64, workers)
	wantIDs := make([]uint64, workers)
	for w := range workers {
		for _, tier := range []kvcache.Tier{kvcache.TierDevice, kvcache.TierHost} {
			var hs []uint64
			for range 200 {
				if rng.IntN(3) == 0 {
					hs = append(hs, pool[rng.IntN(100)]) // shared: lists, then bitmaps
				} else {
					hs = append(hs, pool[rng.IntN(len(pool))])
				}
			}
			ids[w]++
			got.Apply(WorkerID(w), kvcache.Event{ID: ids[w], Kind: kvcache.EventStored, Tier: tier, Hashes: hs})
			if w%2 == 0 && tier == kvcache.TierHost {
				continue // cleared below
			}
			wantIDs[w]++
			want.Apply(WorkerID(w), kvcache.Event{ID: wantIDs[w], Kind: kvcache.EventStored, Tier: tier, Hashes: hs})
		}
	}
	for w := 0; w < workers; w += 2 {
		ids[w]++
		got.Apply(WorkerID(w), cleared(ids[w], kvcache.TierHost))
	}
	for w := range WorkerID(workers) {
		if got.Blocks(w) != want.Blocks(w) {
			t.Fatalf("worker %d: %d blocks, want %d", w, got.Blocks(w), want.Blocks(w))
		}
	}
	byWorker := func(a, b Match) int { return int(a.Worker) - int(b.Worker) }
	var g, wa []Match
	for _, h := range pool {
		g = slices.SortedFunc(slices.Values(got.OverlapInto([]uint64{h}, g)), byWorker)
		wa = slices.SortedFunc(slices.Values(want.OverlapInto([]uint64{h}, wa)), byWorker)
		if !slices.Equal(g, wa) {
			t.Fatalf("hash %#x: holders %v, want %v", h, g, wa)
		}
	}
}
