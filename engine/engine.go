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
	"tandem/kvtier"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/sched"
)

// Config sizes the scheduler.
type Config struct {
	MaxBatchTokens int    // token budget of one step, prefill chunks and decode tokens together
	MaxSeqs        int    // most sequences running at once
	MaxQueue       int    // most requests waiting; past it Generate returns llm.ErrQueueFull
	BlockSize      int    // KV positions per block
	KVBlocks       int    // blocks in the KV pool
	Salt           uint64 // block hash salt (kvcache.Salt of model, namespace, LoRA)
	// ITLTarget, with Cost, bounds the predicted time of a step that carries decode tokens
	// (sched.Config.ITLTarget): prompts are read in the chunks that keep the streams at
	// their pace. ITLDecodes, when positive, sets the target at every step to that many
	// times what the step's decodes alone take, as the corrected cost predicts them
	// (sched.Config.ITLDecodes). Cost is the forward step's profile (a sim.Timing fitted
	// by tandem profile, or at start); the engine corrects it with every step it measures
	// (sched.LiveCost). No target or no Cost: the token budget alone cuts prompt chunks.
	ITLTarget  time.Duration
	ITLDecodes float64
	Cost       sched.CostModel
	// StepClock times the forward passes (the cost model's correction and Stats' last
	// step); nil is the wall clock. Tests whose forward step runs on a virtual clock give
	// it here.
	StepClock interface{ Now() time.Time }
	Metrics   *metrics.Engine
	Logger    *slog.Logger
	// ServedName is the model's served name, which with a LoRA adapter's name and content
	// makes the block hash salt of the adapter's sequences; MaxAdapters is how many
	// adapters keep their weights in memory at once (0: DefaultMaxAdapters).
	ServedName  string
	MaxAdapters int
	// Speculation configures speculative decoding (speculate.go); the zero value is off.
	Speculation Speculation
	// OnPlan, if set, is called by Run's goroutine with each step's plan (its String is
	// what package sched's tests print) before the forward pass, when the plan runs or
	// preempts or drops a sequence; the plan is valid during the call only. Tests compare
	// the engine's schedule with the simulator's through it.
	OnPlan func(plan fmt.Stringer)

	// Tiers are the KV cache's lower tiers (docs/kv-tiers.md): host memory, a disk
	// directory, a shared directory; the zero value has none. ModelID fingerprints the
	// weights, which their block files record (blocks of other weights are never read).
	Tiers   kvtier.Config
	ModelID uint64
	// Loaders is the number of goroutines that onboard blocks from lower tiers (0: 4).
	Loaders     int
	TierMetrics *metrics.KVTiers
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
// sequences with prefill chunks of new ones under a token budget (the policy
// is package sched's). One goroutine (Run) owns all scheduling state;
// Generate only queues.
type Engine struct {
	cfg    Config
	m      *model.Model
	runner *model.Runner // nil with NewWithForwarder
	kv     hal.KVStore   // nil with NewWithForwarder
	fwd    Forwarder
	pipe   PipelineForwarder // with micro-batches (microbatch.go); nil: one step at a time
	// pipelineKV: the forward pass is a pipeline's (a PipelineForwarder), whose stages hold
	// the KV and the layers: no block I/O here, no LoRA adapters.
	pipelineKV bool
	pool       *kvcache.Pool
	log        *slog.Logger

	mu      sync.Mutex
	inbox   []*sequence
	stopped bool
	queued  atomic.Int64 // inbox + waiting, for the queue bound
	// inboxN and inboxTok are the requests of the inbox and their prompt tokens, for Stats:
	// added by Generate, taken off by publish once the census counts them.
	inboxN    atomic.Int64
	inboxTok  atomic.Int64
	wake      chan struct{}
	resets    chan chan struct{} // Reset's requests, each closed when done
	idleTimer *time.Timer        // see Run
	nextID    uint64

	// Owned by Run.
	sched  *sched.Scheduler[*sequence]
	plan   *sched.Plan[*sequence] // the step being run
	gone   []*sequence            // reap's list of abandoned sequences
	logits []float32
	wide   []float32 // logits of steps with prompt rows (promptrows.go), dropped after them
	hidden []float32 // hidden states of steps with an embedding
	batch  model.Batch
	last   kvcache.Stats
	cost   *sched.LiveCost // the step cost the ITL target reads, corrected by each step; nil without one
	drift  [2]bool         // costDrift's warnings given, for prefill-only and decode-only steps
	// With micro-batches: the steps in flight, a ring of pipe.InFlight() from first.
	flights       []flight
	first, flying int
	// intaken and intakenN are the tokens and the number of the requests intake moved into
	// the scheduler since the last publish, which then counts them in the census instead of
	// inboxTok and inboxN.
	intaken, intakenN int
	// stepNo numbers the scheduler's iterations (docs/routing.md, "A report against the
	// events the router has seen"): a request's first and last events carry the step they
	// happen in, and the census published at the top of the next iteration is its. It
	// starts at 1.
	stepNo uint64

	samplers *samplerBufs  // lends the sequences' samplers their buffers; Run's (samplerbufs.go)
	grammars *grammarCache // constrained requests' compiled grammars (samplerbufs.go)

	adapters adapterTable // LoRA adapters by name (lora.go)
	spec     specState    // speculative decoding's counters and scratch (speculate.go)

	stats statsBox  // published by Run for Stats
	held  heldTable // prefill-only sequences' blocks, pinned for a KV transfer (kvexport.go)
	// lost guards epoch, the count of Resets: a KV transfer that read or wrote blocks
	// across one moved KV a restarted stage no longer holds (kvexport.go).
	lost  sync.RWMutex
	epoch uint64

	tiers   *kvtier.Tiers // lower tiers' stores; nil without (tiers.go)
	onboard onboard
}

// sequence is one request in the engine: the scheduler's record (ID, priority, tokens,
// KV block table) and what serving it takes besides.
type sequence struct {
	sched.Seq
	req     *llm.Request
	stream  *stream
	sampler *Sampler
	grammar *grammar.Bound // the request's constraint; nil: none
	stop    stopRules
	hold    uint64         // prefill-only: at finish, pin the blocks under this handle (kvexport.go)
	rows    *promptRows    // outputs at prompt positions (promptrows.go); nil: none
	adapter *model.Adapter // the LoRA adapter it runs with; nil: the base model
	spec    seqSpec        // its speculative decoding (speculate.go)
	// inboxHits is the prompt tokens expected from the prefix cache when it was submitted
	// (sched.ExpectedHits), which the load report takes off while it is in the inbox.
	inboxHits int

	arrival, firstScheduled, firstToken, lastToken time.Time
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
	pool := kvcache.NewPool(cfg.KVBlocks, cfg.BlockSize)
	var tiers *kvtier.Tiers
	if cfg.Tiers.Enabled() {
		if pool, tiers, err = newTieredPool(cfg, kv); err != nil {
			return nil, err
		}
	}
	e := newEngine(m, cfg, pool, 1)
	e.tiers = tiers
	e.runner, e.kv = model.NewRunner(m, be), kv
	e.fwd = runnerForward{e.runner, kv}
	if d := cfg.Speculation.Draft; cfg.Speculation.Method == SpecDraft {
		if err := sameVocabulary(m, d); err != nil {
			return nil, err
		}
		if e.spec.draftKV, err = be.NewKVStore(d.KVLayout(cfg.KVBlocks, cfg.BlockSize)); err != nil {
			return nil, fmt.Errorf("engine: the draft model's KV: %w", err)
		}
		e.spec.draft = model.NewRunner(d, be)
	}
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
	if cfg.Loaders <= 0 {
		cfg.Loaders = 4
	}
	if cfg.MaxAdapters <= 0 {
		cfg.MaxAdapters = DefaultMaxAdapters
	}
	return cfg.Speculation.fill()
}

// newEngine builds the engine's state for cfg, which fill has checked, over pool; micro is
// the steps in flight at once (sched.Config.MicroBatches; 1: one at a time).
func newEngine(m *model.Model, cfg Config, pool *kvcache.Pool, micro int) *Engine {
	e := &Engine{
		cfg:  cfg,
		m:    m,
		pool: pool,
		log:  cfg.Logger,
		wake: make(chan struct{}, 1), resets: make(chan chan struct{}), idleTimer: time.NewTimer(time.Hour),
		stepNo: 1,

		samplers: newSamplerBufs(m.Config.VocabSize, cfg.MaxSeqs),
		grammars: newGrammarCache(m.Tokenizer, m.Config.VocabSize),
		onboard:  onboard{queue: make(chan *sequence, cfg.MaxSeqs)},
		adapters: adapterTable{max: cfg.MaxAdapters, byName: map[string]*adapterEntry{}},
	}
	sc := sched.Config{MaxBatchTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs, Salt: cfg.Salt}
	if (cfg.ITLTarget > 0 || cfg.ITLDecodes > 0) && cfg.Cost != nil {
		e.cost = sched.NewLiveCost(cfg.Cost)
		sc.ITLTarget, sc.ITLDecodes, sc.Cost = cfg.ITLTarget, cfg.ITLDecodes, e.cost
		if cfg.Metrics != nil {
			for _, g := range cfg.Metrics.StepCostFactor {
				g.Set(1)
			}
		}
	}
	var err error
	sc.MicroBatches = micro
	e.sched, err = sched.New[*sequence](sc, e.pool)
	if err != nil {
		panic("engine: " + err.Error()) // fill made the sizes positive
	}
	return e
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
	case !e.sched.Fits(len(req.Prompt)):
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
	switch {
	case req.Pooling != llm.PoolNone && !slices.Contains(llm.Poolings, req.Pooling):
		return nil, fmt.Errorf("%w: unknown pooling %q", llm.ErrInvalid, req.Pooling)
	case req.Pooling != llm.PoolNone && (req.PromptLogprobs || req.Resumed > 0 || hold != 0):
		return nil, fmt.Errorf("%w: an embedding request generates nothing: no prompt logprobs, resumed tokens or KV hold", llm.ErrInvalid)
	case req.PromptTopLogprobs < 0 || req.PromptTopLogprobs > llm.MaxTopLogprobs:
		return nil, fmt.Errorf("%w: prompt top logprobs must be in [0, %d], got %d", llm.ErrInvalid, llm.MaxTopLogprobs, req.PromptTopLogprobs)
	}
	gram, err := e.grammars.bind(req)
	if err != nil {
		return nil, err
	}
	var adapter *model.Adapter
	var salt uint64
	if req.Adapter != "" {
		if req.Pooling != llm.PoolNone {
			return nil, fmt.Errorf("%w: embeddings are of the base model: no LoRA adapter", llm.ErrInvalid)
		}
		if adapter, salt, err = e.useAdapter(req.Adapter); err != nil {
			return nil, err
		}
	}
	seq := &sequence{
		Seq:     sched.Seq{Priority: req.Priority, Tokens: slices.Clone(req.Prompt), PromptLen: len(req.Prompt)},
		req:     req,
		grammar: gram,
		stream:  newStream(e.signal),
		stop: stopRules{tok: e.m.Tokenizer, stopTokens: req.StopTokens, ignoreEOS: req.IgnoreEOS,
			maxTokens: maxNewTokens(c.ContextLen, len(req.Prompt), req.MaxTokens)},
		arrival: req.Arrival,
		hold:    hold,
		rows:    newPromptRows(req),
		adapter: adapter,
	}
	seq.Salt = salt
	seq.NoPrefixMatch = req.PromptLogprobs || req.Pooling == llm.PoolMean
	if seq.arrival.IsZero() {
		seq.arrival = time.Now()
	}
	seq.stream.cancelled = ctx.Done()
	// The load report counts the request from now, less the cache hits it is expected to
	// find (a router's report nudged at its arrival must not count a cached prompt whole).
	seq.inboxHits, _ = sched.ExpectedHits(e.pool, cmp.Or(salt, e.cfg.Salt), seq.Tokens, nil)
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
	seq.ID = e.nextID
	e.inbox = append(e.inbox, seq)
	e.queued.Add(1)
	e.inboxN.Add(1)
	e.inboxTok.Add(int64(len(seq.Tokens) - seq.inboxHits))
	e.mu.Unlock()
	context.AfterFunc(ctx, func() { seq.stream.Close() })
	e.signal()
	return seq.stream, nil
}

// Run schedules and executes steps until ctx is done; then it fails every
// queued and running request with llm.ErrUnavailable.
func (e *Engine) Run(ctx context.Context) error {
	if e.tiers != nil {
		tctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { e.tiers.Run(tctx) })
		e.startLoaders(tctx, e.cfg.Loaders)
		defer func() { // after shutdown: no sequence waits for a load any more
			stop()
			e.stopLoaders()
			wg.Wait()
			if err := e.tiers.Close(); err != nil {
				e.log.Error("closing the KV tiers", "err", err)
			}
		}()
	}
	defer e.shutdown()
	for {
		e.intake()
		e.onboarded()
		e.reap()
		e.serveResets()
		e.observe()
		e.publish()
		if e.sched.Idle() && e.flying == 0 {
			select {
			case <-e.wake:
				continue
			case done := <-e.resets:
				e.reset(done)
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var progress bool
		if e.pipelined() {
			progress = e.pipeStep()
		} else {
			var err error
			if progress, err = e.step(); err != nil {
				return err
			}
		}
		if !progress {
			// Sequences wait and none can be admitted (their blocks are taken, by held
			// prefills for example): wait for a change instead of spinning. Most changes
			// signal (a request, a closed stream, a released hold); the timer bounds the
			// wait for any that does not.
			if !e.idleTimer.Stop() {
				select {
				case <-e.idleTimer.C:
				default:
				}
			}
			e.idleTimer.Reset(stalledPoll)
			select {
			case <-e.wake:
			case <-e.idleTimer.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// Reset fails every running sequence with llm.ErrUnavailable and drops the prefix cache:
// the KV its blocks held is gone (a pipeline stage restarted with an empty store). Queued
// requests stay, and will recompute their prompts. It returns when Run's goroutine has
// done it.
func (e *Engine) Reset(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case e.resets <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serveResets serves the Reset calls waiting.
func (e *Engine) serveResets() {
	for {
		select {
		case done := <-e.resets:
			e.reset(done)
		default:
			return
		}
	}
}

func (e *Engine) reset(done chan struct{}) {
	defer close(done)
	err := fmt.Errorf("%w: the replica's KV cache was lost (a pipeline stage restarted)", llm.ErrUnavailable)
	running := slices.Clone(e.sched.Running())
	for _, s := range running {
		e.abort(s, err)
	}
	e.lostKV()
	e.log.Warn("the KV cache was reset: running requests failed, the prefix cache dropped", "failed", len(running))
}

// stalledPoll bounds how long a stalled scheduler (work waiting, none admissible) waits
// before it looks again without a signal.
const stalledPoll = 20 * time.Millisecond

func (e *Engine) shutdown() {
	e.mu.Lock()
	e.stopped = true
	inbox := e.inbox
	e.inbox = nil
	e.inboxTok.Store(0)
	e.inboxN.Store(0)
	e.mu.Unlock()
	err := fmt.Errorf("%w: the engine stopped", llm.ErrUnavailable)
	var loading []*sequence
	for _, s := range e.sched.Onboarding() {
		if !s.Leaving() {
			loading = append(loading, s)
		}
	}
	for _, s := range slices.Concat(inbox, e.sched.Waiting(), e.sched.Running(), loading) {
		e.sched.Finish(s) // releases its blocks (an onboarding one's when its loads end)
		s.stream.fail(err)
		e.seqEnded(s)
	}
}

// intake moves new requests into the scheduler's waiting queue, ordered by
// priority and then arrival.
func (e *Engine) intake() {
	e.mu.Lock()
	inbox := e.inbox
	e.inbox = nil
	e.mu.Unlock()
	for _, s := range inbox {
		e.sched.Add(s)
		e.intaken += len(s.Tokens) - s.inboxHits // publish takes them off inboxTok
		e.intakenN++
	}
}

// reap frees the sequences whose streams were abandoned.
func (e *Engine) reap() {
	for _, list := range [3][]*sequence{e.sched.Running(), e.sched.Waiting(), e.sched.Onboarding()} {
		for _, s := range list {
			if s.stream.abandoned() && !s.Leaving() {
				e.gone = append(e.gone, s)
			}
		}
	}
	for _, s := range e.gone {
		if s.Waiting() {
			e.queued.Add(-1)
		}
		e.sched.Finish(s)
		e.seqEnded(s)
		e.finishMetrics(s, llm.FinishAbort)
	}
	clear(e.gone)
	e.gone = e.gone[:0]
}

// step schedules one batch (package sched), runs it and hands out the sampled
// tokens. A preempted sequence goes back to the waiting queue and will
// recompute its tokens (mostly from the prefix cache); its output does not
// change because the kernels are batch-invariant and it keeps its sampler.
// step schedules and runs one step. progress is false when the plan did nothing at all:
// no tokens, preemptions, drops or admissions.
func (e *Engine) step() (progress bool, err error) {
	e.draft()
	plan := e.sched.Schedule()
	e.plan = plan
	moved := e.planned(plan)
	if len(plan.Chunks) == 0 {
		return moved, nil
	}
	return true, e.execute(plan)
}

func (e *Engine) execute(plan *sched.Plan[*sequence]) error {
	b := &e.batch
	rows := e.buildBatch(b, plan.Chunks, &e.hidden)
	logits := e.stepLogits(len(b.Outputs)*e.m.Config.VocabSize, rows)
	t0 := e.now()
	err := e.fwd.Forward(b, logits)
	took := e.now().Sub(t0)
	e.stepDone(took, len(b.Tokens))
	e.timed(plan.Shape, plan.OverTarget, took, err)
	if err != nil {
		e.stepFailed(plan.Chunks, err)
		return nil
	}
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.IterationTokens.Observe(float64(len(b.Tokens)))
	}
	e.verify(logits) // the drafts' acceptance decides what Commit commits
	e.sched.Commit()
	e.committed() // before sampling: KV exports waiting for these blocks go on at once
	e.sampleStep(plan.Chunks, b, logits)
	return nil
}

// buildBatch lays chunks out in b (and, for a step with an embedding, b.Hidden in
// *hidden); rows reports whether a chunk wants outputs at prompt positions.
func (e *Engine) buildBatch(b *model.Batch, chunks []sched.Chunk[*sequence], hidden *[]float32) (rows bool) {
	b.Tokens, b.Outputs = b.Tokens[:0], b.Outputs[:0]
	b.Attn.Pos, b.Attn.SeqOf, b.Attn.Blocks = b.Attn.Pos[:0], b.Attn.SeqOf[:0], b.Attn.Blocks[:0]
	b.Adapters = b.Adapters[:0]
	embeds, adapted := false, false
	for i, c := range chunks {
		s := c.Seq
		b.Attn.Blocks = append(b.Attn.Blocks, s.KV.Blocks())
		b.Adapters = append(b.Adapters, s.adapter)
		adapted = adapted || s.adapter != nil
		at := len(b.Tokens)
		for p := c.From; p < c.From+c.N; p++ {
			b.Tokens = append(b.Tokens, s.Tokens[p])
			b.Attn.Pos = append(b.Attn.Pos, int32(p))
			b.Attn.SeqOf = append(b.Attn.SeqOf, int32(i))
		}
		if s.rows != nil {
			s.rows.addRows(b, c, at)
			rows, embeds = true, embeds || s.rows.pool != llm.PoolNone
		}
		if c.Samples() {
			s.spec.out = len(b.Outputs)
			for j := s.Drafts; j >= 0; j-- { // a drafting sequence's verify rows (speculate.go)
				b.Outputs = append(b.Outputs, len(b.Tokens)-1-j)
			}
		}
	}
	if !adapted {
		clear(b.Adapters)
		b.Adapters = b.Adapters[:0]
	}
	b.Hidden = nil
	if embeds {
		if need := len(b.Outputs) * e.m.Config.Embd; cap(*hidden) < need {
			*hidden = make([]float32, need)
		}
		b.Hidden = (*hidden)[:len(b.Outputs)*e.m.Config.Embd]
	}
	return rows
}

// timed records a step's time against the ITL target and corrects the live step cost by
// it (shape and over are the plan's Shape and OverTarget).
func (e *Engine) timed(shape sched.StepShape, over bool, took time.Duration, err error) {
	if over {
		e.overTarget()
		if e.cfg.Metrics != nil {
			e.cfg.Metrics.StepsOverTarget.Inc()
		}
	}
	if err == nil && e.cost != nil {
		e.cost.Observe(shape, took)
		e.costDrift()
	}
}

// stepFailed ends the sequences of a step whose forward pass failed.
func (e *Engine) stepFailed(chunks []sched.Chunk[*sequence], err error) {
	err = fmt.Errorf("engine: forward pass: %w", err)
	for _, c := range chunks {
		if c.Seq.Running() {
			e.abort(c.Seq, err)
		}
	}
	e.log.Error("forward pass failed", "err", err)
}

// sampleStep hands out what a step computed: prompt rows, embeddings and sampled tokens.
// A sequence that ended while the step was in flight (micro-batches) is skipped.
func (e *Engine) sampleStep(chunks []sched.Chunk[*sequence], b *model.Batch, logits []float32) {
	vocab := e.m.Config.VocabSize
	out := 0
	now := time.Now()
	for _, c := range chunks {
		s := c.Seq
		if !s.Running() {
			out += outputsOf(c)
			continue
		}
		if len(s.spec.samples) > 0 {
			out += s.spec.rows
			e.emitVerified(s, now)
			continue
		}
		if s.rows != nil {
			out = e.takeRows(c, out, logits, b.Hidden)
		}
		if !c.Samples() {
			continue
		}
		if s.req.Pooling != llm.PoolNone {
			embd := e.m.Config.Embd
			e.embedded(s, b.Hidden[out*embd:(out+1)*embd])
			out++
			continue
		}
		sample := s.sampler.Sample(logits[out*vocab : (out+1)*vocab])
		out++
		if err := s.sampler.constraintErr(); err != nil {
			e.constraintFailed(s, err)
			continue
		}
		e.emit(s, sample, now)
	}
}

// emit appends a sampled token, sends it, and finishes the sequence when a
// stop rule says so.
func (e *Engine) emit(s *sequence, sample Sample, now time.Time) {
	s.Tokens = append(s.Tokens, sample.ID)
	ev := llm.Event{Token: sample.ID, Logprob: sample.Logprob}
	if len(sample.Top) > 0 {
		ev.Top = slices.Clone(sample.Top)
	}
	if met := e.cfg.Metrics; met != nil {
		if s.firstToken.IsZero() {
			met.TTFT.Observe(now.Sub(s.arrival).Seconds())
		} else {
			itl := now.Sub(s.lastToken).Seconds()
			met.ITL.Observe(itl)
			met.TPOT.Observe(itl)
		}
	}
	if s.firstToken.IsZero() {
		s.firstToken = now
		ev.Step = e.stepNo
		if s.rows != nil && s.rows.logprobs {
			ev.PromptLogprobs, s.rows.lps = s.rows.lps, nil
		}
	}
	s.lastToken = now
	finish := s.stop.finish(sample.ID, s.Generated())
	if finish == "" && s.sampler.constraintDone() {
		finish = llm.FinishStop // the grammar's text is complete
	}
	if finish == "" {
		s.stream.push(ev)
		return
	}
	ev.Finish = finish
	ev.Usage = e.usage(s)
	ev.Step = e.stepNo
	e.finishKV(s) // before the event: a prefill caller may use the held blocks at once
	e.sched.Finish(s)
	e.seqEnded(s)
	s.stream.push(ev)
	e.finishMetrics(s, finish)
}

// abort ends a sequence that cannot continue.
func (e *Engine) abort(s *sequence, err error) {
	s.stream.fail(err)
	e.sched.Finish(s)
	e.seqEnded(s)
	e.finishMetrics(s, llm.FinishAbort)
}

func (e *Engine) usage(s *sequence) llm.Usage {
	return llm.Usage{PromptTokens: s.PromptLen, CachedTokens: s.Cached(), CompletionTokens: s.Generated()}
}

// stepLogits is the logits buffer of a step of n values: the engine's kept one, or, for
// a step with prompt rows (which may want a row per prompt token, hundreds of MB for a
// large vocabulary), a wider one kept only while such steps follow one another.
func (e *Engine) stepLogits(n int, rows bool) []float32 {
	if !rows {
		e.wide = nil
		if cap(e.logits) < n {
			e.logits = make([]float32, n)
		}
		return e.logits[:n]
	}
	if n <= cap(e.logits) {
		return e.logits[:n]
	}
	if cap(e.wide) < n {
		e.wide = make([]float32, n)
	}
	return e.wide[:n]
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
	met.RequestPrompt.Observe(float64(s.PromptLen))
	met.RequestGenerated.Observe(float64(s.Generated()))
	met.PromptTokens.Add(float64(s.PromptLen))
	met.GenerationTokens.Add(float64(s.Generated()))
	if !s.firstScheduled.IsZero() {
		met.QueueTime.Observe(s.firstScheduled.Sub(s.arrival).Seconds())
		if !s.firstToken.IsZero() {
			met.PrefillTime.Observe(s.firstToken.Sub(s.firstScheduled).Seconds())
			met.DecodeTime.Observe(now.Sub(s.firstToken).Seconds())
		}
		met.InferenceTime.Observe(now.Sub(s.firstScheduled).Seconds())
	}
}

// now is the step clock's time.
func (e *Engine) now() time.Time {
	if e.cfg.StepClock != nil {
		return e.cfg.StepClock.Now()
	}
	return time.Now()
}

// costKinds name the kinds of step the correction tells apart (sched.LiveCost).
var costKinds = [3]string{"prefill", "decode", "mixed"}

// costDriftFactor is how far the live correction of the step cost may move from the
// profile before the engine says, once per kind of step, that the profile is stale.
const costDriftFactor = 2.0

// costDrift exports the correction of the step cost and logs, once per kind of step
// (prefill-only, decode-only), a factor beyond costDriftFactor: the profile no longer
// describes the machine (or never did), and the target is held by the correction alone.
// The mixed steps' fit is not warned about: on a CPU it sits well under the profile's
// additive prediction by nature (the weights are read once for both parts).
func (e *Engine) costDrift() {
	p, d, m := e.cost.Correction()
	for i, f := range [3]float64{p, d, m} {
		if e.cfg.Metrics != nil {
			e.cfg.Metrics.StepCostFactor[i].Set(f)
		}
		if i < 2 && !e.drift[i] && (f > costDriftFactor || f < 1/costDriftFactor) {
			e.drift[i] = true
			e.log.Warn("the step cost profile is off for the steps the engine measures; correcting it live",
				"steps", costKinds[i], "factor", f)
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
	met.Running.Set(float64(len(e.sched.Running())))
	met.Waiting.Set(float64(len(e.sched.Waiting())))
	met.KVUsage.Set(st.Usage())
	met.GPUCacheUsage.Set(st.Usage())
	met.PrefixQueries.Add(float64(st.Queries - e.last.Queries))
	met.PrefixHits.Add(float64(st.Hits - e.last.Hits))
	e.last = st
}
