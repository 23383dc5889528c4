package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"tandem/grammar"
	"tandem/hal"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
)

// Config sizes the scheduler.
type Config struct {
	MaxBatchTokens int    // token budget of one step, prefill chunks and decode tokens together
	MaxSeqs        int    // most sequences running at once
	MaxQueue       int    // most requests waiting; past it Generate returns llm.ErrQueueFull
	BlockSize      int    // KV positions per block
	KVBlocks       int    // blocks in the KV pool
	Salt           uint64 // block hash salt (kvcache.Salt of model, namespace, LoRA)
	Metrics        *metrics.Engine
	Logger         *slog.Logger
}

// Defaults for a zero Config field.
const (
	DefaultMaxBatchTokens = 512
	DefaultMaxSeqs        = 64
	DefaultMaxQueue       = 1024
	DefaultBlockSize      = 16
)

// Engine serves generation requests on one model with iteration-level
// continuous batching: every step mixes the decode tokens of running
// sequences with prefill chunks of new ones under a token budget. One
// goroutine (Run) owns all scheduling state; Generate only queues.
type Engine struct {
	cfg    Config
	m      *model.Model
	runner *model.Runner // nil with NewWithForwarder
	kv     hal.KVStore   // nil with NewWithForwarder
	fwd    Forwarder
	pool   *kvcache.Pool
	log    *slog.Logger

	mu      sync.Mutex
	inbox   []*sequence
	stopped bool
	queued  atomic.Int64 // inbox + waiting, for the queue bound
	wake    chan struct{}
	nextID  uint64

	// Owned by Run.
	waiting []*sequence
	running []*sequence
	logits  []float32
	batch   model.Batch
	sched   []scheduled
	last    kvcache.Stats

	samplers *samplerBufs  // lends the sequences' samplers their buffers; Run's (samplerbufs.go)
	grammars *grammarCache // constrained requests' compiled grammars (samplerbufs.go)

	stats statsBox  // published by Run for Stats
	held  heldTable // prefill-only sequences' blocks, pinned for a KV transfer (kvexport.go)
}

type sequence struct {
	id        uint64
	req       *llm.Request
	stream    *stream
	sampler   *Sampler
	grammar   *grammar.Bound // the request's constraint; nil: none
	tokens    []int32        // prompt, then generated tokens
	promptLen int
	stop      stopRules
	kv        *kvcache.Seq
	cached    int // prompt tokens found in the prefix cache at first admission
	admitted  bool
	hold      uint64 // prefill-only: at finish, pin the blocks under this handle (kvexport.go)

	arrival, firstScheduled, firstToken, lastToken time.Time
}

func (s *sequence) generated() int { return len(s.tokens) - s.promptLen }

type scheduled struct {
	seq  *sequence
	n    int // tokens computed this step
	from int // first position
}

// New builds an engine for m on be, allocating its KV store.
func New(m *model.Model, be hal.Backend, cfg Config) (*Engine, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	kv, err := be.NewKVStore(m.KVLayout(cfg.KVBlocks, cfg.BlockSize))
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := newEngine(m, cfg)
	e.runner, e.kv = model.NewRunner(m, be), kv
	e.fwd = runnerForward{e.runner, kv}
	return e, nil
}

