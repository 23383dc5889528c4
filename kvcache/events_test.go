package kvcache

import (
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
)

func next(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	default:
		t.Fatal("no event")
		return Event{}
	}
}

func TestEvents(t *testing.T) {
	p := NewPool(4, 4)
	ch, cancel := p.Subscribe(16)
	defer cancel()
	toks := tokens(0, 13)
	h := HashBlocks(testSalt, toks, 4, nil)

	// Prefill of 3 full blocks and a partial one: one Stored event.
	s := p.NewSeq(testSalt)
	s.Match(toks, 1)
	if err := s.Reserve(13); err != nil {
		t.Fatal(err)
	}
	s.Commit(toks)
	// Decode until block 3 fills: a Stored event naming its parent.
	for len(toks) < 16 {
		toks = append(toks, 99)
		s.Commit(toks)
	}
	h = HashBlocks(testSalt, toks, 4, nil)
	s.Release()
	// A new sequence evicts two blocks, leaf first.
	if err := p.NewSeq(testSalt + 1).Reserve(8); err != nil {
		t.Fatal(err)
	}
	p.Clear()

	want := []Event{
		{ID: 1, Kind: EventStored, Parent: 0, Hashes: h[:3]},
		{ID: 2, Kind: EventStored, Parent: h[2], Hashes: h[3:4]},
		{ID: 3, Kind: EventRemoved, Hashes: []uint64{h[3], h[2]}},
		{ID: 4, Kind: EventCleared},
	}
	for _, w := range want {
		got := next(t, ch)
		if got.ID != w.ID || got.Kind != w.Kind || got.Parent != w.Parent ||
			got.Tier != TierDevice || !slices.Equal(got.Hashes, w.Hashes) {
			t.Errorf("event %+v, want %+v", got, w)
		}
	}
	select {
	case ev := <-ch:
		t.Errorf("unexpected %+v", ev)
	default:
	}
	if st := p.Stats(); st.LastEventID != 4 || st.Evictions != 2 {
		t.Errorf("LastEventID %d evictions %d, want 4, 2", st.LastEventID, st.Evictions)
	}
}

// Events are numbered whether or not anybody listens, so a late subscriber
// joins with a snapshot.
func TestEventIDsWithoutSubscribers(t *testing.T) {
	p := NewPool(8, 4)
	run(t, p, tokens(0, 9)).Release()
	run(t, p, tokens(50, 5)).Release()
	snap := p.Snapshot()
	if snap.LastID != 2 || len(snap.Blocks) != 3 || snap.Tier != TierDevice {
		t.Fatalf("snapshot %+v", snap)
	}
	m := &mirror{}
	m.resync(snap)
	ch, cancel := p.Subscribe(4)
	defer cancel()
	run(t, p, tokens(0, 13))
	if err := m.apply(next(t, ch)); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(m.cache, snapshotMap(p.Snapshot())) {
		t.Error("snapshot + events != snapshot")
	}
}

func TestSlowSubscriberDropsEvents(t *testing.T) {
	p := NewPool(16, 4)
	slow, cancelSlow := p.Subscribe(1)
	defer cancelSlow()
	fast, cancelFast := p.Subscribe(8)
	defer cancelFast()
	for i := range 3 {
		run(t, p, tokens(int32(100*i), 4)).Release() // one event each
	}
	if ev := next(t, slow); ev.ID != 1 {
		t.Errorf("slow got %d, want 1", ev.ID)
	}
	run(t, p, tokens(400, 4)).Release()
	if ev := next(t, slow); ev.ID != 4 {
		t.Errorf("slow got %d after the gap, want 4", ev.ID)
	}
	for id := uint64(1); id <= 4; id++ {
		if ev := next(t, fast); ev.ID != id {
			t.Errorf("fast got %d, want %d", ev.ID, id)
		}
	}
	if d := p.Stats().Dropped; d != 2 {
		t.Errorf("Dropped = %d, want 2", d)
	}
}

