package sched

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"tandem/kvcache"
)

// Config sizes a step.
type Config struct {
	MaxBatchTokens int    // token budget of one step: decode tokens and prefill chunks together
	MaxSeqs        int    // most sequences running (or onboarding) at once
	Salt           uint64 // block hash salt of the sequences' KV (kvcache.Salt of model, namespace, LoRA)
	// ITLTarget, with Cost, bounds the time of a step that carries decode tokens: its
	// prefill chunks are cut so that Cost predicts the step within the target (see
	// Schedule). A step with no decode gives prefill the whole token budget. ITLDecodes,
	// when positive, sets the target instead, at every step, to that many times Cost's
	// prediction for the step's decodes alone: a step that reads prompts takes at most
	// that many times what its streams need, however fast or slow the machine and the
	// batch are (a LiveCost follows the machine as it slows or speeds up). Neither, or no
	// Cost: the token budget alone cuts chunks.
	ITLTarget  time.Duration
	ITLDecodes float64
	Cost       CostModel
	// MicroBatches is how many steps may be in flight at once: a pipeline's stages, each
	// running another step (a micro-batch) at the same time. A plan then takes at most
	// 1/MicroBatches of the running sequences (rounded up), so that the steps in flight
	// share them, and a sequence whose step is in flight is neither planned nor preempted
	// until the caller lands that step (Land, instead of Commit). 0 or 1: one step at a time.
	MicroBatches int
	// OnboardMin is the fewest blocks worth loading from the pool's lower tiers instead of
	// computing them (onboard.go); 0 is 1.
	OnboardMin int
}

// overloadFactor bounds a timed step whose decode tokens alone take more than a half of
// the target: its prompt chunks may take it to this many times the decodes' time (as long
// again as the decodes), past the target. A stream's tokens then come at most twice as
// slowly while a prompt is read, and prompts are still read at the pace of the decodes,
// however slow the machine has become (other work on its cores, more streams than it can
// serve): a fixed share of the target would all but stop them.
const overloadFactor = 2

// minPromptShare sets the prompt tokens a step reads at least when a prompt is waiting,
// whatever the time: a sixty-fourth of the token budget (8 of 512), so that prompts move
// even when the cost model prices a step's fixed prefill cost above what the decodes
// leave (until the live correction learns what a mixed step costs).
const minPromptShare = 64

// minPrompt is the prompt tokens a timed step reads at least (see minPromptShare).
func (c Config) minPrompt() int { return max(1, c.MaxBatchTokens/minPromptShare) }

// where a Seq is.
type state uint8

const (
	detached state = iota // not added yet, or finished
	waiting
	running
	onboarding // loading its prompt's blocks from lower tiers (onboard.go)
)

// Seq is the scheduler's record of one sequence. The caller's own record embeds it (see
// Sequence), sets ID, Priority, Tokens and PromptLen before Add, and appends each sampled
// token to Tokens; the scheduler owns the rest.
type Seq struct {
	ID        uint64  // the caller's name for the sequence, in plans' text
	Priority  int     // lower runs first; within a priority, first come, first served
	Tokens    []int32 // the prompt, then the generated tokens
	PromptLen int     // the first PromptLen of Tokens are the prompt
	// KV is the sequence's block table: made at its first admission, emptied when it is
	// preempted or finished. Len is how many of Tokens have their KV written.
	KV *kvcache.Seq
	// NoPrefixMatch makes an admission compute every token, none matched in the prefix
	// cache: the caller wants an output at each prompt position (prompt log-probabilities,
	// a mean-pooled embedding). The caller may clear it once it has them.
	NoPrefixMatch bool
	// Salt, if not 0, is the block hash salt of the sequence's KV instead of Config.Salt:
	// a sequence under a LoRA adapter hashes with the adapter's, so that its blocks never
	// match another adapter's (or the base model's) prefix.
	Salt uint64
	// Drafts is how many trailing Tokens are drafted, not yet accepted (speculative
	// decoding): the caller appends them and sets Drafts before Schedule, which either
	// plans all of the sequence's uncomputed tokens in one chunk or drops the drafts
	// (cutting Tokens and zeroing Drafts) where the budget or the pool cannot take them,
	// and drops them before a preemption. After the step the caller cuts Tokens to the
	// accepted ones before Commit, which commits only tokens still there.
	Drafts int

	cached   int    // prompt tokens the prefix cache held at the first admission
	admitted bool   // admitted at least once
	arrival  uint64 // order of the first Add
	state    state
	inFlight bool // in a step not landed yet (Config.MicroBatches)

	onboard onboardState // while loading from lower tiers (onboard.go)

	// While queued: the prompt tokens the prefix cache held when the census last looked
	// the sequence up, at expectFor tokens (load.go).
	expect, expectFor int
}