// fill applies the defaults to c's zero fields and checks it.
func (cfg *Config) fill() error {
	if cfg.MaxBatchTokens <= 0 {
		cfg.MaxBatchTokens = DefaultMaxBatchTokens
	}
	if cfg.MaxSeqs <= 0 {
		cfg.MaxSeqs = DefaultMaxSeqs
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.KVBlocks <= 0 {
		return errors.New("engine: the KV pool needs at least one block")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

func newEngine(m *model.Model, cfg Config) *Engine {
	return &Engine{
		cfg:  cfg,
		m:    m,
		pool: kvcache.NewPool(cfg.KVBlocks, cfg.BlockSize),
		log:  cfg.Logger,
		wake: make(chan struct{}, 1),

		samplers: newSamplerBufs(m.Config.VocabSize, cfg.MaxSeqs),
		grammars: newGrammarCache(m.Tokenizer, m.Config.VocabSize),
	}
}

// Pool is the engine's KV block pool: its stats and KV events.
func (e *Engine) Pool() *kvcache.Pool { return e.pool }

// Model is the served model.
func (e *Engine) Model() *model.Model { return e.m }

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Generate queues req and returns its token stream. The stream is closed,
// and the sequence freed, when ctx is done.
func (e *Engine) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	st, err := e.submit(ctx, req, 0)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// submit queues req; a non-zero hold pins its blocks at finish (see Prefill).
func (e *Engine) submit(ctx context.Context, req *llm.Request, hold uint64) (*stream, error) {
	c := &e.m.Config
	switch {
	case len(req.Prompt) == 0:
		return nil, fmt.Errorf("%w: empty prompt", llm.ErrInvalid)
	case len(req.Prompt) >= c.ContextLen:
		return nil, fmt.Errorf("%w: %d prompt tokens, the context length is %d", llm.ErrPromptTooLong, len(req.Prompt), c.ContextLen)
	case (len(req.Prompt)+1+e.cfg.BlockSize-1)/e.cfg.BlockSize > e.cfg.KVBlocks:
		return nil, fmt.Errorf("%w: %d prompt tokens do not fit the KV cache of %d tokens", llm.ErrPromptTooLong, len(req.Prompt), e.cfg.KVBlocks*e.cfg.BlockSize)
	case req.MaxTokens < 0:
		return nil, fmt.Errorf("%w: max tokens %d", llm.ErrInvalid, req.MaxTokens)
	case req.Resumed < 0 || req.Resumed >= len(req.Prompt):
		return nil, fmt.Errorf("%w: %d resumed tokens of a %d-token prompt", llm.ErrInvalid, req.Resumed, len(req.Prompt))
	}
	for _, id := range req.Prompt {
		if id < 0 || int(id) >= c.VocabSize {
			return nil, fmt.Errorf("%w: token id %d outside the vocabulary of %d", llm.ErrInvalid, id, c.VocabSize)
		}
	}
	if err := req.Sampling.Validate(c.VocabSize); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrInvalid, err)
	}
	gram, err := e.grammars.bind(req)
	if err != nil {
		return nil, err
	}
	seq := &sequence{
		req:       req,
		grammar:   gram,
		stream:    newStream(e.signal),
		tokens:    slices.Clone(req.Prompt),
		promptLen: len(req.Prompt),
		stop: stopRules{tok: e.m.Tokenizer, stopTokens: req.StopTokens, ignoreEOS: req.IgnoreEOS,
			maxTokens: maxNewTokens(c.ContextLen, len(req.Prompt), req.MaxTokens)},
		arrival: req.Arrival,
		hold:    hold,
	}
	if seq.arrival.IsZero() {
		seq.arrival = time.Now()
	}
	seq.stream.cancelled = ctx.Done()
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: the engine is stopped", llm.ErrUnavailable)
	}
	if e.queued.Load() >= int64(e.cfg.MaxQueue) {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %d requests waiting", llm.ErrQueueFull, e.cfg.MaxQueue)
	}
	e.nextID++
	seq.id = e.nextID
	e.inbox = append(e.inbox, seq)
	e.queued.Add(1)
	e.mu.Unlock()
	context.AfterFunc(ctx, func() { seq.stream.Close() })
	e.signal()
	return seq.stream, nil
}

