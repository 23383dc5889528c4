package engine

import (
	"sync"
	"time"
)

// Stats is the scheduler's state as of its last step: what a worker's load report carries.
type Stats struct {
	Running    int // sequences admitted to the batch (decoding or prefilling)
	Prefilling int // of those, the ones without a first token yet
	Waiting    int // sequences queued, not admitted (new or preempted)
	// PrefillTokens is the uncomputed prompt tokens of the admitted sequences (their prefix
	// cache hits already subtracted); WaitingTokens the uncomputed tokens of the queued ones
	// (before any prefix cache match, which happens at admission).
	PrefillTokens int
	WaitingTokens int
	DecodeBlocks  int     // KV blocks held by the admitted sequences
	KVUsed        int     // KV blocks referenced by any sequence (the pool's Used)
	KVBlocks      int     // KV capacity in blocks
	KVUsage       float64 // KVUsed / KVBlocks
	// LastStep is the duration of the last forward pass and LastStepTokens the tokens it
	// computed (prefill chunks and decode tokens together); Steps counts forward passes.
	LastStep       time.Duration
	LastStepTokens int
	Steps          uint64
	// StepsOverTarget counts the forward passes that carried decode tokens and were
	// predicted past the ITL target (sched.Plan.OverTarget).
	StepsOverTarget uint64
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
	st := e.pool.Stats()
	s.KVUsed, s.KVBlocks, s.KVUsage = st.Used, st.Blocks, st.Usage()
	return s
}

// publish records the scheduler's state for Stats. Called by Run's goroutine only.
func (e *Engine) publish() { e.publishSeqs(e.sched.Running(), e.sched.Waiting()) }

// publishSeqs records the state of the given running and waiting sequences for Stats.
func (e *Engine) publishSeqs(running, waiting []*sequence) {
	var s Stats
	s.Running = len(running)
	for _, q := range running {
		if q.firstToken.IsZero() {
			s.Prefilling++
		}
		if q.KV == nil {
			continue
		}
		s.DecodeBlocks += len(q.KV.Blocks())
		// The last token of a decoding sequence is uncomputed too, but it is decode work.
		if n := q.KV.Len(); n < len(q.Tokens)-1 || n < q.PromptLen {
			s.PrefillTokens += len(q.Tokens) - n
		}
	}
	for _, q := range waiting {
		s.WaitingTokens += len(q.Tokens)
	}
	e.stats.mu.Lock()
	s.LastStep, s.LastStepTokens, s.Steps, s.StepsOverTarget = e.stats.s.LastStep, e.stats.s.LastStepTokens, e.stats.s.Steps, e.stats.s.StepsOverTarget
	e.stats.s = s
	e.stats.mu.Unlock()
}

// stepDone records a forward pass of n tokens that took d. Called by Run's goroutine only.
func (e *Engine) stepDone(d time.Duration, n int) {
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
