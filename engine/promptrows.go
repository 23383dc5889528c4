package engine

import (
	"math"

	"tandem/llm"
	"tandem/model"
	"tandem/sched"
)

// Outputs at prompt positions: a request for prompt log-probabilities needs the logits of
// every prompt position, a mean-pooled embedding the hidden state of every one, and a
// last-token embedding the hidden state of the last. Such a sequence carries a promptRows;
// every other sequence has none, so the step loop pays one nil check per chunk for them.
//
// The rows of one chunk are its prompt positions before the last (the last prompt
// position is the chunk's sampling row, as for any sequence), from done on: a sequence
// recomputed after a preemption does not take again what it took. Their logits cost a
// vocabulary-wide product per position, which a mean-pooled embedding computes and drops
// (the model's forward pass yields hidden states only where it yields logits).

// promptRows is what a sequence collects at its prompt positions.
type promptRows struct {
	logprobs bool // prompt log-probabilities
	top      int  // alternatives per prompt token
	pool     llm.Pooling
	done     int // prompt positions taken: their outputs are in lps or sum

	lps  []llm.PromptLogprob // positions 1…done of the prompt
	sum  []float64           // mean pooling: the hidden states summed, in position order
	topC []cand              // scratch for the alternatives
}

// newPromptRows returns what req collects at its prompt positions, nil for a request
// that wants nothing there.
func newPromptRows(req *llm.Request) *promptRows {
	if !req.PromptLogprobs && req.Pooling == llm.PoolNone {
		return nil
	}
	r := &promptRows{logprobs: req.PromptLogprobs, top: min(max(req.PromptTopLogprobs, 0), llm.MaxTopLogprobs), pool: req.Pooling}
	if r.logprobs {
		r.lps = make([]llm.PromptLogprob, 0, len(req.Prompt))
	}
	return r
}

// extra reports whether the sequence wants rows before its sampling row.
func (r *promptRows) extra() bool { return r.logprobs || r.pool == llm.PoolMean }

// span is the range of c's positions whose rows r adds before c's sampling row.
func (r *promptRows) span(c sched.Chunk[*sequence]) (lo, hi int) {
	if !r.extra() {
		return 0, 0
	}
	lo = max(c.From, r.done)
	hi = min(c.From+c.N, c.Seq.PromptLen-1)
	return lo, max(lo, hi)
}

// addRows appends the output rows of chunk c, whose first token is at b.Tokens[at].
func (r *promptRows) addRows(b *model.Batch, c sched.Chunk[*sequence], at int) {
	lo, hi := r.span(c)
	for p := lo; p < hi; p++ {
		b.Outputs = append(b.Outputs, at+p-c.From)
	}
}

// takeRows consumes the rows addRows added for c, starting at output row out, from the
// step's logits and hidden states (rows of vocab and embd values), and returns the next
// output row.
func (e *Engine) takeRows(c sched.Chunk[*sequence], out int, logits, hidden []float32) int {
	s := c.Seq
	r := s.rows
	lo, hi := r.span(c)
	vocab, embd := e.m.Config.VocabSize, e.m.Config.Embd
	for p := lo; p < hi; p++ {
		if r.logprobs {
			r.lps = append(r.lps, r.promptLogprob(logits[out*vocab:(out+1)*vocab], s.Tokens[p+1]))
		}
		if r.pool == llm.PoolMean {
			r.add(hidden[out*embd : (out+1)*embd])
		}
		out++
	}
	if hi > r.done {
		r.done = hi
	}
	if r.done >= s.PromptLen-1 && r.pool != llm.PoolMean {
		s.NoPrefixMatch = false // a recompute may use the prefix cache again
	}
	return out
}

// add sums one position's hidden state into the mean.
func (r *promptRows) add(h []float32) {
	if r.sum == nil {
		r.sum = make([]float64, len(h))
	}
	for i, x := range h {
		r.sum[i] += float64(x)
	}
}

// promptLogprob is the log-probability of tok under row, the raw logits at the position
// before it, with its rank and the row's best alternatives.
func (r *promptRows) promptLogprob(row []float32, tok int32) llm.PromptLogprob {
	lmax := float32(math.Inf(-1))
	for _, x := range row {
		if x > lmax {
			lmax = x
		}
	}
	if math.IsInf(float64(lmax), 0) || lmax != lmax {
		lmax = 0
	}
	var sum float64
	m := float64(lmax)
	rank := 1
	t := row[tok]
	for _, x := range row {
		if x == x {
			sum += expDet(float64(x) - m)
		}
		if x > t {
			rank++
		}
	}
	logZ := m + math.Log(sum)
	lp := llm.PromptLogprob{Logprob: float32(float64(t) - logZ), Rank: rank}
	if r.top > 0 {
		if cap(r.topC) < r.top {
			r.topC = make([]cand, 0, r.top)
		}
		top := selectTop(row, r.top, r.topC)
		lp.Top = make([]llm.TokenLogprob, len(top))
		for i, c := range top {
			lp.Top[i] = llm.TokenLogprob{ID: c.id, Logprob: float32(float64(c.logit) - logZ)}
		}
	}
	return lp
}

// embedded ends an embedding sequence whose prompt is computed: last is the last prompt
// position's hidden state. Its one event carries the pooled state; nothing is generated.
func (e *Engine) embedded(s *sequence, last []float32) {
	r := s.rows
	vec := make([]float32, len(last))
	switch r.pool {
	case llm.PoolMean:
		r.add(last)
		n := float64(s.PromptLen)
		for i, x := range r.sum {
			vec[i] = float32(x / n)
		}
	default:
		copy(vec, last)
	}
	ev := llm.Event{Token: -1, Finish: llm.FinishStop, Usage: e.usage(s), Embedding: vec, Step: e.stepNo}
	e.finishKV(s)
	e.sched.Finish(s)
	e.seqEnded(s)
	s.stream.push(ev)
	e.finishMetrics(s, llm.FinishStop)
}

// endTokens are the tokens min_tokens holds back for req: its stop tokens and, unless it
// ignores them, the end-of-generation tokens.
func (e *Engine) endTokens(req *llm.Request) []int32 {
	if req.Sampling.MinTokens <= 0 {
		return nil
	}
	ends := append([]int32(nil), req.StopTokens...)
	if !req.IgnoreEOS && e.m.Tokenizer != nil {
		ends = append(ends, e.m.Tokenizer.EOGTokens()...)
	}
	return ends
}