// Run schedules and executes steps until ctx is done; then it fails every
// queued and running request with llm.ErrUnavailable.
func (e *Engine) Run(ctx context.Context) error {
	defer e.shutdown()
	for {
		e.intake()
		e.reap()
		e.observe()
		e.publish()
		if len(e.running) == 0 && len(e.waiting) == 0 {
			select {
			case <-e.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := e.step(); err != nil {
			return err
		}
	}
}

func (e *Engine) shutdown() {
	e.mu.Lock()
	e.stopped = true
	inbox := e.inbox
	e.inbox = nil
	e.mu.Unlock()
	err := fmt.Errorf("%w: the engine stopped", llm.ErrUnavailable)
	for _, s := range slices.Concat(inbox, e.waiting, e.running) {
		if s.kv != nil {
			s.kv.Release()
		}
		s.stream.fail(err)
		e.seqEnded(s)
	}
	e.waiting, e.running = nil, nil
}

// intake moves new requests into the waiting queue, ordered by priority and
// then arrival.
func (e *Engine) intake() {
	e.mu.Lock()
	inbox := e.inbox
	e.inbox = nil
	e.mu.Unlock()
	for _, s := range inbox {
		e.enqueue(s)
	}
}

func before(a, b *sequence) int {
	return cmp.Or(cmp.Compare(a.req.Priority, b.req.Priority), cmp.Compare(a.id, b.id))
}

func (e *Engine) enqueue(s *sequence) {
	i, _ := slices.BinarySearchFunc(e.waiting, s, before)
	e.waiting = slices.Insert(e.waiting, i, s)
}

// reap frees the sequences whose streams were abandoned.
func (e *Engine) reap() {
	keep := func(list []*sequence, waiting bool) []*sequence {
		return slices.DeleteFunc(list, func(s *sequence) bool {
			if !s.stream.abandoned() {
				return false
			}
			if s.kv != nil {
				s.kv.Release()
			}
			if waiting {
				e.queued.Add(-1)
			}
			e.seqEnded(s)
			e.finishMetrics(s, llm.FinishAbort)
			return true
		})
	}
	e.running = keep(e.running, false)
	e.waiting = keep(e.waiting, true)
}

// preempt frees a running sequence's blocks and puts it back in the waiting
// queue; it will recompute its tokens (mostly from the prefix cache), and
// its output does not change because the kernels are batch-invariant.
func (e *Engine) preempt(s *sequence) {
	s.kv.Release()
	e.running = slices.DeleteFunc(e.running, func(r *sequence) bool { return r == s })
	e.enqueue(s)
	e.queued.Add(1)
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.Preemptions.Inc()
	}
	e.log.Debug("preempted", "seq", s.id, "tokens", len(s.tokens))
}

// victim is the running sequence to preempt: the lowest priority, latest arrival.
func (e *Engine) victim() *sequence {
	return slices.MaxFunc(e.running, before)
}

// step schedules one batch, runs it and hands out the sampled tokens.
func (e *Engine) step() error {
	budget := e.cfg.MaxBatchTokens
	e.sched = e.sched[:0]
	// Running sequences first, decode tokens before prefill chunks, so that
	// streams keep flowing while long prompts are being read.
	slices.SortStableFunc(e.running, func(a, b *sequence) int {
		return cmp.Compare(len(a.tokens)-a.kv.Len(), len(b.tokens)-b.kv.Len())
	})
	for _, s := range slices.Clone(e.running) {
		if budget == 0 {
			break
		}
		if !slices.Contains(e.running, s) {
			continue // preempted to make room for an earlier one
		}
		n := min(len(s.tokens)-s.kv.Len(), budget)
		for n > 0 && s.kv.Reserve(n) != nil {
			v := e.victim()
			if v == s && len(e.running) == 1 {
				// Alone and still out of blocks: the sequence has outgrown the pool.
				e.running = e.running[:0]
				e.abort(s, fmt.Errorf("%w: the sequence no longer fits the KV cache", llm.ErrUnavailable))
				n = 0
				break
			}
			if i := slices.IndexFunc(e.sched, func(sc scheduled) bool { return sc.seq == v }); i >= 0 {
				budget += e.sched[i].n
				e.sched = slices.Delete(e.sched, i, i+1)
			}
			e.preempt(v)
			if v == s {
				n = 0
			}
		}
		if n > 0 {
			e.sched = append(e.sched, scheduled{seq: s, n: n, from: s.kv.Len()})
			budget -= n
		}
	}
	for budget > 0 && len(e.waiting) > 0 && len(e.running) < e.cfg.MaxSeqs {
		s := e.waiting[0]
		// Look before matching, so that a request that cannot start yet
		// does not count prefix-cache queries on every step.
		bs := e.cfg.BlockSize
		if st := e.pool.Stats(); st.Free+st.Cached < (min(len(s.tokens), budget)+bs-1)/bs+1 {
			break
		}
		if s.kv == nil {
			s.kv = e.pool.NewSeq(e.cfg.Salt)
		}
		matched := s.kv.Match(s.tokens, 1)
		n := min(len(s.tokens)-matched, budget)
		if err := s.kv.Reserve(n); err != nil {
			s.kv.Release()
			break
		}
		if !s.admitted {
			s.admitted, s.cached, s.firstScheduled = true, matched, time.Now()
			e.newSeqSampler(s)
		}
		e.waiting = e.waiting[1:]
		e.queued.Add(-1)
		e.running = append(e.running, s)
		e.sched = append(e.sched, scheduled{seq: s, n: n, from: matched})
		budget -= n
	}
	if len(e.sched) == 0 {
		return nil
	}
	return e.execute()
}

func (e *Engine) execute() error {
	b := &e.batch
	b.Tokens, b.Outputs = b.Tokens[:0], b.Outputs[:0]
	b.Attn.Pos, b.Attn.SeqOf, b.Attn.Blocks = b.Attn.Pos[:0], b.Attn.SeqOf[:0], b.Attn.Blocks[:0]
	for i, sc := range e.sched {
		s := sc.seq
		b.Attn.Blocks = append(b.Attn.Blocks, s.kv.Blocks())
		for p := sc.from; p < sc.from+sc.n; p++ {
			b.Tokens = append(b.Tokens, s.tokens[p])
			b.Attn.Pos = append(b.Attn.Pos, int32(p))
			b.Attn.SeqOf = append(b.Attn.SeqOf, int32(i))
		}
		if sc.from+sc.n == len(s.tokens) {
			b.Outputs = append(b.Outputs, len(b.Tokens)-1)
		}
	}
	vocab := e.m.Config.VocabSize
	if need := len(b.Outputs) * vocab; cap(e.logits) < need {
		e.logits = make([]float32, need)
	}
	t0 := time.Now()
	err := e.fwd.Forward(b, e.logits[:len(b.Outputs)*vocab])
	e.stepDone(time.Since(t0), len(b.Tokens))
	if err != nil {
		err = fmt.Errorf("engine: forward pass: %w", err)
		for _, sc := range e.sched {
			e.abort(sc.seq, err)
		}
		e.running = slices.DeleteFunc(e.running, func(s *sequence) bool { return s.stream.done })
		e.log.Error("forward pass failed", "err", err)
		return nil
	}
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.IterationTokens.Observe(float64(len(b.Tokens)))
	}
	for _, sc := range e.sched {
		sc.seq.kv.Commit(sc.seq.tokens[:sc.from+sc.n])
	}
	e.committed() // before sampling: KV exports waiting for these blocks go on at once
	out := 0
	now := time.Now()
	for _, sc := range e.sched {
		s := sc.seq
		if sc.from+sc.n != len(s.tokens) {
			continue
		}
		sample := s.sampler.Sample(e.logits[out*vocab : (out+1)*vocab])
		out++
		if err := s.sampler.constraintErr(); err != nil {
			e.constraintFailed(s, err)
			continue
		}
		e.emit(s, sample, now)
	}
	e.running = slices.DeleteFunc(e.running, func(s *sequence) bool { return s.stream.done })
	return nil
}

