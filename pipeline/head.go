package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tandem/hal"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/orpc"
)

// HeadConfig describes the head of a pipeline replica: the first stage, in the engine's
// process. The engine's forward passes go through the Head (an engine.Forwarder).
type HeadConfig struct {
	Model   *model.Model // stage 0, loaded with model.LoadStage
	Backend hal.Backend
	Name    string // the served model name, which every stage must serve
	// BlockSize and Blocks shape every stage's KV store: the engine's pool.
	BlockSize, Blocks int
	Next              string // stage 1's address
	Identity          *orpc.Identity
	Metrics           *metrics.Pipeline
	Logger            *slog.Logger
	// Retry is how often a lost link is dialled again (0: every second).
	Retry time.Duration
	// MicroBatches is the steps kept in flight (0: one a stage, so that every stage has
	// a step to run; 1: one step at a time, each stage waiting for the others).
	MicroBatches int
	// Changed, if set, is called when the replica goes down or serves again (Err), so that
	// routers hear of it at once.
	Changed func()
}

// Head runs stage 0 and sends each step on through the other stages; see HeadConfig.
type Head struct {
	cfg    HeadConfig
	log    *slog.Logger
	met    *metrics.Pipeline
	runner *model.Runner
	kv     hal.KVStore
	hello  hello

	mu   sync.Mutex
	cur  *headLink // nil while down
	down error     // why the link is down; nil while up

	// Owned by Forward's caller (the engine's goroutine).
	flight []*headLink // the links of the steps launched and not landed, oldest first
	id     uint64
	enc    encoder
	st     step
	hidden []float32
}

// A headLink is the link to stage 1 and the goroutine that reads its results.
type headLink struct {
	l       *link
	sendMu  sync.Mutex   // steps (the engine's goroutine) and KV operations (transfers') share the link
	results chan *result // in step order; closed when the link broke
	free    chan *result
	err     error // why results closed; set before it is

	kvMu    sync.Mutex
	kvWaits map[uint64]*kvWait // KV operations sent, by id, until their result comes
	kvErr   error              // set when the link broke: no operation waits any more
}

