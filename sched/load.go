package sched

import (
	"tandem/kvcache"
	"tandem/llm"
)

// A Census counts a scheduler's sequences for its worker's load report. The engine
// publishes one after every step (adding the requests in its inbox, their hits estimated
// by ExpectedHits too) and the simulator takes one at every report, and both turn it into
// the report with Load: a simulated worker reports exactly what a live one reports.
type Census struct {
	Running    int // sequences admitted to the batch (decoding or prefilling)
	Prefilling int // of those, the ones without a first token yet
	Waiting    int // sequences queued, not admitted (new or preempted)
	// PrefillTokens is the uncomputed prompt tokens of the admitted sequences (their prefix
	// cache hits already subtracted); WaitingTokens the uncomputed tokens of the queued
	// ones, less the leading blocks the prefix cache held when the census first saw them
	// queued (what their admission would match then).
	PrefillTokens int
	WaitingTokens int
	DecodeBlocks  int // KV blocks held by the admitted sequences
	// Onboarding is the sequences loading their prompt's blocks from lower tiers
	// (onboard.go); the tokens they will compute after the loads are in PrefillTokens and
	// their blocks in DecodeBlocks.
	Onboarding int
}

// Census counts the scheduler's running and waiting sequences; see CensusOf.
func (s *Scheduler[S]) Census() Census { return s.CensusOf(s.running, s.waiting) }

// CensusOf counts running (admitted) and waiting (queued) sequences of this scheduler's
// pool. A queued sequence's expected cache hits are looked up once (one hash of its
// tokens, a walk of the pool's index) and kept until its tokens change (a preempted
// sequence is looked up again). It allocates nothing once its scratch has grown.
func (s *Scheduler[S]) CensusOf(running, waiting []S) Census {
	var c Census
	c.Running = len(running)
	for _, q := range running {
		seq := q.Sched()
		if seq.Generated() == 0 {
			c.Prefilling++
		}
		if seq.KV == nil {
			continue
		}
		c.DecodeBlocks += len(seq.KV.Blocks())
		// The last token of a decoding sequence is uncomputed too, but it is decode work.
		if n := seq.KV.Len(); n < len(seq.Tokens)-seq.Drafts-1 || n < seq.PromptLen {
			c.PrefillTokens += len(seq.Tokens) - n
		}
	}
	c.Waiting = len(waiting)
	for _, q := range waiting {
		seq := q.Sched()
		c.WaitingTokens += len(seq.Tokens) - s.expected(seq)
	}
	bs := s.pool.BlockSize()
	for _, q := range s.loading {
		seq := q.Sched()
		if seq.onboard.finished {
			continue
		}
		c.Onboarding++
		c.DecodeBlocks += len(seq.KV.Blocks())
		c.PrefillTokens += max(0, len(seq.Tokens)-seq.KV.Len()-len(seq.onboard.loads)*bs)
	}
	return c
}

// expected returns the prompt tokens the prefix cache would give seq if it were admitted
// now (ExpectedHits), looked up once per length of seq's tokens.
func (s *Scheduler[S]) expected(seq *Seq) int {
	if seq.expectFor == len(seq.Tokens) {
		return seq.expect
	}
	var n int
	n, s.hashes = ExpectedHits(s.pool, s.salt(seq), seq.Tokens, s.hashes)
	seq.expect, seq.expectFor = n, len(seq.Tokens)
	return n
}

// ExpectedHits returns how many tokens of a prompt the pool's prefix cache would give a
// sequence admitted now, by Schedule's rule (full blocks, the last token left to compute):
// the estimate a load report counts a queued prompt's hits with. It hashes the prompt into
// scratch (returned, for reuse) and takes the pool's lock once; any goroutine may call it.
func ExpectedHits(pool *kvcache.Pool, salt uint64, tokens []int32, scratch []uint64) (int, []uint64) {
	bs := pool.BlockSize()
	usable := (len(tokens) - 1) / bs
	if usable <= 0 {
		return 0, scratch
	}
	scratch = kvcache.HashBlocks(salt, tokens[:usable*bs], bs, scratch[:0])
	return pool.CachedRun(scratch) * bs, scratch
}

// Load is the load report of a worker whose scheduler counted c and whose pool's stats are
// kv: decoding sequences run; the prefilling and the queued ones wait; prefill is the
// uncomputed prompt tokens of both (so a request queued behind a long prompt counts where
// the router can see it); the KV figures are the pool's. Health, step timings and the
// dispatch numbers are the caller's.
func (c Census) Load(kv kvcache.Stats) llm.Load {
	return llm.Load{
		Running:       c.Running - c.Prefilling,
		Waiting:       c.Waiting + c.Prefilling + c.Onboarding,
		Onboarding:    c.Onboarding,
		PrefillTokens: c.PrefillTokens + c.WaitingTokens,
		Queued:        c.Waiting,
		QueuedTokens:  c.WaitingTokens,
		DecodeBlocks:  c.DecodeBlocks,
		KVUsage:       kv.Usage(),
		KVBlocks:      kv.Blocks,
		LastEventID:   kv.LastEventID,
		CachedBlocks:  kv.Held,
	}
}
