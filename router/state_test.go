package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// What one dispatch adds to a worker's prediction at each point of its life: before its
// first token (received or not), waiting with its prefill and its blocks; after, its
// blocks; after its end, nothing.
type life int

const (
	sent    life = iota // dispatched, not yet received by the worker
	queued              // received, before its first token
	running             // past its first token
	ended               // gone
)

func (l life) load(prefill, decode int) (waiting, pre, dec int) {
	switch l {
	case sent, queued:
		return 1, prefill, decode
	case running:
		return 0, 0, decode
	}
	return 0, 0, 0
}

// The background of the table below: another router's requests that every report counts.
var background = load{waiting: 2, prefillTokens: 10 * testBlock, decode: 20}

// One dispatch, its first token at step 5 and its end at step 8, and one load report made
// at any point of its life and delivered before the router sees the first token, between
// the first token and the end, or after the end. After every event the prediction is what
// the latest of the report and the events says of the dispatch, on top of the background:
// a stale report (made before an event the router has seen) no longer brings back a
// request that the router saw start or end, and a fresh one is not taken off twice. With
// BusyWaiting 3, the worker is busy exactly while the dispatch waits.
func TestReportOrderings(t *testing.T) {
	const (
		promptBlocks, cachedBlocks = 12, 4
		prefill                    = promptBlocks - cachedBlocks
		firstStep, endStep         = 5, 8
	)
	made := []struct {
		name  string
		life  life
		step  uint64
		recvd uint64 // the dispatch numbers the worker had taken
	}{
		{"before the worker took it", sent, 2, 0},
		{"before its first token", queued, 3, 1},
		{"between its first token and end", running, 6, 1},
		{"after its end", ended, 9, 1},
	}
	for _, m := range made {
		for at := 0; at <= 2; at++ {
			t.Run(fmt.Sprintf("made %s, delivered after %d events", m.name, at), func(t *testing.T) {
				cfg := testConfig()
				cfg.BusyWaiting = background.waiting + 1
				s := newTestState(t, cfg, 1)
				r0 := background.report()
				r0.Tracked, r0.Step = true, 1
				if err := s.Report(1, r0, t0); err != nil {
					t.Fatal(err)
				}
				in := s.AddInflight(1, promptBlocks, cachedBlocks)
				// The report: the background, and the dispatch as the worker saw it then (its
				// blocks held from admission: it was prefilling).
				r := background.report()
				r.Tracked, r.Received, r.Step = true, m.recvd, m.step
				w, p, d := m.life.load(prefill*testBlock, promptBlocks)
				if m.life == sent {
					w, p, d = 0, 0, 0
				}
				r.Waiting += w
				r.PrefillTokens += p
				r.DecodeBlocks += d
				seen, reported := sent, sent
				check := func(when string) {
					t.Helper()
					wantW, wantP, wantD := max(seen, reported).load(prefill, promptBlocks)
					st, _ := s.Worker(1)
					if st.Waiting() != background.waiting+wantW || st.PrefillBlocks() != float64(10+wantP) || st.DecodeBlocks() != float64(background.decode+wantD) {
						t.Errorf("%s: waiting %d prefill %v decode %v, want %d %d %d", when, st.Waiting(), st.PrefillBlocks(), st.DecodeBlocks(),
							background.waiting+wantW, 10+wantP, background.decode+wantD)
					}
					if busy := wantW > 0; s.Busy(1) != busy {
						t.Errorf("%s: busy %v, want %v", when, s.Busy(1), busy)
					}
				}
				check("dispatched")
				deliver := func() {
					if err := s.Report(1, r, t0); err != nil {
						t.Fatal(err)
					}
					reported = m.life
					check("report delivered")
				}
				for i, ev := range []func(){
					func() { s.PrefillDoneAt(&in, firstStep); seen = running },
					func() { s.RemoveInflightAt(in, endStep); seen = ended },
				} {
					if at == i {
						deliver()
					}
					ev()
					check(fmt.Sprintf("event %d seen", i+1))
				}
				if at == 2 {
					deliver()
				}
				// A report made after everything leaves the background alone, and no records.
				r = background.report()
				r.Tracked, r.Received, r.Step = true, 1, 10
				s.Report(1, r, t0)
				reported = ended
				check("final report")
				if st, _ := s.Worker(1); len(st.pending) != 0 || st.Inflight != 0 {
					t.Errorf("left %d records, %d in flight", len(st.pending), st.Inflight)
				}
			})
		}
	}
}