// Sched returns s; a caller's record that embeds Seq thereby satisfies Sequence.
func (s *Seq) Sched() *Seq { return s }

// Generated is the number of tokens generated so far.
func (s *Seq) Generated() int { return len(s.Tokens) - s.PromptLen }

// Cached is the number of prompt tokens found in the prefix cache at the first admission.
func (s *Seq) Cached() int { return s.cached }

// Admitted reports whether the sequence has been admitted (it may have been preempted since).
func (s *Seq) Admitted() bool { return s.admitted }

// Waiting reports whether the sequence is queued, new or preempted.
func (s *Seq) Waiting() bool { return s.state == waiting }

// Running reports whether the sequence is admitted and not preempted.
func (s *Seq) Running() bool { return s.state == running }

// InFlight reports whether the sequence is in a step not landed yet (Config.MicroBatches).
func (s *Seq) InFlight() bool { return s.inFlight }

// A Sequence is the caller's record of a sequence: a pointer to a struct that embeds Seq.
type Sequence interface {
	comparable
	Sched() *Seq
}

// A Chunk is one sequence's share of a step: the KV of positions From … From+N-1 of its
// Tokens is computed.
type Chunk[S Sequence] struct {
	Seq  S
	From int
	N    int
}

// Samples reports whether the chunk reaches the end of its sequence's tokens, so that the
// step yields the logits of the next token.
func (c Chunk[S]) Samples() bool { return c.From+c.N == len(c.Seq.Sched().Tokens) }

// Decode reports whether the chunk computes one generated token (and the drafts after it):
// a decode, not a prompt chunk or the recompute of a preempted sequence.
func (c Chunk[S]) Decode() bool {
	q := c.Seq.Sched()
	return c.N == 1+q.Drafts && c.From >= q.PromptLen && c.From+c.N == len(q.Tokens)
}

// A Plan is what one step computes and what the scheduler did to make room for it. Its
// slices are reused by the next Schedule.
type Plan[S Sequence] struct {
	// Chunks is the batch in order: running sequences first, fewest tokens left first (so
	// decode tokens come before prefill chunks), then the sequences started this step.
	Chunks []Chunk[S]
	// Admitted are the sequences started for the first time this step (their Cached is
	// set), Resumed the preempted ones started again; both left the waiting queue.
	Admitted, Resumed []S
	// Preempted are the running sequences sent back to the waiting queue to free blocks:
	// their blocks are released (full ones stay in the prefix cache, so that the recompute
	// mostly matches them) and they will recompute their prompt and generated tokens.
	Preempted []S
	// Dropped are the running sequences that ran out of blocks alone: they no longer fit
	// the pool and were finished, their blocks released. The caller fails them.
	Dropped []S
	// Onboard are the sequences admitted (or resumed) this step whose prompt continues in
	// the pool's lower tiers: they wait, out of the batch, while the caller copies their
	// Loads and reports with Onboarded (onboard.go). They are in Admitted or Resumed too.
	Onboard []S
	// KV is the pool after the step's reservations.
	KV kvcache.Stats
	// Shape is what the chunks compute, in a step cost's terms; Predicted is the cost
	// model's time for it (0 without one). OverTarget reports that the step carries decode
	// tokens and its predicted time exceeds the ITL target: the running streams alone
	// leave prefill less than its share (too many streams for the machine), or they
	// exceed the target by themselves.
	Shape      StepShape
	Predicted  time.Duration
	OverTarget bool
	// Target is the ITL target the step was held to (0: none, or no decode in the step).
	Target time.Duration

	streaming bool          // a chunk is a decode
	limit     time.Duration // the predicted time a timed step's prompts may fill it up to (0: not set yet)
	full      bool          // a prompt chunk was cut to the limit: no more prompt tokens this step
}

