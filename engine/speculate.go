package engine

import (
	"errors"
	"fmt"
	"time"

	"tandem/hal"
	"tandem/llm"
	"tandem/model"
)

// Speculation configures speculative decoding by prompt lookup: before a step, a decoding
// sequence whose last tokens occurred earlier in its prompt or output drafts the tokens
// that followed them there; the step computes the sequence's last token and the drafts in
// one chunk with an output at each, and the sampler, run over those rows in order exactly
// as it would run over successive decode steps, keeps the drafts up to the first one it
// does not pick, plus its own pick after them. So the tokens are those of plain decoding
// for every sampling setting (greedy or seeded sampling: a draft from a lookup is one token
// with probability 1, for which the exact acceptance rule of speculative sampling reduces
// to drawing from the target and comparing), and a step yields 1 to Tokens+1 of them.
//
// With Method "draft" the drafts come from a smaller model of the same vocabulary instead
// (Draft), run greedily for the drafting sequences over its own KV store, which shares the
// target's block tables; its tokens are kept or not by the same rule.
type Speculation struct {
	// Method is "" or "off" (none), "ngram" (prompt lookup decoding) or "draft" (a draft
	// model).
	Method string
	// Draft is the draft model of Method "draft": the target's vocabulary, run on the
	// engine's backend.
	Draft *model.Model
	// Tokens is the most tokens drafted per step (default 4).
	Tokens int
	// MinN and MaxN bound the length of the suffix looked up (default 1 and 3): the
	// longest that occurred before wins, its latest occurrence.
	MinN, MaxN int
	// MaxBatch: sequences draft only while at most this many run (default 8); a large
	// batch is compute-bound already and verifying drafts would slow it.
	MaxBatch int
	// MinAcceptance: a sequence whose drafts were accepted less than this share of the
	// time (measured over its last 32 drafted tokens) stops drafting for 64 tokens
	// (default 0.25), so that text that does not repeat costs no wasted rows.
	MinAcceptance float64
}

// Speculation methods.
const (
	SpecOff   = "off"
	SpecNGram = "ngram"
	SpecDraft = "draft"
)

// SpecMethods are the methods Speculation.Method may name.
var SpecMethods = []string{SpecOff, SpecNGram, SpecDraft}

const (
	specWindow = 32 // drafted tokens per acceptance measurement
	specPause  = 64 // tokens a sequence of low acceptance does not draft
)

func (c *Speculation) fill() error {
	switch c.Method {
	case "", SpecOff:
		c.Method = SpecOff
		return nil
	case SpecNGram:
	case SpecDraft:
		if c.Draft == nil {
			return errors.New("engine: speculation by a draft model needs the draft model")
		}
	default:
		return fmt.Errorf("engine: unknown speculation method %q (want one of %v)", c.Method, SpecMethods)
	}
	if c.Tokens <= 0 {
		c.Tokens = 4
	}
	if c.MinN <= 0 {
		c.MinN = 1
	}
	if c.MaxN <= 0 {
		c.MaxN = 3
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 8
	}
	if c.MinAcceptance == 0 {
		c.MinAcceptance = 0.25
	}
	switch {
	case c.Tokens > 64:
		return fmt.Errorf("engine: %d speculative tokens per step (at most 64)", c.Tokens)
	case c.MinN > c.MaxN:
		return fmt.Errorf("engine: speculation n-gram lengths %d..%d", c.MinN, c.MaxN)
	case c.MinAcceptance < 0 || c.MinAcceptance > 1:
		return fmt.Errorf("engine: speculation minimum acceptance %v (want 0..1)", c.MinAcceptance)
	}
	return nil
}

// seqSpec is a sequence's speculative decoding state.
type seqSpec struct {
	out     int      // this step: the output row of its first verify row
	rows    int      // this step: its verify rows (drafts + 1)
	samples []Sample // this step: the sampler's picks over its verify rows
	// The acceptance measured over the current window, and the generated count before
	// which it does not draft (a pause after a low acceptance).
	drafted, accepted int
	pausedUntil       int
	// draftLen is how many of its positions hold the draft model's KV for its tokens.
	draftLen int
}

// specState is the engine's speculative decoding totals (Run's).
type specState struct {
	drafted, accepted uint64

	// The draft model's forward pass (Method "draft"), its KV store laid out as the
	// target's pool, and its scratch.
	draft       *model.Runner
	draftKV     hal.KVStore
	draftBatch  model.Batch
	draftLogits []float32
	drafting    []*sequence
	want, pass  []int // draftModel's: drafts wanted per sequence, the sequences of a pass
	failLogged  bool  // a failed draft pass was logged
}

