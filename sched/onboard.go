package sched

// Onboarding (docs/kv-tiers.md): a sequence whose prompt continues, past the blocks the
// device holds, into blocks that the pool's lower tiers hold (host memory, disk, a shared
// directory) loads them instead of computing them. At admission the scheduler pins them
// and reserves device blocks for them (kvcache.Seq.MatchLower), and the sequence leaves
// the waiting queue for a state of its own: out of the batch, which runs on without it,
// until the caller has copied its Loads off the scheduler's goroutine and reported them
// with Onboarded. It then runs like an admitted sequence, its loaded blocks cached, and
// computes the rest. A block that fails its checks ends the loads there; the sequence
// computes from that block on.
//
//	plan := s.Schedule()
//	for _, q := range plan.Onboard { go load(q, q.Sched().Loads()) } // the caller's
//	// … later, on the scheduler's goroutine:
//	s.Onboarded(q, ok, bad)

import (
	"slices"

	"tandem/kvcache"
)

// onboardState is a sequence's onboarding.
type onboardState struct {
	loads    []kvcache.Load // this onboarding's (reused by the next)
	first    bool           // at the first admission: its loaded tokens count as cached
	finished bool           // Finish came while loading: release when the loads are reported
}

// Loads are the blocks an onboarding sequence (Plan.Onboard) waits for: copy each From
// its lower tier into device block Block, checking it is the block Hash names. Read only;
// valid until Onboarded.
func (s *Seq) Loads() []kvcache.Load { return s.onboard.loads }

// Onboarding reports whether the sequence waits for its loads.
func (s *Seq) Onboarding() bool { return s.state == onboarding }

// Leaving reports whether the sequence was finished while it waits for its loads: it is
// in Onboarding until they are reported, and must not be finished again.
func (s *Seq) Leaving() bool { return s.state == onboarding && s.onboard.finished }

// Onboarding is the sequences waiting for their loads, in no particular order. Read only;
// valid until the next call that changes the scheduler.
func (s *Scheduler[S]) Onboarding() []S { return s.loading }

// startOnboard is Schedule's admission of q when its prompt continues in lower tiers past
// the matched tokens: it pins and reserves the blocks to load, and q leaves the queue to
// wait for them. It reports false, changing nothing, when there is nothing (worth) loading
// or no room for it.
func (s *Scheduler[S]) startOnboard(q S, matched, keep int) bool {
	seq := q.Sched()
	if !s.pool.Tiered() {
		return false
	}
	seq.onboard.loads = seq.KV.MatchLower(seq.Tokens, keep, max(s.cfg.OnboardMin, 1), seq.onboard.loads[:0])
	if len(seq.onboard.loads) == 0 {
		return false
	}
	p := &s.plan
	seq.onboard.first = !seq.admitted
	if seq.admitted {
		p.Resumed = append(p.Resumed, q)
	} else {
		seq.admitted, seq.cached = true, matched
		p.Admitted = append(p.Admitted, q)
	}
	s.waiting = slices.Delete(s.waiting, 0, 1)
	seq.state = onboarding
	seq.onboard.finished = false
	s.loading = append(s.loading, q)
	p.Onboard = append(p.Onboard, q)
	return true
}

// Onboarded reports q's loads: the first ok were copied and checked, and enter the
// prefix cache; if bad, load ok failed its checks (its lower-tier block is dropped) and
// the rest were not tried. q then runs, computing from the first block not loaded; a q
// finished while it loaded is released now. Onboarded does nothing for a q that is not
// onboarding.
func (s *Scheduler[S]) Onboarded(q S, ok int, bad bool) {
	seq := q.Sched()
	if seq.state != onboarding {
		return
	}
	seq.KV.OnboardDone(seq.onboard.loads, ok, bad)
	if seq.onboard.first {
		seq.cached = seq.KV.Len()
	}
	s.loading = slices.DeleteFunc(s.loading, func(r S) bool { return r == q })
	if seq.onboard.finished {
		s.detach(q)
		return
	}
	seq.state = running
	s.running = append(s.running, q)
}

// finishOnboarding is Finish of an onboarding sequence: its loads are writing its blocks,
// so they are released when Onboarded reports them.
func (s *Scheduler[S]) finishOnboarding(q S) { q.Sched().onboard.finished = true }