func (p *Plan[S]) reset() {
	clear(p.Chunks)
	clear(p.Admitted)
	clear(p.Resumed)
	clear(p.Preempted)
	clear(p.Dropped)
	clear(p.Onboard)
	p.Chunks, p.Admitted, p.Resumed, p.Preempted, p.Dropped = p.Chunks[:0], p.Admitted[:0], p.Resumed[:0], p.Preempted[:0], p.Dropped[:0]
	p.Onboard = p.Onboard[:0]
	p.Shape, p.Predicted, p.OverTarget, p.Target = StepShape{}, 0, false, 0
	p.streaming, p.limit, p.full = false, 0, false
}

// add appends a chunk to the plan.
func (p *Plan[S]) add(c Chunk[S]) {
	p.Chunks = append(p.Chunks, c)
	p.Shape.Add(c.N, c.From+c.N)
	p.streaming = p.streaming || c.Decode()
}

// remove takes chunk i out of the plan.
func (p *Plan[S]) remove(i int) {
	p.Chunks = slices.Delete(p.Chunks, i, i+1)
	p.Shape, p.streaming, p.limit, p.Target = StepShape{}, false, 0, 0
	for _, c := range p.Chunks {
		p.Shape.Add(c.N, c.From+c.N)
		p.streaming = p.streaming || c.Decode()
	}
}

// A Scheduler holds the waiting and running sequences of one KV pool. It is not safe for
// concurrent use; the pool may be shared (a KV transfer reads it meanwhile). The caller
// drives it one step at a time, as etcd raft's RawNode is driven:
//
//	s, _ := sched.New[*mySeq](cfg, pool)
//	s.Add(q)             // a new request, waiting
//	plan := s.Schedule() // who computes which tokens this step
//	// forward pass over plan.Chunks
//	s.Commit()           // their KV is written
//	// sample the chunks that end their sequence's tokens, append the tokens
//	s.Finish(q)          // q is done (or failed, or its caller went away)
type Scheduler[S Sequence] struct {
	cfg      Config
	pool     *kvcache.Pool
	waiting  []S // by priority, then arrival
	running  []S
	arrivals uint64
	plan     Plan[S]
	order    []S // Schedule's copy of running
	loading  []S // sequences onboarding (onboard.go)

	hashes []uint64 // the census's scratch (load.go)
}

// New returns a scheduler of the sequences on pool.
func New[S Sequence](cfg Config, pool *kvcache.Pool) (*Scheduler[S], error) {
	if cfg.MaxBatchTokens < 1 || cfg.MaxSeqs < 1 {
		return nil, fmt.Errorf("sched: the token budget (%d) and the sequence cap (%d) must be positive", cfg.MaxBatchTokens, cfg.MaxSeqs)
	}
	if pool == nil {
		return nil, fmt.Errorf("sched: no KV pool")
	}
	if cfg.ITLTarget < 0 || cfg.ITLDecodes < 0 {
		return nil, fmt.Errorf("sched: a negative ITL target (%v, %v decodes)", cfg.ITLTarget, cfg.ITLDecodes)
	}
	return &Scheduler[S]{cfg: cfg, pool: pool}, nil
}

// Config returns the scheduler's configuration.
func (s *Scheduler[S]) Config() Config { return s.cfg }

