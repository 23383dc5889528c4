package pipeline

// The replica's KV blocks as one store (docs/pipeline.md, "Disaggregated"): a KV transfer
// reads and writes whole blocks, and every stage holds its layers' part of each. The head
// gathers a read from the stages and scatters a write to them over the links it already
// has, as a KV operation that travels in order with the steps: each stage reads or writes
// its part when the operation reaches it, after every step sent before it (so a block a
// step computed is read after that step wrote it in every stage, and a block written for an
// import is written before any step sent later reads it).
//
// A block's bytes, gathered, are the whole model's block in the store's format: the head's
// layers, then stage 1's, and so on, each layer its keys then its values (hal/cpu's
// cpu-kv/1 keeps a block layer by layer). So a replica's blocks are byte for byte those of
// one engine over the whole model, whatever the split, and the engines exchange them.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"tandem/hal"
	"tandem/llm"
)

// kvIDs numbers the KV operations of every head in the process (a result finds its caller
// by it; steps are matched by order, not id).
var kvIDs atomic.Uint64

// encoders are the KV operations' frame buffers (a few MiB each), kept between transfers.
var encoders = sync.Pool{New: func() any { return new(encoder) }}

// A kvWait is a KV operation waiting for its result.
type kvWait struct {
	take func(data []byte) error // a read's: copies the parts out (nil for a write)
	err  error
	done chan struct{}
}

// kvDone hands a KV result to its caller (nothing waits if the caller gave up).
func (hl *headLink) kvDone(r *kvResult) {
	hl.kvMu.Lock()
	w := hl.kvWaits[r.ID]
	delete(hl.kvWaits, r.ID)
	hl.kvMu.Unlock()
	if w == nil {
		return
	}
	switch {
	case r.Err != "":
		w.err = fmt.Errorf("pipeline: %s", r.Err)
	case w.take != nil:
		w.err = w.take(r.Data)
	}
	close(w.done)
}

// kvFail fails every KV operation waiting: the link broke.
func (hl *headLink) kvFail(err error) {
	hl.kvMu.Lock()
	ws := hl.kvWaits
	hl.kvWaits, hl.kvErr = nil, err
	hl.kvMu.Unlock()
	for _, w := range ws {
		w.err = err
		close(w.done)
	}
}

// KVLayout is the replica's KV layout: the head's store's, with the whole model's layers.
func (h *Head) KVLayout() hal.KVLayout {
	l := h.kv.Layout()
	l.Layers = h.cfg.Model.Config.Layers
	return l
}

// KVFormat is the format name of the replica's blocks: the head's store's. Every stage's
// store must read and write the same; a stage whose store differs fails the operations.
func (h *Head) KVFormat() string { return h.kv.Format() }

// partBytes is stage s's part of one block: its layers'.
func (h *Head) partBytes(s int) int {
	return h.kv.Layout().BlockBytes() / h.hello.Sizes[0] * h.hello.Sizes[s]
}

// ReadBlocks copies the blocks' bytes, whole (KVLayout().BlockBytes() each, in order), into
// dst: the head's part from its store, the others' from their stages. It fails with
// llm.ErrUnavailable while the replica is down or when the link breaks meanwhile.
func (h *Head) ReadBlocks(ctx context.Context, blocks []int32, dst []byte) error {
	whole, own := h.KVLayout().BlockBytes(), h.kv.Layout().BlockBytes()
	if len(dst) != len(blocks)*whole {
		return fmt.Errorf("pipeline: a read of %d KV blocks into %d bytes (%d a block)", len(blocks), len(dst), whole)
	}
	for i, b := range blocks {
		if err := h.kv.ReadBlock(int(b), dst[i*whole:i*whole+own]); err != nil {
			return fmt.Errorf("pipeline: stage 0: %w", err)
		}
	}
	h.met.KVBytes.WithLabelValues("read").Add(float64(len(blocks) * own))
	return h.kvCall(ctx, func(e *encoder, id uint64) []byte {
		return e.kv(&kvOp{ID: id, Format: h.KVFormat(), Blocks: blocks})
	}, func(data []byte) error {
		if len(data) != len(blocks)*(whole-own) {
			return fmt.Errorf("pipeline: the stages sent %d bytes for %d KV blocks, want %d", len(data), len(blocks), len(blocks)*(whole-own))
		}
		off := own
		for s := 1; s < h.Stages(); s++ {
			ps := h.partBytes(s)
			for i := range blocks {
				copy(dst[i*whole+off:i*whole+off+ps], data[:ps])
				data = data[ps:]
			}
			off += ps
		}
		return nil
	})
}

