package engine

import (
	"sync"
	"time"

	"tandem/sched"
)

// Stats is the scheduler's state as of its last step: what a worker's load report carries.
// The Census is the scheduler's (sched.Census), with the requests still in the engine's
// inbox counted as queued: Waiting and WaitingTokens include them (their tokens less the
// hits sched.ExpectedHits found for them on arrival).
type Stats struct {
	sched.Census
	// Step is the step the census was taken after (1, 2, …; 0 before Run's first
	// iteration): it counts every request whose first or last event carries a Step at most
	// this one (llm.Event.Step) past that event, and no other. Requests that arrived since
	// (the inbox) have no event yet, whatever the step.
	Step     uint64
	KVUsed   int     // KV blocks referenced by any sequence (the pool's Used)
	KVBlocks int     // KV capacity in blocks
	KVUsage  float64 // KVUsed / KVBlocks
	// LastStep is the duration of the last forward pass and LastStepTokens the tokens it
	// computed (prefill chunks and decode tokens together); Steps counts forward passes.
	LastStep       time.Duration
	LastStepTokens int
	Steps          uint64
	// StepsOverTarget counts the forward passes that carried decode tokens and were
	// predicted past the ITL target (sched.Plan.OverTarget).
	StepsOverTarget uint64
	// TierLoadMicros and BlockPrefillMicros are the measured costs of loading a block from
	// each lower tier and of computing a block of prompt (Engine.LoadCosts).
	TierLoadMicros     [4]int
	BlockPrefillMicros int
}

// statsBox holds the published Stats. The scheduler goroutine writes it once per loop
// iteration (a copy under a mutex: no allocation); Stats reads it from any goroutine.
type statsBox struct {
	mu sync.Mutex
	s  Stats
}

// Stats returns the scheduler's state as of its last iteration with the requests that
// reached the inbox since, and the KV pool figures as of now. It is cheap and safe to call
// from any goroutine.
func (e *Engine) Stats() Stats {
	e.stats.mu.Lock()
	s := e.stats.s
	// Requests in the inbox are waiting too, counted as soon as Generate returns. Read under
	// the lock that publish takes them off under: a request intaken since the census is in
	// one count or the other, never both or neither. Its census figures stay those of the
	// step (the census's Waiting is not the live queue): a request admitted, or past its
	// first token, since then still counts as the step left it, as Step says.
	s.Waiting += max(int(e.inboxN.Load()), 0)
	s.WaitingTokens += max(int(e.inboxTok.Load()), 0)
	e.stats.mu.Unlock()
	st := e.pool.Stats()
	s.KVUsed, s.KVBlocks, s.KVUsage = st.Used, st.Blocks, st.Usage()
	s.TierLoadMicros, s.BlockPrefillMicros = e.LoadCosts()
	return s
}

// publish records the scheduler's state for Stats as step e.stepNo's census, and starts the
// next step: the events sent from now until the next publish carry its number. Called by
// Run's goroutine only.
func (e *Engine) publish() {
	e.publishSeqs(e.sched.Running(), e.sched.Waiting())
	e.stepNo++
}

// publishSeqs records the state of the given running and waiting sequences for Stats.
func (e *Engine) publishSeqs(running, waiting []*sequence) {
	var s Stats
	s.Census = e.sched.CensusOf(running, waiting)
	s.Step = e.stepNo
	e.stats.mu.Lock()
	s.LastStep, s.LastStepTokens, s.Steps, s.StepsOverTarget = e.stats.s.LastStep, e.stats.s.LastStepTokens, e.stats.s.Steps, e.stats.s.StepsOverTarget
	e.stats.s = s
	e.inboxN.Add(-int64(e.intakenN))
	e.inboxTok.Add(-int64(e.intaken))
	e.stats.mu.Unlock()
	e.intaken, e.intakenN = 0, 0
}

// stepDone records a forward pass of n tokens that took d, and its composition: a
// sequence computing only its newest generated token (and its drafts, when it speculates)
// is a decode, every other token a prompt (prefill) token. Called by Run's goroutine only.
func (e *Engine) stepDone(d time.Duration, n int) {
	var chunks []sched.Chunk[*sequence]
	if e.plan != nil {
		chunks = e.plan.Chunks
	}
	e.stepDoneChunks(d, n, chunks)
}

// stepDoneChunks is stepDone for a step of chunks.
func (e *Engine) stepDoneChunks(d time.Duration, n int, chunks []sched.Chunk[*sequence]) {
	decode := 0
	for _, c := range chunks {
		if c.Decode() {
			decode += c.N // 1, plus the drafts being verified
		}
	}
	if met := e.cfg.Metrics; met != nil {
		met.StepPrefillTokens.Observe(float64(n - decode))
		met.StepDecodeTokens.Observe(float64(decode))
	}
	e.onboard.costs.observeStep(d, n-decode, e.cfg.BlockSize)
	e.stats.mu.Lock()
	e.stats.s.LastStep, e.stats.s.LastStepTokens = d, n
	e.stats.s.Steps++
	e.stats.mu.Unlock()
}

// overTarget counts a forward pass predicted past the ITL target. Called by Run's
// goroutine only.
func (e *Engine) overTarget() {
	e.stats.mu.Lock()
	e.stats.s.StepsOverTarget++
	e.stats.mu.Unlock()
}