// Fits reports whether a prompt of n tokens could ever run: its KV and the first generated
// token's fit the whole pool. One that does not would wait for ever; the caller refuses it.
// Fits reads only the pool's size, so it may be called from any goroutine.
func (s *Scheduler[S]) Fits(n int) bool {
	bs := s.pool.BlockSize()
	return (n+1+bs-1)/bs <= s.pool.NumBlocks()
}

// Waiting is the queue, in the order it is admitted. Read only; valid until the next call
// that changes the scheduler.
func (s *Scheduler[S]) Waiting() []S { return s.waiting }

// Running is the admitted sequences. Read only; valid until the next call that changes the
// scheduler.
func (s *Scheduler[S]) Running() []S { return s.running }

// Idle reports whether no sequence waits, runs or onboards.
func (s *Scheduler[S]) Idle() bool {
	return len(s.waiting) == 0 && len(s.running) == 0 && len(s.loading) == 0
}

// Add queues q, a new sequence with a non-empty prompt. It panics if q was added already.
func (s *Scheduler[S]) Add(q S) {
	seq := q.Sched()
	if seq.state != detached || seq.arrival != 0 {
		panic("sched: Add of a sequence added before")
	}
	if len(seq.Tokens) == 0 || seq.PromptLen < 1 || seq.PromptLen > len(seq.Tokens) {
		panic("sched: Add of a sequence without a prompt")
	}
	s.arrivals++
	seq.arrival = s.arrivals
	s.enqueue(q)
}

// before orders the waiting queue and, reversed, picks preemption victims: priority, then
// arrival.
func before[S Sequence](a, b S) int {
	x, y := a.Sched(), b.Sched()
	return cmp.Or(cmp.Compare(x.Priority, y.Priority), cmp.Compare(x.arrival, y.arrival))
}

func (s *Scheduler[S]) enqueue(q S) {
	i, _ := slices.BinarySearchFunc(s.waiting, q, before[S])
	s.waiting = slices.Insert(s.waiting, i, q)
	q.Sched().state = waiting
}

// left is how many of a running sequence's tokens have no KV yet: 1 for a decode.
func left[S Sequence](q S) int {
	seq := q.Sched()
	return len(seq.Tokens) - seq.KV.Len()
}

// prompting reports whether q reads prompt tokens (or recomputes) this step: more than
// one token left besides its drafts.
func prompting[S Sequence](q S) bool { return left(q)-q.Sched().Drafts > 1 }