// emit appends a sampled token, sends it, and finishes the sequence when a
// stop rule says so.
func (e *Engine) emit(s *sequence, sample Sample, now time.Time) {
	s.tokens = append(s.tokens, sample.ID)
	ev := llm.Event{Token: sample.ID, Logprob: sample.Logprob}
	if len(sample.Top) > 0 {
		ev.Top = slices.Clone(sample.Top)
	}
	if met := e.cfg.Metrics; met != nil {
		if s.firstToken.IsZero() {
			met.TTFT.Observe(now.Sub(s.arrival).Seconds())
		} else {
			met.ITL.Observe(now.Sub(s.lastToken).Seconds())
		}
	}
	if s.firstToken.IsZero() {
		s.firstToken = now
	}
	s.lastToken = now
	finish := s.stop.finish(sample.ID, s.generated())
	if finish == "" && s.sampler.constraintDone() {
		finish = llm.FinishStop // the grammar's text is complete
	}
	if finish == "" {
		s.stream.push(ev)
		return
	}
	ev.Finish = finish
	ev.Usage = e.usage(s)
	e.finishKV(s) // before the event: a prefill caller may use the held blocks at once
	e.seqEnded(s)
	s.stream.push(ev)
	e.finishMetrics(s, finish)
}

// abort ends a sequence that cannot continue.
func (e *Engine) abort(s *sequence, err error) {
	s.stream.fail(err)
	s.kv.Release()
	e.seqEnded(s)
	e.finishMetrics(s, llm.FinishAbort)
}

func (e *Engine) usage(s *sequence) llm.Usage {
	return llm.Usage{PromptTokens: s.promptLen, CachedTokens: s.cached, CompletionTokens: s.generated()}
}

func (e *Engine) finishMetrics(s *sequence, reason llm.FinishReason) {
	met := e.cfg.Metrics
	if met == nil {
		return
	}
	now := time.Now()
	if reason != llm.FinishAbort {
		met.RequestSuccess.WithLabelValues(string(reason)).Inc()
	}
	met.E2E.Observe(now.Sub(s.arrival).Seconds())
	met.RequestPrompt.Observe(float64(s.promptLen))
	met.RequestGenerated.Observe(float64(s.generated()))
	met.PromptTokens.Add(float64(s.promptLen))
	met.GenerationTokens.Add(float64(s.generated()))
	if !s.firstScheduled.IsZero() {
		met.QueueTime.Observe(s.firstScheduled.Sub(s.arrival).Seconds())
		if !s.firstToken.IsZero() {
			met.PrefillTime.Observe(s.firstToken.Sub(s.firstScheduled).Seconds())
			met.DecodeTime.Observe(now.Sub(s.firstToken).Seconds())
		}
	}
}

// observe publishes the scheduler's gauges and the pool's counters.
func (e *Engine) observe() {
	met := e.cfg.Metrics
	if met == nil {
		return
	}
	st := e.pool.Stats()
	met.Running.Set(float64(len(e.running)))
	met.Waiting.Set(float64(len(e.waiting)))
	met.KVUsage.Set(st.Usage())
	met.PrefixQueries.Add(float64(st.Queries - e.last.Queries))
	met.PrefixHits.Add(float64(st.Hits - e.last.Hits))
	e.last = st
}
