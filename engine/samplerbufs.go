package engine

// samplerBufs lends samplers their vocabulary-sized buffers, so that a request allocates
// none (for a 152k-token vocabulary they came to 1.2–3.7 MB per request): one
// sampleScratch that all its samplers share, since they sample one at a time, and the
// penalty bookkeeping of sequences that ended, kept for the next ones that use penalties.
// The engine's step loop owns one; it is not safe for concurrent use, and its samplers
// must be used on the owner's goroutine too.
type samplerBufs struct {
	vocab   int
	scratch sampleScratch
	free    []*penalties // reset, ready for another sequence
	keep    int          // most kept in free: past it, ended sequences' bookkeeping is dropped
}

// newSamplerBufs lends buffers for a vocabulary of vocab tokens and keeps the penalty
// bookkeeping of up to keep ended sequences: as many as can run at once is enough for a
// steady load to allocate none, and bounds what a burst leaves behind.
func newSamplerBufs(vocab, keep int) *samplerBufs {
	return &samplerBufs{vocab: vocab, keep: keep}
}

// penalties returns cleared penalty bookkeeping: a kept one, or a new one.
func (b *samplerBufs) penalties() *penalties {
	if n := len(b.free); n > 0 {
		p := b.free[n-1]
		b.free[n-1] = nil
		b.free = b.free[:n-1]
		return p
	}
	return newPenalties(b.vocab)
}

// put takes back the buffers of s, a sampler of b's (others and nil are ignored), whose
// sequence has ended; s must not sample again.
func (b *samplerBufs) put(s *Sampler) {
	if s == nil || s.owner != b {
		return
	}
	if p := s.pen; p != nil && len(b.free) < b.keep {
		p.reset()
		b.free = append(b.free, p)
	}
	s.pen, s.sc, s.owner = nil, nil, nil
}

// newSeqSampler gives s its sampler, with buffers lent by the engine, when it is first
// admitted: from then on it is used on Run's goroutine only, and a request still waiting
// holds no vocabulary-sized buffer. It is kept through preemption (its RNG and penalty
// counts carry on), and given back by dropSampler when the sequence ends.
func (e *Engine) newSeqSampler(s *sequence) {
	if s.sampler == nil {
		s.sampler = resumedSampler(s.req, e.samplers)
	}
}

// dropSampler gives back the buffers of an ended sequence's sampler.
func (e *Engine) dropSampler(s *sequence) {
	e.samplers.put(s.sampler)
	s.sampler = nil
}

// seqEnded lets go of what an ended sequence (finished, aborted or dropped) holds besides
// its KV blocks: its sampler's buffers, and, for a prefill-only one, the exports waiting for
// blocks it will no longer compute.
func (e *Engine) seqEnded(s *sequence) {
	e.dropSampler(s)
	if s.hold != 0 {
		e.holdEnded(s.hold, s.stream.abandoned())
	}
}