// Schedule plans the next step. Running sequences come first: those with one token left
// (decodes), then those reading their prompt, by priority and then fewest tokens left, so
// that streams keep flowing while long prompts are read. Each takes what is left of its
// tokens, up to the remaining token budget, and reserves KV blocks for them. When the pool
// has no blocks for one, the running sequence of the lowest priority and latest arrival is
// preempted (possibly the one asking), and its share of the step, if it had one, goes back
// to the budget. Waiting sequences are admitted in order while the budget and the sequence
// cap allow, before any running prompt of a lower priority (a higher Priority) and after
// the others: each matches its tokens against the prefix cache (the last token is always
// computed, for its logits) and takes a chunk of the rest. The first waiting sequence that
// does not fit stops the admissions, so that a long prompt is not overtaken for ever.
//
// With an ITL target and a cost model (Config), a step that carries decode tokens also
// has a time budget: prefill chunks, in the order above, take the tokens that keep the
// step's predicted time within the target, and the first one cut short ends the step's
// prefill. When the decodes alone take more than half the target, prefill may take as
// long as they do, and the step goes over the target (Plan.OverTarget); and a waiting
// prompt reads at least a sixty-fourth of the token budget a step. A step without decode
// tokens has the token budget alone: no stream waits on it.
//
// The plan is valid until the next Schedule. A plan with no chunks means nothing can run
// now.
func (s *Scheduler[S]) Schedule() *Plan[S] {
	p := &s.plan
	p.reset()
	budget := s.cfg.MaxBatchTokens
	slices.SortStableFunc(s.running, runOrder[S])
	s.order = append(s.order[:0], s.running...)
	admitting := true
	share := s.share()
	for _, q := range s.order {
		if budget == 0 || share == 0 {
			break
		}
		seq := q.Sched()
		if seq.state != running || seq.inFlight {
			continue // preempted to make room for an earlier one, or in another step
		}
		if prompting(q) {
			// A prompt chunk: waiting sequences of a higher priority start first.
			for admitting && budget > 0 && len(s.waiting) > 0 && s.waiting[0].Sched().Priority < seq.Priority {
				admitting = s.admit(p, &budget)
			}
			if budget == 0 || p.full {
				break // the running sequences left read their prompts too
			}
		}
		n := min(left(q), budget)
		if seq.Drafts == 0 {
			n = s.fit(p, seq.KV.Len(), n) // a decode and its drafts are never cut for time
		}
		if seq.Drafts > 0 && n < left(q) {
			seq.dropDrafts() // a draft verified in part yields nothing
			n = min(left(q), budget)
		}
		for n > 0 && seq.KV.Reserve(n) != nil {
			if seq.Drafts > 0 {
				seq.dropDrafts() // drafts are not worth a preemption
				n = min(left(q), budget)
				continue
			}
			// Sequences started this step are never the victim: they go before q in
			// priority, and the running ones after q are no earlier. Nor is one in a step
			// in flight, whose KV that step is writing (q itself is not).
			v := s.victim()
			if v == q && len(s.running) == 1 && len(s.loading) > 0 {
				// Not alone: sequences onboarding hold blocks they will compute into or
				// give back. q waits for them, keeping its own.
				n = 0
				break
			}
			if v == q && len(s.running) == 1 {
				// Alone and still out of blocks: the sequence has outgrown the pool.
				s.running = s.running[:0]
				s.detach(q)
				p.Dropped = append(p.Dropped, q)
				n = 0
				break
			}
			if i := slices.IndexFunc(p.Chunks, func(c Chunk[S]) bool { return c.Seq == v }); i >= 0 {
				budget += p.Chunks[i].N
				p.remove(i)
				share++
				if v != q { // the step changed: q's share is weighed again
					n = s.fit(p, seq.KV.Len(), min(left(q), budget))
				}
			}
			s.preempt(v)
			p.Preempted = append(p.Preempted, v)
			if v == q {
				n = 0
			}
		}
		if n > 0 {
			p.add(Chunk[S]{Seq: q, From: seq.KV.Len(), N: n})
			budget -= n
			share--
		}
	}
	for admitting && budget > 0 && len(s.waiting) > 0 {
		admitting = s.admit(p, &budget)
	}
	p.KV = s.pool.Stats()
	if s.cfg.Cost != nil && len(p.Chunks) > 0 {
		p.Predicted = s.cfg.Cost.Step(p.Shape)
		if s.targeted() && p.streaming {
			s.limit(p) // set, unless no prompt asked for time

			p.OverTarget = p.Predicted > p.Target
		}
	}
	if s.cfg.MicroBatches > 1 {
		for _, c := range p.Chunks {
			c.Seq.Sched().inFlight = true
		}
	}
	return p
}

// share is how many running sequences a plan may take: all of them, or with micro-batches
// their share of the steps in flight.
func (s *Scheduler[S]) share() int {
	if s.cfg.MicroBatches <= 1 {
		return len(s.running)
	}
	return (len(s.running) + s.cfg.MicroBatches - 1) / s.cfg.MicroBatches
}

// victim is the running sequence to preempt: the lowest priority's latest arrival, of those
// not in a step in flight (whose KV that step is writing).
func (s *Scheduler[S]) victim() S {
	var v S
	found := false
	for _, r := range s.running {
		if r.Sched().inFlight {
			continue
		}
		if !found || before(r, v) > 0 {
			v, found = r, true
		}
	}
	return v
}

