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

// Stats returns the scheduler's state as of its last iteration, and the waiting count and
// KV pool figures as of now. It is cheap and safe to call from any goroutine.
func (e *Engine) Stats() Stats {
	e.stats.mu.Lock()
	s := e.stats.s
	e.stats.mu.Unlock()
	// Requests in the inbox are waiting too; queued counts them as soon as Generate returns.
	s.Waiting = max(int(e.queued.Load()), 0)
	s.WaitingTokens += max(int(e.inboxTok.Load()), 0)
	st := e.pool.Stats()
	s.KVUsed, s.KVBlocks, s.KVUsage = st.Used, st.Blocks, st.Usage()
	s.TierLoadMicros, s.BlockPrefillMicros = e.LoadCosts()
	return s
}

// publish records the scheduler's state for Stats. Called by Run's goroutine only.
func (e *Engine) publish() { e.publishSeqs(e.sched.Running(), e.sched.Waiting()) }

// publishSeqs records the state of the given running and waiting sequences for Stats.
func (e *Engine) publishSeqs(running, waiting []*sequence) {
	var s Stats
	s.Census = e.sched.CensusOf(running, waiting)
	e.stats.mu.Lock()
	s.LastStep, s.LastStepTokens, s.Steps, s.StepsOverTarget = e.stats.s.LastStep, e.stats.s.LastStepTokens, e.stats.s.Steps, e.stats.s.StepsOverTarget
	e.stats.s = s
	e.stats.mu.Unlock()
	e.inboxTok.Add(-int64(e.intaken))
	e.intaken = 0
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
