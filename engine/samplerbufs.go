package engine

import (
	"container/list"
	"errors"
	"fmt"
	"sync"

	"tandem/grammar"
	"tandem/llm"
	"tandem/tokenizer"
)

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
		s.sampler = resumedSampler(s.req, e.samplers, s.grammar, e.endTokens(s.req))
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

// constraintFailed ends a sequence whose grammar allowed no token of the vocabulary: the
// client gets the error, the failure is counted and logged.
func (e *Engine) constraintFailed(s *sequence, err error) {
	e.abort(s, err)
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.ConstraintFailures.Inc()
	}
	e.log.Warn("constrained generation failed", "seq", s.ID, "err", err)
}

// grammarCache compiles the grammars of constrained requests against the engine's
// vocabulary: the vocabulary trie is built on the first constrained request, and each
// grammar text is compiled once while it stays among the most recently used, so that
// the masks its earlier requests computed serve the later ones (an agent sends the same
// schema again and again). It is safe for concurrent use.
type grammarCache struct {
	tok   *tokenizer.Tokenizer
	vocab int // the model's vocabulary size: the logits' length

	once sync.Once
	v    *grammar.Vocab

	mu      sync.Mutex
	byText  map[string]*list.Element // → *grammarEntry
	recent  list.List                // most recent first
	maxKept int
}

type grammarEntry struct {
	text  string
	bound *grammar.Bound
}

// grammarCacheSize is how many compiled grammars an engine keeps.
const grammarCacheSize = 64

func newGrammarCache(tok *tokenizer.Tokenizer, vocab int) *grammarCache {
	return &grammarCache{tok: tok, vocab: vocab, byText: map[string]*list.Element{}, maxKept: grammarCacheSize}
}

// vocabulary builds the grammar vocabulary once: each token's bytes (control tokens
// have none), and the end-of-generation tokens.
func (c *grammarCache) vocabulary() *grammar.Vocab {
	c.once.Do(func() {
		n := c.tok.VocabSize()
		c.v = grammar.NewVocab(c.vocab, func(id int32) []byte {
			if int(id) >= n {
				return nil // padding beyond the tokenizer's vocabulary
			}
			return c.tok.Piece(id)
		}, c.tok.EOGTokens())
	})
	return c.v
}

// bind returns req's grammar bound to the vocabulary (nil without a constraint), with
// the request's own earlier output (Resumed) checked against it. Errors wrap
// llm.ErrInvalid.
func (c *grammarCache) bind(req *llm.Request) (*grammar.Bound, error) {
	text := req.Constraint.Grammar
	if text == "" {
		return nil, nil
	}
	if c.tok == nil {
		return nil, fmt.Errorf("%w: this engine has no tokenizer, so it cannot follow a grammar", llm.ErrInvalid)
	}
	c.mu.Lock()
	if el, ok := c.byText[text]; ok {
		c.recent.MoveToFront(el)
		b := el.Value.(*grammarEntry).bound
		c.mu.Unlock()
		return b, c.replay(b, req)
	}
	c.mu.Unlock()
	g, err := grammar.ParseGBNF(text)
	if err != nil {
		return nil, fmt.Errorf("%w: constraint: %v", llm.ErrInvalid, err)
	}
	cg, err := grammar.Compile(g)
	if err != nil {
		return nil, fmt.Errorf("%w: constraint: %v", llm.ErrInvalid, err)
	}
	b := grammar.Bind(cg, c.vocabulary())
	b.Warm() // the first masks, on the caller's goroutine rather than the step loop's
	c.mu.Lock()
	if el, ok := c.byText[text]; ok { // compiled meanwhile by another request
		b = el.Value.(*grammarEntry).bound
	} else {
		c.byText[text] = c.recent.PushFront(&grammarEntry{text: text, bound: b})
		for c.recent.Len() > c.maxKept {
			old := c.recent.Back()
			c.recent.Remove(old)
			delete(c.byText, old.Value.(*grammarEntry).text)
		}
	}
	c.mu.Unlock()
	return b, c.replay(b, req)
}

// replay checks that the resumed tail of req's prompt (its own earlier output) follows
// the grammar, as it must have where it was generated.
func (c *grammarCache) replay(b *grammar.Bound, req *llm.Request) error {
	if req.Resumed == 0 {
		return nil
	}
	m := b.NewMatcher()
	for i, id := range req.Prompt[len(req.Prompt)-req.Resumed:] {
		if err := m.Accept(id); err != nil {
			return fmt.Errorf("%w: resumed token %d does not follow the constraint: %v", llm.ErrInvalid, i, errors.Unwrap(err))
		}
	}
	return nil
}