// runOrder orders the running sequences for a step: one token left first (decodes), then
// prompts by priority; within each, fewest tokens left first.
func runOrder[S Sequence](a, b S) int {
	la, lb := left(a), left(b)
	if pa, pb := prompting(a), prompting(b); pa != pb {
		if pb {
			return -1
		}
		return 1
	} else if pa {
		if c := cmp.Compare(a.Sched().Priority, b.Sched().Priority); c != 0 {
			return c
		}
	}
	return cmp.Compare(la, lb)
}

// admit starts the first waiting sequence with a chunk of its tokens, if the sequence
// cap, the budget, the pool and the step's time allow; false when it cannot start (then
// none behind it starts this step).
func (s *Scheduler[S]) admit(p *Plan[S], budget *int) bool {
	if len(s.running)+len(s.loading) >= s.cfg.MaxSeqs || p.full {
		return false
	}
	q := s.waiting[0]
	seq := q.Sched()
	// Look before matching, so that a sequence that cannot start yet does not count
	// prefix-cache queries on every step.
	// The first chunk and one block more, but never more than the whole prompt and its
	// first token take: a prompt that Fits the pool exactly would otherwise wait for ever.
	bs := s.pool.BlockSize()
	need := min((min(len(seq.Tokens), *budget)+bs-1)/bs+1, (len(seq.Tokens)+bs)/bs)
	if st := s.pool.Stats(); st.Free+st.Cached < need {
		return false
	}
	if s.timed(p) && p.Shape.PrefillTokens >= s.cfg.minPrompt() && s.cfg.Cost.Step(p.Shape) >= s.limit(p) {
		p.full = true
		return false
	}
	if seq.KV == nil {
		seq.KV = s.pool.NewSeq(s.salt(seq))
	}
	keep := 1 // the last token is computed, for its logits
	if seq.NoPrefixMatch {
		keep = len(seq.Tokens)
	}
	matched := seq.KV.Match(seq.Tokens, keep)
	if !seq.NoPrefixMatch && s.startOnboard(q, matched, keep) {
		return true // it waits for its loads, out of the batch
	}
	n := s.fit(p, matched, min(len(seq.Tokens)-matched, *budget))
	if n == 0 || seq.KV.Reserve(n) != nil {
		seq.KV.Release()
		return false
	}
	if seq.admitted {
		p.Resumed = append(p.Resumed, q)
	} else {
		seq.admitted, seq.cached = true, matched
		p.Admitted = append(p.Admitted, q)
	}
	s.waiting = slices.Delete(s.waiting, 0, 1)
	seq.state = running
	s.running = append(s.running, q)
	p.add(Chunk[S]{Seq: q, From: matched, N: n})
	*budget -= n
	return true
}

// targeted reports whether the scheduler has an ITL target and a cost model.
func (s *Scheduler[S]) targeted() bool {
	return (s.cfg.ITLTarget > 0 || s.cfg.ITLDecodes > 0) && s.cfg.Cost != nil
}

// timed reports whether the step has a time budget: a target, a cost model, and a decode
// in the step.
func (s *Scheduler[S]) timed(p *Plan[S]) bool { return p.streaming && s.targeted() }

// limit sets the step's target, from the chunks planned before its prompts (the
// decodes), and returns the predicted time its prompt chunks may fill it up to: the
// target, or, when the decodes take more than half of it, twice their time (see
// overloadFactor).
func (s *Scheduler[S]) limit(p *Plan[S]) time.Duration {
	if p.limit == 0 {
		d := s.cfg.Cost.Step(p.Shape.decodePart())
		p.Target = s.cfg.ITLTarget
		if k := s.cfg.ITLDecodes; k > 0 {
			p.Target = max(time.Duration(k*float64(d)), 1)
		}
		p.limit = max(p.Target, overloadFactor*d)
	}
	return p.limit
}