// WriteBlocks stores src, the blocks' bytes whole as ReadBlocks gives them, as blocks: the
// head's part in its store, the others' in their stages. It returns once every stage wrote
// its part; an error leaves the blocks' contents undefined.
func (h *Head) WriteBlocks(ctx context.Context, blocks []int32, src []byte) error {
	whole, own := h.KVLayout().BlockBytes(), h.kv.Layout().BlockBytes()
	if len(src) != len(blocks)*whole {
		return fmt.Errorf("pipeline: a write of %d KV blocks from %d bytes (%d a block)", len(blocks), len(src), whole)
	}
	for i, b := range blocks {
		if err := h.kv.WriteBlock(int(b), src[i*whole:i*whole+own]); err != nil {
			return fmt.Errorf("pipeline: stage 0: %w", err)
		}
	}
	h.met.KVBytes.WithLabelValues("write").Add(float64(len(blocks) * own))
	return h.kvCall(ctx, func(e *encoder, id uint64) []byte {
		// The stages' parts, stage by stage, straight from src into the frame.
		e.kvFields(&kvOp{ID: id, Write: true, Format: h.KVFormat(), Blocks: blocks})
		e.u32(uint32(len(blocks) * (whole - own)))
		off := own
		for s := 1; s < h.Stages(); s++ {
			ps := h.partBytes(s)
			for i := range blocks {
				e.buf = append(e.buf, src[i*whole+off:i*whole+off+ps]...)
			}
			off += ps
		}
		return e.end()
	}, nil)
}

// kvCall sends the KV operation frame encodes (with the id given) on the current link and
// waits for its result, which take (if set) consumes.
func (h *Head) kvCall(ctx context.Context, frame func(e *encoder, id uint64) []byte, take func(data []byte) error) error {
	h.mu.Lock()
	hl, down := h.cur, h.down
	h.mu.Unlock()
	if hl == nil {
		return fmt.Errorf("%w: %w", llm.ErrUnavailable, down)
	}
	id := kvIDs.Add(1)
	w := &kvWait{take: take, done: make(chan struct{})}
	hl.kvMu.Lock()
	if err := hl.kvErr; err != nil {
		hl.kvMu.Unlock()
		return err
	}
	if hl.kvWaits == nil {
		hl.kvWaits = map[uint64]*kvWait{}
	}
	hl.kvWaits[id] = w
	hl.kvMu.Unlock()

	e := encoders.Get().(*encoder)
	b := frame(e, id)
	hl.sendMu.Lock()
	err := hl.l.send(b)
	hl.sendMu.Unlock()
	encoders.Put(e)
	if err != nil {
		err = fmt.Errorf("pipeline: sending a KV operation to stage 1 at %s: %w", hl.l.addr, err)
		h.fail(hl, err)
		hl.kvFail(fmt.Errorf("%w: %w", llm.ErrUnavailable, err))
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		hl.kvMu.Lock()
		_, waiting := hl.kvWaits[id]
		delete(hl.kvWaits, id)
		hl.kvMu.Unlock()
		if !waiting {
			<-w.done // the reader has it, and may be copying into the caller's buffer
			return w.err
		}
		return ctx.Err()
	}
}
