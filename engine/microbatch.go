package engine

import (
	"fmt"
	"time"

	"tandem/llm"
	"tandem/model"
	"tandem/sched"
)

// A PipelineForwarder keeps several steps in flight, as a pipeline of stages does (package
// pipeline): while the last stage runs one step, the first runs the next. Launch starts a
// step over b; Land waits for the oldest step launched and writes its logits into logits
// (and b.Hidden). Steps land in the order they were launched, and the caller leaves each
// step's batch as it was until it landed. InFlight is how many steps it keeps in flight
// at most: the engine's micro-batches (sched.Config.MicroBatches).
type PipelineForwarder interface {
	Forwarder
	Launch(b *model.Batch) error
	Land(b *model.Batch, logits []float32) error
	InFlight() int
}

// A flight is a step in flight: its chunks (a copy: the plan is reused), its batch and
// the buffers its results land in.
type flight struct {
	chunks []sched.Chunk[*sequence]
	batch  model.Batch
	logits []float32
	hidden []float32
	failed error // the launch failed: land ends the step's sequences with it
	t0     time.Time
	shape  sched.StepShape // the plan's, for the ITL target's live cost
	over   bool            // the plan went over the ITL target
}

// pipelined reports whether the engine runs micro-batches.
func (e *Engine) pipelined() bool { return e.pipe != nil }

// pipeStep launches a step when fewer than the forwarder's steps are in flight and the
// scheduler plans one; otherwise it lands the oldest. progress is false when there was
// nothing to do.
func (e *Engine) pipeStep() (progress bool) {
	if e.flying < len(e.flights) {
		plan := e.sched.Schedule()
		e.plan = plan
		moved := e.planned(plan)
		if len(plan.Chunks) > 0 {
			e.launch(plan)
			return true
		}
		if moved {
			return true
		}
	}
	if e.flying == 0 {
		return false
	}
	e.land()
	return true
}

// launch puts plan's step in flight.
func (e *Engine) launch(plan *sched.Plan[*sequence]) {
	f := &e.flights[(e.first+e.flying)%len(e.flights)]
	e.flying++
	f.chunks = append(f.chunks[:0], plan.Chunks...)
	e.buildBatch(&f.batch, f.chunks, &f.hidden) // each flight keeps its logits: no wide buffer
	n := len(f.batch.Outputs) * e.m.Config.VocabSize
	if cap(f.logits) < n {
		f.logits = make([]float32, n)
	}
	f.logits = f.logits[:n]
	f.shape, f.over = plan.Shape, plan.OverTarget
	f.t0 = e.now()
	f.failed = e.pipe.Launch(&f.batch)
}

// land waits for the oldest step in flight and hands out what it computed.
func (e *Engine) land() {
	f := &e.flights[e.first]
	e.first = (e.first + 1) % len(e.flights)
	e.flying--
	err := f.failed
	if err == nil {
		err = e.pipe.Land(&f.batch, f.logits)
	}
	took := e.now().Sub(f.t0) // launch to land: the step's time through every stage
	e.stepDoneChunks(took, len(f.batch.Attn.Pos), f.chunks)
	e.timed(f.shape, f.over, took, err)
	if err != nil {
		e.sched.Land(f.chunks) // nothing was written; the sequences are aborted below
		e.stepFailed(f.chunks, err)
		return
	}
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.IterationTokens.Observe(float64(len(f.batch.Attn.Pos)))
	}
	e.sched.Land(f.chunks)
	e.committedChunks(f.chunks)
	e.sampleStep(f.chunks, &f.batch, f.logits)
}

// planned does a plan's bookkeeping (preemptions, drops, admissions) before its step
// runs, and reports whether it moved any sequence.
func (e *Engine) planned(plan *sched.Plan[*sequence]) bool {
	for _, s := range plan.Preempted {
		s.spec.draftLen = 0 // its blocks are gone, the draft model's KV with them
		e.queued.Add(1)
		if e.cfg.Metrics != nil {
			e.cfg.Metrics.Preemptions.Inc()
		}
		e.log.Debug("preempted", "seq", s.ID, "tokens", len(s.Tokens))
	}
	for _, s := range plan.Dropped {
		e.abort(s, fmt.Errorf("%w: the sequence no longer fits the KV cache", llm.ErrUnavailable))
	}
	if len(plan.Admitted) > 0 {
		now := time.Now()
		for _, s := range plan.Admitted {
			s.firstScheduled = now
			e.newSeqSampler(s)
		}
	}
	if n := len(plan.Admitted) + len(plan.Resumed); n > 0 {
		e.queued.Add(-int64(n))
	}
	if len(plan.Onboard) > 0 {
		e.startOnboard(plan.Onboard)
	}
	if e.tiers != nil {
		e.refreshLoadable(time.Now())
	}
	if e.cfg.OnPlan != nil && (len(plan.Chunks) > 0 || len(plan.Preempted) > 0 || len(plan.Dropped) > 0) {
		e.cfg.OnPlan(plan)
	}
	return len(plan.Preempted)+len(plan.Dropped)+len(plan.Admitted)+len(plan.Resumed) > 0
}

// outputsOf is the output rows chunk c has in its step's batch (buildBatch).
func outputsOf(c sched.Chunk[*sequence]) int {
	n := 0
	if r := c.Seq.rows; r != nil {
		lo, hi := r.span(c)
		n += hi - lo
	}
	if c.Samples() {
		n += 1 + c.Seq.Drafts // the sampling row and a drafting sequence's verify rows
	}
	return n
}