func TestCancelClosesChannel(t *testing.T) {
	p := NewPool(4, 4)
	ch, cancel := p.Subscribe(4)
	cancel()
	cancel() // idempotent
	if _, ok := <-ch; ok {
		t.Error("channel open after cancel")
	}
	run(t, p, tokens(0, 4)).Release() // emitting after cancel must not panic
	if d := p.Stats().Dropped; d != 0 {
		t.Errorf("Dropped = %d for a cancelled subscriber", d)
	}
}

func TestTierString(t *testing.T) {
	for tier, want := range map[Tier]string{TierDevice: "device", TierHost: "host", TierDisk: "disk", TierRemote: "remote", 9: "tier(9)"} {
		if got := tier.String(); got != want {
			t.Errorf("Tier(%d) = %q, want %q", tier, got, want)
		}
	}
	for k, want := range map[EventKind]string{EventStored: "stored", EventRemoved: "removed", EventCleared: "cleared", 0: "kind(0)"} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d) = %q, want %q", k, got, want)
		}
	}
}

// A subscriber with a small buffer follows the pool from another goroutine,
// resynchronising from snapshots on gaps, while the scheduler goroutine works
// and a third goroutine reads stats. Run with -race.
func TestConcurrentSubscriber(t *testing.T) {
	p := NewPool(64, 4)
	ch, cancel := p.Subscribe(2)
	var (
		wg     sync.WaitGroup
		errc   = make(chan error, 1)
		m      = &mirror{cache: map[uint64]uint64{}}
		gaps   int
		stop   = make(chan struct{})
		caught = make(chan struct{})
	)
	wg.Add(2)
	go func() { // the router
		defer wg.Done()
		defer close(caught)
		for ev := range ch {
			if ev.ID <= m.lastID {
				continue // covered by the snapshot
			}
			if ev.ID != m.lastID+1 {
				gaps++
				m.resync(p.Snapshot())
				continue
			}
			if err := m.apply(ev); err != nil {
				errc <- err
				return
			}
		}
	}()
	go func() { // metrics
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				st := p.Stats()
				if st.Used+st.Cached+st.Free != st.Blocks {
					errc <- errorf("stats %+v", st)
					return
				}
				_ = p.Usage()
			}
		}
	}()

	r := rand.New(rand.NewPCG(3, 4))
	var seqs []*Seq
	for range 3000 {
		if len(seqs) > 8 || (len(seqs) > 0 && r.IntN(3) == 0) {
			i := r.IntN(len(seqs))
			seqs[i].Release()
			seqs = slices.Delete(seqs, i, i+1)
			continue
		}
		prompt := tokens(int32(r.IntN(40)*1000), 4+r.IntN(40))
		s := p.NewSeq(testSalt)
		cached := s.Match(prompt, 1)
		if s.Reserve(len(prompt)-cached) != nil {
			s.Release()
			continue
		}
		s.Commit(prompt)
		seqs = append(seqs, s)
	}
	for _, s := range seqs {
		s.Release()
	}
	// Events dropped at the very end leave no gap to see (in production the
	// load report's last event ID reveals it). Let the router drain its
	// channel, then store one more block: that event is delivered, and the
	// router either applies it or sees the gap and resyncs.
	drained := func() { // the router has taken every event, or quit
		for len(ch) > 0 {
			select {
			case <-caught:
				return
			default:
				runtime.Gosched()
			}
		}
	}
	drained()
	run(t, p, tokens(-1000, 4)).Release()
	drained()
	close(stop)
	cancel()
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	<-caught
	snap := p.Snapshot()
	if m.lastID != snap.LastID {
		t.Fatalf("mirror at event %d, pool at %d", m.lastID, snap.LastID)
	}
	if !maps.Equal(m.cache, snapshotMap(snap)) {
		t.Fatalf("mirror (%d) != snapshot (%d)", len(m.cache), len(snap.Blocks))
	}
	t.Logf("%d events, %d dropped, %d gaps resynced", snap.LastID, p.Stats().Dropped, gaps)
}