// draft appends drafted tokens to the running sequences that may speculate this step.
func (e *Engine) draft() {
	c := &e.cfg.Speculation
	if c.Method == SpecOff {
		return
	}
	running := e.sched.Running()
	if len(running) > c.MaxBatch {
		return
	}
	drafting := e.spec.drafting[:0]
	for _, s := range running {
		if !e.mayDraft(s) {
			continue
		}
		k := min(c.Tokens, s.stop.maxTokens-s.Generated()-1, e.m.Config.ContextLen-len(s.Tokens)-1)
		if k <= 0 {
			continue
		}
		if c.Method == SpecDraft {
			// The draft model writes its KV up to the last draft's position: those
			// slots must be the sequence's. A pool too full to give them drafts nothing.
			if len(s.Tokens)+k > c.Draft.Config.ContextLen || s.KV.Reserve(k) != nil {
				continue
			}
			s.Drafts = k // the count wanted; draftModel appends them
			drafting = append(drafting, s)
			continue
		}
		n := len(s.Tokens)
		s.Tokens = promptLookup(s.Tokens, c.MinN, c.MaxN, k)
		s.Drafts = len(s.Tokens) - n
	}
	e.spec.drafting = drafting
	if len(drafting) > 0 {
		e.draftModel(drafting)
	}
	clear(drafting)
}

// draftModel drafts with the draft model for the sequences given, each wanting s.Drafts
// tokens: a first pass computes each one's draft KV from where it stopped up to its last
// token and yields its first draft; every further pass feeds the last draft (greedy) and
// yields the next. A failed pass drops the drafts (the target decodes without them).
func (e *Engine) draftModel(seqs []*sequence) {
	sp := &e.spec
	dm := e.cfg.Speculation.Draft
	vocab := dm.Config.VocabSize
	want := sp.want[:0]
	for _, s := range seqs {
		want = append(want, s.Drafts)
		s.Drafts = 0
	}
	sp.want = want
	for {
		b := &sp.draftBatch
		b.Tokens, b.Outputs = b.Tokens[:0], b.Outputs[:0]
		b.Attn.Pos, b.Attn.SeqOf, b.Attn.Blocks = b.Attn.Pos[:0], b.Attn.SeqOf[:0], b.Attn.Blocks[:0]
		active := sp.pass[:0] // indexes into seqs of this pass
		for i, s := range seqs {
			if s.Drafts >= want[i] {
				continue
			}
			seq := int32(len(b.Attn.Blocks))
			b.Attn.Blocks = append(b.Attn.Blocks, s.KV.Blocks())
			for p := min(s.spec.draftLen, len(s.Tokens)-1); p < len(s.Tokens); p++ {
				b.Tokens = append(b.Tokens, s.Tokens[p])
				b.Attn.Pos = append(b.Attn.Pos, int32(p))
				b.Attn.SeqOf = append(b.Attn.SeqOf, seq)
			}
			b.Outputs = append(b.Outputs, len(b.Tokens)-1)
			active = append(active, i)
		}
		sp.pass = active
		if len(active) == 0 {
			return
		}
		if need := len(b.Outputs) * vocab; cap(sp.draftLogits) < need {
			sp.draftLogits = make([]float32, need)
		}
		logits := sp.draftLogits[:len(b.Outputs)*vocab]
		if err := sp.draft.Forward(sp.draftKV, b, logits); err != nil {
			for _, i := range active {
				s := seqs[i]
				s.Tokens, s.Drafts = s.Tokens[:len(s.Tokens)-s.Drafts], 0
			}
			if e.cfg.Metrics != nil {
				e.cfg.Metrics.SpecDraftFailures.Inc()
			}
			if !sp.failLogged {
				sp.failLogged = true
				e.log.Warn("the draft model's forward pass failed: those steps decode without drafts (counted in tandem:spec_decode_draft_failures_total; logged once)", "err", err)
			}
			return
		}
		for o, i := range active {
			s := seqs[i]
			s.spec.draftLen = len(s.Tokens)
			s.Tokens = append(s.Tokens, argmax(logits[o*vocab:(o+1)*vocab]))
			s.Drafts++
		}
	}
}

// sameVocabulary checks that the draft model d speaks the target m's tokens: the same
// number of logits and, where both have tokenizers, the same text for every id (a draft of
// another vocabulary would only ever be rejected).
func sameVocabulary(m, d *model.Model) error {
	if d.Config.VocabSize != m.Config.VocabSize {
		return fmt.Errorf("engine: the draft model's vocabulary has %d tokens, the model's %d: they must be the same", d.Config.VocabSize, m.Config.VocabSize)
	}
	mt, dt := m.Tokenizer, d.Tokenizer
	if mt == nil || dt == nil {
		return nil
	}
	if mt.VocabSize() != dt.VocabSize() {
		return fmt.Errorf("engine: the draft model's tokenizer has %d tokens, the model's %d", dt.VocabSize(), mt.VocabSize())
	}
	for id := range int32(mt.VocabSize()) {
		if mt.TokenText(id) != dt.TokenText(id) {
			return fmt.Errorf("engine: token %d is %q to the draft model, %q to the model: not the same vocabulary", id, dt.TokenText(id), mt.TokenText(id))
		}
	}
	return nil
}

