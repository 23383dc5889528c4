package engine

import (
	"errors"
	"fmt"

	"tandem/hal"
	"tandem/kvcache"
	"tandem/model"
)

// A Forwarder runs one forward pass over a flattened batch: it computes the KV of b's tokens
// at their positions (b.Attn says where they go) and writes the logits of the positions in
// b.Outputs, one vocabulary-sized row each, in order, into logits. The model's forward pass on
// a hal backend is one; the sim backend's stand-in (package engine/simstep), which sleeps a
// modelled time and writes deterministic logits, is another. It must be batch-invariant: a
// sequence's logits depend on that sequence alone.
type Forwarder interface {
	Forward(b *model.Batch, logits []float32) error
}

// runnerForward is the model's own forward pass over a KV store.
type runnerForward struct {
	r  *model.Runner
	kv hal.KVStore
}

func (f runnerForward) Forward(b *model.Batch, logits []float32) error {
	return f.r.Forward(f.kv, b, logits)
}

// ModelForwarder is m's forward pass on be over a KV store of the given shape, allocated
// here; offline tools (tandem profile) time it with the same batches the engine builds.
func ModelForwarder(m *model.Model, be hal.Backend, blocks, blockSize int) (Forwarder, error) {
	kv, err := be.NewKVStore(m.KVLayout(blocks, blockSize))
	if err != nil {
		return nil, err
	}
	return runnerForward{model.NewRunner(m, be), kv}, nil
}

// NewWithForwarder builds an engine whose forward passes f runs; a PipelineForwarder that
// keeps more than one step in flight gets that many micro-batches (microbatch.go). m supplies the model's
// config (vocabulary, context length) and tokenizer (stop rules) only: its weights are not
// read, and no KV store is allocated, since f keeps whatever KV memory it needs. The
// scheduler, KV block pool, prefix cache and KV events are the real ones.
func NewWithForwarder(m *model.Model, f Forwarder, cfg Config) (*Engine, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if cfg.Tiers.Enabled() {
		return nil, errors.New("engine: lower KV tiers need a KV store; a modelled forward pass (the sim backend) or a pipeline's (its stages hold the KV) keeps none here (tandem simulate models the tiers)")
	}
	if cfg.Speculation.Method == SpecDraft {
		return nil, fmt.Errorf("engine: a modelled forward pass cannot run a draft model")
	}
	micro := 1
	pf, ok := f.(PipelineForwarder)
	if ok {
		micro = max(pf.InFlight(), 1)
		if cfg.Speculation.Method != "" && cfg.Speculation.Method != SpecOff {
			// Drafts would need their verify rows through every stage and a step in flight
			// to hold them back: not built.
			return nil, errors.New("engine: speculative decoding on a pipeline replica is not built")
		}
	}
	e := newEngine(m, cfg, kvcache.NewPool(cfg.KVBlocks, cfg.BlockSize), micro)
	e.fwd = f
	if ok {
		// Its KV lives in the pipeline's stages, each its layers': blocks move through its
		// BlockStore (gathered from and scattered to the stages), never in the sim format,
		// which would pass for a transfer without payload.
		e.held.ioOnce.Do(func() {
			e.held.ioErr = errPipelineKV
			if bs, ok := f.(BlockStore); ok {
				e.held.io, e.held.ioErr = newBlockStoreIO(bs)
			}
		})
		e.pipelineKV = true
	}
	if micro > 1 {
		e.pipe, e.flights = pf, make([]flight, micro)
	}
	return e, nil
}

// errPipelineKV is the block I/O error of a pipeline replica's engine whose forwarder has
// no BlockStore: KV exports refuse and imports fail (and are counted) instead of moving
// blocks without their payload.
var errPipelineKV = errors.New("engine: the KV lives in the pipeline's stages, and this forwarder cannot read or write its blocks")

// simBlockIO is the block reader and writer of an engine built with NewWithForwarder, which
// has no KV memory: its format is the model's layout in the modelled store SimStore, whose
// blocks export with an empty payload and import as bookkeeping only (hash checks, prefix
// cache, KV events). So the sim backend takes part in disaggregated serving through the real
// transfer path while moving no KV bytes; the worker models the time the real bytes
// (BlockBytes) would take.
func (e *Engine) simBlockIO() *blockIO {
	l := e.m.KVLayout(e.cfg.KVBlocks, e.cfg.BlockSize)
	return &blockIO{f: KVFormat{Store: SimStore, DType: kvDTypeName(l.DType), BlockSize: l.BlockSize, Layers: l.Layers, KVHeads: l.KVHeads, HeadDim: l.HeadDim}, batch: 1}
}