// oldState is the router's bookkeeping before steps (the reference for reports and events
// without them): a report resets the deltas to the dispatches it does not count, and a
// first token or an end subtracts.
type oldState struct {
	sent                        uint64
	unacked                     map[uint64]*oldDispatch
	dWaiting, dPrefill, dDecode int
}

type oldDispatch struct {
	prefill, decode int
	prefilled       bool
}

// Without steps on either side, the bookkeeping is the one before steps, operation for
// operation: random dispatches, first tokens, ends and reports (all tracked or none) of
// one worker give the same predictions both ways.
func TestStepslessBookkeepingUnchanged(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		s := newTestState(t, testConfig(), 1)
		old := oldState{unacked: map[uint64]*oldDispatch{}}
		var live []*Inflight
		var received uint64
		tracked := seed%4 > 0 // a worker's reports are tracked, or none is
		for op := range 400 {
			switch k := rng.IntN(10); {
			case k < 3: // dispatch
				pb := rng.IntN(20)
				cb := rng.IntN(pb + 1)
				in := s.AddInflight(1, pb, cb)
				live = append(live, &in)
				old.sent++
				old.unacked[old.sent] = &oldDispatch{prefill: pb - cb, decode: pb}
				old.dWaiting++
				old.dPrefill += pb - cb
				old.dDecode += pb
			case k < 5 && len(live) > 0: // first token
				in := live[rng.IntN(len(live))]
				if !in.Prefilled {
					if d := old.unacked[in.Seq()]; d != nil {
						d.prefilled = true
					}
					old.dWaiting--
					old.dPrefill -= in.PromptBlocks - in.CachedBlocks
				}
				s.PrefillDone(in)
			case k < 7 && len(live) > 0: // end
				i := rng.IntN(len(live))
				in := live[i]
				live = append(live[:i], live[i+1:]...)
				if !in.Prefilled {
					old.dWaiting--
					old.dPrefill -= in.PromptBlocks - in.CachedBlocks
				}
				old.dDecode -= in.PromptBlocks
				delete(old.unacked, in.Seq())
				s.RemoveInflight(*in)
			default: // report
				r := load{waiting: rng.IntN(4), prefillTokens: rng.IntN(100), decode: rng.IntN(60)}.report()
				if tracked { // the number taken, which never goes back
					received = max(received, uint64(rng.IntN(int(old.sent)+1)))
					r.Tracked, r.Received = true, received
				}
				s.Report(1, r, t0)
				old.dWaiting, old.dPrefill, old.dDecode = 0, 0, 0
				for seq, d := range old.unacked {
					if r.Tracked && seq > r.Received {
						if !d.prefilled {
							old.dWaiting++
							old.dPrefill += d.prefill
						}
						old.dDecode += d.decode
					} else {
						delete(old.unacked, seq)
					}
				}
			}
			w, _ := s.Worker(1)
			if w.dWaiting != old.dWaiting || w.dPrefill != old.dPrefill || w.dDecode != old.dDecode {
				t.Fatalf("seed %d, op %d: deltas %d %d %d, before steps %d %d %d", seed, op,
					w.dWaiting, w.dPrefill, w.dDecode, old.dWaiting, old.dPrefill, old.dDecode)
			}
		}
	}
}