// NewHead allocates the head's KV store and opens the link through every stage: it fails,
// naming the stage, when one is missing or refuses the replica.
func NewHead(ctx context.Context, cfg HeadConfig) (*Head, error) {
	st := cfg.Model.Stage
	switch {
	case st.Whole() || !st.First():
		return nil, fmt.Errorf("pipeline: the head runs stage 0 of several, not %s", st)
	case cfg.Next == "":
		return nil, errors.New("pipeline: the head needs stage 1's address")
	case cfg.Identity == nil:
		return nil, errors.New("pipeline: the head needs the replica's identity")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewPipeline(nil)
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	m := cfg.Model
	kv, err := cfg.Backend.NewKVStore(m.KVLayout(cfg.Blocks, cfg.BlockSize))
	if err != nil {
		return nil, fmt.Errorf("pipeline: the head's KV store: %w", err)
	}
	h := &Head{cfg: cfg, log: cfg.Logger, met: cfg.Metrics, runner: model.NewRunner(m, cfg.Backend), kv: kv,
		hello: hello{Version: Version, Model: cfg.Name, Shape: modelShape(m), Sizes: m.Split, Index: 1,
			BlockSize: cfg.BlockSize, Blocks: cfg.Blocks, KVType: m.KVType}}
	hl, err := h.open(ctx)
	if err != nil {
		return nil, err
	}
	h.cur = hl
	h.met.LinkUp.Set(1)
	return h, nil
}

// Stages is the replica's stage count.
func (h *Head) Stages() int { return len(h.hello.Sizes) }

// Split is the layers of each stage.
func (h *Head) Split() []int { return h.hello.Sizes }

// open dials stage 1 and starts the link's reader.
func (h *Head) open(ctx context.Context) (*headLink, error) {
	l, err := dial(ctx, h.cfg.Next, h.cfg.Identity, &h.hello)
	if err != nil {
		reason := "dial"
		if errors.Is(err, ErrRefused) {
			reason = "refused"
		}
		h.met.LinkFailures.WithLabelValues(reason).Inc()
		return nil, err
	}
	n := h.InFlight()
	hl := &headLink{l: l, results: make(chan *result, n), free: make(chan *result, n)}
	for range n {
		hl.free <- new(result)
	}
	go hl.read(h)
	return hl, nil
}

// read passes the link's results on in order, and the KV operations' results to their
// callers, until it breaks; then the replica is down.
func (hl *headLink) read(h *Head) {
	var kr kvResult
	for {
		typ, p, err := hl.l.recvFrame()
		if err == nil {
			switch typ {
			case frameResult:
				res := <-hl.free
				if err = decodeResult(p, res); err == nil {
					hl.results <- res
				}
			case frameKVResult:
				if err = decodeKVResult(p, &kr); err == nil {
					hl.kvDone(&kr)
				}
			default:
				err = fmt.Errorf("%w: frame type %d for a result", errFrame, typ)
			}
		}
		if err != nil {
			hl.err = fmt.Errorf("pipeline: the link to stage 1 at %s was lost (a stage stopped or the network failed): %v", hl.l.addr, err) // %v: not io.EOF, which callers read as a clean end
			close(hl.results)
			hl.kvFail(fmt.Errorf("%w: %w", llm.ErrUnavailable, hl.err))
			h.fail(hl, hl.err)
			return
		}
	}
}

// fail marks the replica down because link hl broke (once per link).
func (h *Head) fail(hl *headLink, err error) {
	h.mu.Lock()
	if h.cur != hl {
		h.mu.Unlock()
		return
	}
	hl.l.close()
	h.cur, h.down = nil, err
	h.mu.Unlock()
	h.changed()
	h.met.LinkUp.Set(0)
	h.met.LinkFailures.WithLabelValues("lost").Inc()
	h.log.Error("pipeline replica down: its requests fail (and migrate when a router sent them) until every stage answers again", "err", err)
}

func (h *Head) changed() {
	if h.cfg.Changed != nil {
		h.cfg.Changed()
	}
}

// Err is nil while the replica serves, and otherwise why not.
func (h *Head) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down != nil {
		return fmt.Errorf("%w: %w", llm.ErrUnavailable, h.down)
	}
	return nil
}

// Run dials the link again whenever it is down, until ctx ends. Before it serves again,
// rejoined is called (the engine drops its KV: a restarted stage lost its part of it); an
// error from it leaves the replica down, to try again.
func (h *Head) Run(ctx context.Context, rejoined func(context.Context) error) {
	t := time.NewTicker(h.cfg.Retry)
	defer t.Stop()
	logged := ""
	for {
		select {
		case <-ctx.Done():
			h.mu.Lock()
			if h.cur != nil {
				h.cur.l.close()
			}
			h.mu.Unlock()
			return
		case <-t.C:
		}
		if h.Err() == nil {
			continue
		}
		hl, err := h.open(ctx)
		if err == nil && rejoined != nil {
			if err = rejoined(ctx); err != nil {
				hl.l.close()
			}
		}
		if err != nil {
			if msg := err.Error(); msg != logged {
				h.log.Warn("pipeline replica still down", "err", err) // once per reason
				logged = msg
			}
			continue
		}
		logged = ""
		h.mu.Lock()
		h.cur, h.down = hl, nil
		h.mu.Unlock()
		h.changed()
		h.met.LinkUp.Set(1)
		h.met.Rejoins.Inc()
		h.log.Info("pipeline replica serves again: every stage answered", "next", h.cfg.Next)
	}
}

// Forward runs a step through every stage (engine.Forwarder): stage 0 here, then the
// others, the last of which sends back the logits (and the hidden states of b.Hidden).
func (h *Head) Forward(b *model.Batch, logits []float32) error {
	if err := h.Launch(b); err != nil {
		return err
	}
	return h.Land(b, logits)
}