// argmax is the index of the largest value, the lowest on ties.
func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// mayDraft reports whether s drafts this step: a decoding sequence (its last token the
// only one without KV) whose request allows it and whose output is token by token only
// (no alternatives' logprobs, prompt rows, grammar or KV hold), not paused.
func (e *Engine) mayDraft(s *sequence) bool {
	r := s.req
	switch {
	case r.NoSpeculation || r.Sampling.TopLogprobs > 0 || r.Pooling != llm.PoolNone || s.rows != nil || s.grammar != nil || s.hold != 0:
		return false
	case s.Drafts != 0 || s.KV == nil || s.Generated() < 1 || s.KV.Len() != len(s.Tokens)-1:
		return false
	case s.Generated() < s.spec.pausedUntil:
		return false
	}
	return true
}

// verify runs the samplers of the drafting sequences over their verify rows, in order,
// keeping the drafts up to the first the sampler does not pick: their Tokens are cut to
// the accepted ones before the scheduler commits the step's KV, and emitVerified sends
// the picks after it.
func (e *Engine) verify(logits []float32) {
	vocab := e.m.Config.VocabSize
	met := e.cfg.Metrics
	for _, c := range e.plan.Chunks {
		s := c.Seq
		k := s.Drafts
		if k == 0 {
			continue
		}
		base := len(s.Tokens) - k
		s.spec.samples, s.spec.rows = s.spec.samples[:0], k+1
		accepted := 0
		for j := 0; j <= k; j++ {
			row := s.spec.out + j
			pick := s.sampler.Sample(logits[row*vocab : (row+1)*vocab])
			s.spec.samples = append(s.spec.samples, pick)
			if j == k || pick.ID != s.Tokens[base+j] || s.sampler.constraintErr() != nil {
				break
			}
			accepted++
		}
		s.Tokens = s.Tokens[:base+accepted] // the accepted drafts' KV is committed
		s.Drafts = 0
		s.spec.draftLen = min(s.spec.draftLen, len(s.Tokens)) // the rejected drafts' draft KV is stale
		e.spec.drafted += uint64(k)
		e.spec.accepted += uint64(accepted)
		s.spec.drafted += k
		s.spec.accepted += accepted
		if s.spec.drafted >= specWindow {
			if float64(s.spec.accepted) < e.cfg.Speculation.MinAcceptance*float64(s.spec.drafted) {
				s.spec.pausedUntil = s.Generated() + specPause
			}
			s.spec.drafted, s.spec.accepted = 0, 0
		}
		if met != nil {
			met.SpecDrafts.Inc()
			met.SpecDraftTokens.Add(float64(k))
			met.SpecAcceptedTokens.Add(float64(accepted))
			met.SpecAcceptanceRate.Set(float64(e.spec.accepted) / float64(e.spec.drafted))
		}
	}
}

// emitVerified sends a drafting sequence's picks (the accepted drafts and the pick after
// them), stopping where a stop rule ends the sequence.
func (e *Engine) emitVerified(s *sequence, now time.Time) {
	picks := s.spec.samples
	s.Tokens = s.Tokens[:len(s.Tokens)-(len(picks)-1)] // emit appends them again
	for _, p := range picks {
		e.emit(s, p, now)
		if !s.Running() {
			break
		}
	}
	s.spec.samples = s.spec.samples[:0]
}

// promptLookup appends to tokens the k tokens that followed the latest earlier occurrence
// of its longest suffix of maxN … minN tokens that occurred before (prompt lookup
// decoding), and returns it; nothing when no suffix occurred before.
func promptLookup(tokens []int32, minN, maxN, k int) []int32 {
	n := len(tokens)
	for l := min(maxN, n-1); l >= minN && l >= 1; l-- {
		suffix := tokens[n-l:]
		// The latest start i < n-l whose l tokens match the suffix, with a token after.
	search:
		for i := n - l - 1; i >= 0; i-- {
			for j := range l {
				if tokens[i+j] != suffix[j] {
					continue search
				}
			}
			// What followed, running on into the drafts themselves where the match ends
			// near the end: a repeating stretch drafts its next period.
			for p := i + l; p < i+l+k; p++ {
				tokens = append(tokens, tokens[p])
			}
			return tokens
		}
	}
	return tokens
}