// fit is how many of n tokens, starting at position from, a sequence may compute in the
// step: all of them, unless the step is timed and they would take its predicted time past
// the limit; then the most that keep it within, or what the step's minimum of prompt
// tokens still asks for if that is more, and the step's prompt reading is full.
func (s *Scheduler[S]) fit(p *Plan[S], from, n int) int {
	if n <= 1 || !s.timed(p) {
		return n
	}
	limit := s.limit(p)
	fits := func(m int) bool {
		sh := p.Shape
		sh.Add(m, from+m)
		return s.cfg.Cost.Step(sh) <= limit
	}
	m := n
	if !fits(n) {
		p.full = true
		lo, hi := 0, n // fits(lo) or lo = 0, !fits(hi)
		for hi-lo > 1 {
			if mid := (lo + hi) / 2; fits(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		m = max(lo, min(n, s.cfg.minPrompt()-p.Shape.PrefillTokens))
	}
	return m
}

// salt is the block hash salt of seq's KV.
func (s *Scheduler[S]) salt(seq *Seq) uint64 {
	if seq.Salt != 0 {
		return seq.Salt
	}
	return s.cfg.Salt
}

// dropDrafts cuts the sequence's drafted tokens.
func (s *Seq) dropDrafts() {
	s.Tokens = s.Tokens[:len(s.Tokens)-s.Drafts]
	s.Drafts = 0
}

// preempt releases a running sequence's blocks and queues it again; it will recompute its
// tokens, mostly from the prefix cache.
func (s *Scheduler[S]) preempt(q S) {
	q.Sched().dropDrafts()
	q.Sched().KV.Release()
	s.running = slices.DeleteFunc(s.running, func(r S) bool { return r == q })
	s.enqueue(q)
}

// detach releases q's blocks and marks it finished; the caller has taken it off its list.
func (s *Scheduler[S]) detach(q S) {
	seq := q.Sched()
	if seq.KV != nil {
		seq.KV.Release()
	}
	seq.state = detached
	seq.inFlight = false
}

// Commit records that the last plan's forward pass wrote the KV of its chunks: full blocks
// enter the prefix cache. Chunks of sequences finished since the plan are skipped.
func (s *Scheduler[S]) Commit() {
	for _, c := range s.plan.Chunks {
		seq := c.Seq.Sched()
		if seq.state == running {
			// Rejected drafts were cut from Tokens: their KV is not committed.
			seq.KV.Commit(seq.Tokens[:min(c.From+c.N, len(seq.Tokens))])
		}
	}
}

// Land records that a step in flight (Config.MicroBatches) is done: its forward pass wrote
// the KV of chunks, a plan's Chunks as Schedule returned them (the caller keeps a copy, as
// the plan is reused): full blocks enter the prefix cache, as Commit does, and the
// sequences may be planned again. Steps land in the order they were planned. Chunks of
// sequences finished since are skipped.
//
// A sequence finished while its step is in flight releases blocks that step still writes.
// That is safe as long as every step runs its layers in plan order (a pipeline's stages do):
// a later step that is given such a block writes it after the earlier one did, before it
// reads it.
func (s *Scheduler[S]) Land(chunks []Chunk[S]) {
	for _, c := range chunks {
		seq := c.Seq.Sched()
		if seq.state == running {
			seq.KV.Commit(seq.Tokens[:c.From+c.N])
		}
		seq.inFlight = false
	}
}

// Finish takes q out of the scheduler, waiting or running, and releases its blocks: it
// completed, failed, or its caller went away. A caller that keeps q's blocks (a KV transfer
// pins them) takes KV first. Finishing a sequence that is not in the scheduler does nothing.
// An onboarding sequence keeps its blocks, which its loads are writing, until Onboarded
// reports them (onboard.go).
func (s *Scheduler[S]) Finish(q S) {
	switch q.Sched().state {
	case onboarding:
		s.finishOnboarding(q)
		return
	case waiting:
		s.waiting = slices.DeleteFunc(s.waiting, func(r S) bool { return r == q })
	case running:
		s.running = slices.DeleteFunc(s.running, func(r S) bool { return r == q })
	default:
		return
	}
	s.detach(q)
}