// InFlight is the steps the head keeps in flight (engine.PipelineForwarder): one a stage,
// so that while the last stage runs a step the first runs another.
func (h *Head) InFlight() int {
	if h.cfg.MicroBatches > 0 {
		return h.cfg.MicroBatches
	}
	return h.Stages()
}

// Launch runs stage 0 over b and sends the step on (engine.PipelineForwarder); Land
// collects its result. At most InFlight steps are in flight.
func (h *Head) Launch(b *model.Batch) error {
	if len(h.flight) >= h.InFlight() {
		return fmt.Errorf("pipeline: %d steps in flight already", len(h.flight))
	}
	hl, err := h.launch(b)
	if err != nil {
		return err
	}
	h.flight = append(h.flight, hl)
	return nil
}

// Land waits for the oldest step launched and writes its logits into logits (and its
// hidden states into b.Hidden): b is the batch it was launched with.
func (h *Head) Land(b *model.Batch, logits []float32) error {
	if len(h.flight) == 0 {
		return errors.New("pipeline: no step in flight")
	}
	hl := h.flight[0]
	h.flight = append(h.flight[:0], h.flight[1:]...)
	return h.land(hl, b, logits)
}

// launch runs stage 0 over b and sends the step on.
func (h *Head) launch(b *model.Batch) (*headLink, error) {
	h.mu.Lock()
	hl, down := h.cur, h.down
	h.mu.Unlock()
	if hl == nil {
		h.met.StepsFailed.Inc()
		return nil, fmt.Errorf("%w: %w", llm.ErrUnavailable, down)
	}
	m := h.cfg.Model
	n, embd := len(b.Tokens), m.Config.Embd
	if cap(h.hidden) < n*embd {
		h.hidden = make([]float32, n*embd)
	}
	if err := h.runner.ForwardStage(h.kv, b, nil, h.hidden[:n*embd], nil); err != nil {
		return nil, err
	}
	h.id++
	st := &h.st
	*st = step{ID: h.id, WantHidden: b.Hidden != nil, Pos: b.Attn.Pos, SeqOf: b.Attn.SeqOf, Blocks: b.Attn.Blocks,
		Outputs: b.Outputs, Hidden: h.hidden[:n*embd]}
	frame := h.enc.step(st)
	hl.sendMu.Lock()
	err := hl.l.send(frame)
	hl.sendMu.Unlock()
	if err != nil {
		err = fmt.Errorf("pipeline: sending a step to stage 1 at %s: %w", hl.l.addr, err)
		h.fail(hl, err)
		h.met.StepsFailed.Inc()
		return nil, fmt.Errorf("%w: %w", llm.ErrUnavailable, err)
	}
	h.met.Steps.Inc()
	h.met.BytesSent.Add(float64(len(frame)))
	return hl, nil
}

// land waits for the result of the oldest step in flight on hl and copies it out.
func (h *Head) land(hl *headLink, b *model.Batch, logits []float32) error {
	res, ok := <-hl.results
	if !ok {
		h.met.StepsFailed.Inc()
		return fmt.Errorf("%w: %w", llm.ErrUnavailable, hl.err)
	}
	defer func() { hl.free <- res }()
	vocab, embd := h.cfg.Model.Config.VocabSize, h.cfg.Model.Config.Embd
	switch {
	case res.Err != "":
		h.met.StepsFailed.Inc()
		return fmt.Errorf("pipeline: %s", res.Err)
	case len(res.Logits) != len(b.Outputs)*vocab || b.Hidden != nil && len(res.Hidden) != len(b.Outputs)*embd:
		h.met.StepsFailed.Inc()
		return fmt.Errorf("pipeline: the last stage sent %d logits and %d hidden values for %d outputs", len(res.Logits), len(res.Hidden), len(b.Outputs))
	}
	copy(logits, res.Logits)
	if b.Hidden != nil {
		copy(b.Hidden, res.Hidden)
	}
	return nil
}

// Close ends the link.
func (h *Head) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil {
		h.cur.l.close()
	}
}