// A worker and a router that meet its events and reports in any order: requests reach
// the worker, start and end at numbered steps; reports, made at steps, travel on one
// channel and each request's events on its own, each delayed at random. After every
// delivery the router predicts, for each request, what the latest of the last report and
// its events says of it, exactly.
func TestStepsExactUnderReordering(t *testing.T) {
	const bg = 3 // another router's waiting requests, in every report
	type req struct {
		in                 Inflight
		recv, first, end   uint64 // the worker's steps (0: not yet)
		seenFirst, seenEnd bool
	}
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 11))
		s := newTestState(t, testConfig(), 1)
		var reqs []*req
		type delivery struct {
			at   int
			do   func()
			what string
		}
		var queue []delivery // by delivery time, FIFO per channel
		lastReport := 0
		lastEvent := map[int]int{}
		reported := map[int]life{} // the delivered report's view of each request
		step := uint64(1)
		report := func(now int) {
			rep := load{waiting: bg}.report()
			rep.Tracked, rep.Step = true, step
			view := map[int]life{}
			for i, r := range reqs {
				var l life
				switch {
				case r.recv == 0:
					continue
				case r.first == 0:
					l = queued
				case r.end == 0:
					l = running
				default:
					l = ended
				}
				view[i] = l
				rep.Received = max(rep.Received, r.in.Seq())
				w, p, d := l.load(r.in.PromptBlocks-r.in.CachedBlocks, r.in.PromptBlocks)
				rep.Waiting += w
				rep.PrefillTokens += p * testBlock
				rep.DecodeBlocks += d
			}
			at := max(now+rng.IntN(6), lastReport)
			lastReport = at
			queue = append(queue, delivery{at, func() { s.Report(1, rep, t0); reported = view }, "report"})
		}
		// deliver hands the router what is due at now, in order of time, ties in the order
		// sent, and checks its prediction after each.
		deliver := func(now int) {
			for {
				k := -1
				for j, d := range queue {
					if d.at <= now && (k < 0 || d.at < queue[k].at) {
						k = j
					}
				}
				if k < 0 {
					return
				}
				d := queue[k]
				queue = append(queue[:k], queue[k+1:]...)
				d.do()
				var wantW, wantP, wantD int
				for i, r := range reqs {
					l := reported[i] // sent when the report did not count it
					if r.seenEnd {
						l = ended
					} else if r.seenFirst {
						l = max(l, running)
					}
					w, p, dd := l.load(r.in.PromptBlocks-r.in.CachedBlocks, r.in.PromptBlocks)
					wantW, wantP, wantD = wantW+w, wantP+p, wantD+dd
				}
				w, _ := s.Worker(1)
				base := 0
				if w.ReportedAt == t0 {
					base = bg
				}
				if w.Waiting() != base+wantW || w.PrefillBlocks() != float64(wantP) || w.DecodeBlocks() != float64(wantD) {
					for i, r := range reqs {
						t.Logf("req %d seq %d pb %d cb %d recv %d first %d end %d seen %v %v reported %v", i, r.in.Seq(), r.in.PromptBlocks, r.in.CachedBlocks, r.recv, r.first, r.end, r.seenFirst, r.seenEnd, reported[i])
					}
					t.Fatalf("seed %d, step %d, after a %s: waiting %d prefill %v decode %v, want %d %d %d (records %+v, report %+v)", seed, step, d.what,
						w.Waiting(), w.PrefillBlocks(), w.DecodeBlocks(), base+wantW, wantP, wantD, w.pending, w.Report)
				}
			}
		}
		const end = 300
		for now := 0; now < end; now++ {
			step++
			// The worker: takes new requests, starts and ends some, at this step.
			if rng.IntN(3) == 0 {
				pb := 1 + rng.IntN(20)
				cb := rng.IntN(pb)
				reqs = append(reqs, &req{in: s.AddInflight(1, pb, cb)})
			}
			taking := true // the worker takes requests in the order sent
			for i, r := range reqs {
				switch {
				case r.recv == 0:
					if taking = taking && rng.IntN(2) == 0; taking {
						r.recv = step
					}
				case r.recv != 0 && r.recv < step && r.first == 0 && rng.IntN(3) == 0:
					r.first = step
					at := max(now+rng.IntN(6), lastEvent[i])
					lastEvent[i] = at
					f := step
					queue = append(queue, delivery{at, func() { s.PrefillDoneAt(&r.in, f); r.seenFirst = true }, "first"})
				case r.first != 0 && r.first < step && r.end == 0 && rng.IntN(4) == 0:
					r.end = step
					at := max(now+rng.IntN(6), lastEvent[i])
					lastEvent[i] = at
					e := step
					queue = append(queue, delivery{at, func() { s.RemoveInflightAt(r.in, e); r.seenEnd = true }, "end"})
				}
			}
			if rng.IntN(2) == 0 { // a report after this step
				report(now)
			}
			deliver(now)
		}
		// Everything delivered, then a report after it all: the router keeps records only
		// of the dispatches the worker has not taken.
		deliver(2 * end)
		step++
		report(2 * end)
		deliver(3 * end)
		w, _ := s.Worker(1)
		for _, d := range w.pending {
			if r := reqs[d.seq-1]; r.recv != 0 {
				t.Errorf("seed %d: a record of dispatch %d, taken at step %d, after a report that counts it all: %+v", seed, d.seq, r.recv, d)
			}
		}
	}
}
