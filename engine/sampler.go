package engine

// Token sampling.
//
// A Sampler turns one row of logits into one token id. Per call to Sample the
// logits go through these steps, in this order:
//
//  1. logit bias: LogitBias[id] is added to logits[id];
//  2. penalties: for every id seen in the prompt or generated so far, the
//     repetition penalty (HF/vLLM: logit > 0 → logit/p, else logit·p); then,
//     for ids generated so far (not prompt-only ids), the OpenAI frequency
//     penalty (logit −= count·f) and presence penalty (logit −= p);
//  3. token limits: outside AllowedTokens (when set), and, until MinTokens tokens
//     are generated, the end tokens (end-of-generation and stop tokens), logits
//     become −Inf; then the grammar (a constrained request, llm.Constraint): the
//     logits of the tokens the grammar does not allow next become −Inf;
//  4. sanitising: NaN → −Inf, +Inf → MaxFloat32; the argmax is found here
//     (ties go to the lowest id). If every logit is −Inf the row is treated
//     as all zeros (uniform; with a grammar, uniform over the allowed tokens);
//  5. logprobs (if asked for): log-softmax of these logits — the model's
//     distribution after bias, penalties and the grammar, before temperature
//     and the truncation filters (vLLM's default, OpenAI-compatible semantics);
//  6. one uniform draw from the sequence's RNG (always, also when greedy);
//  7. greedy: if Temperature < 1e-5 (vLLM's epsilon) or TopK == 1, the argmax;
//  8. temperature: probabilities ∝ exp((logit − max)/T);
//  9. top-k: keep the k best tokens;
//  10. top-p: of those, keep the smallest prefix (best first) whose
//     cumulative probability, renormalised over what is left, is ≥ p;
//  11. min-p: drop tokens whose probability is < min_p · p_max;
//  12. sample from what is left, renormalised, by inverse CDF with the draw.
//
// Tokens are ranked by logit descending, then id ascending; that ranking
// defines the top-k set, the top-p prefix and the TopLogprobs order, so ties
// are resolved deterministically. (The order in which the kept tokens are
// walked for the inverse CDF is fixed by the algorithm too: id order, the
// sorted top-k, or the nucleus quickselect's partition order.)
//
// Determinism: the n-th call to Sample or Accept on a Sampler (counting from
// 0) consumes the n-th output of a splitmix64 generator seeded with Seed, and
// every floating-point operation that influences the choice of token is done
// with an explicitly rounded, fused-multiply-add-free sequence of IEEE
// operations and a portable exp (expDet), so the same seed and the same
// logits give the same tokens on every platform. Because Accept also
// consumes a draw, a sequence rebuilt after preemption (NewSampler with the
// same prompt and seed, then Accept for each token already generated)
// continues exactly as the original would have. A grammar's state advances on
// every token recorded (Sample or Accept), so a rebuilt sequence replays its
// tokens through the grammar too.

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"tandem/grammar"
	"tandem/llm"
)

// greedyEpsilon: temperatures below this sample greedily (as vLLM does).
const greedyEpsilon = 1e-5

// SamplingParams configures a Sampler; it is the API's contract type.
type SamplingParams = llm.SamplingParams

// TokenLogprob is a token id with its log-probability.
type TokenLogprob = llm.TokenLogprob

// Sample is the outcome of one sampling step.
type Sample struct {
	ID int32
	// Logprob is the chosen token's log-probability under the model's
	// distribution after logit bias and penalties, before temperature and
	// top-k/top-p/min-p (vLLM's default). 0 unless Logprobs or TopLogprobs
	// was asked for.
	Logprob float32
	// Top holds the TopLogprobs most likely tokens under the same
	// distribution, best first (ties: lower id first). The slice is owned by
	// the Sampler's scratch and valid until its next Sample call (for a
	// sampler lent buffers by a samplerBufs, until the next Sample of any of
	// its samplers); copy it to keep it.
	Top []TokenLogprob
}

// cand is a candidate token for the truncation filters, with its sampling
// weight once known.
type cand struct {
	w     float64
	id    int32
	logit float32
}

// Sampler samples the tokens of one sequence. It holds the sequence's RNG
// and its penalty bookkeeping, and works in scratch buffers sized for the
// vocabulary, so Sample allocates nothing. A sampler from NewSampler owns
// its buffers; the engine's samplers borrow theirs from the engine
// (samplerBufs), so that a request allocates none. It is not safe for
// concurrent use.
type Sampler struct {
	vocab int
	seed  uint64
	rng   uint64 // splitmix64 state
	n     int    // tokens recorded (Sample + Accept)

	greedy bool
	invT   float64
	topK   int     // 0: disabled
	topP   float64 // 1: disabled
	minP   float64 // 0: disabled
	nTop   int
	wantLP bool

	bias []biasEntry // sorted by id

	// Penalties (only when enabled).
	pen      *penalties // nil: disabled
	rep      float32    // 1: disabled
	presence float32
	freq     float32

	// Token limits: the tokens that may be sampled (one bit per id; nil: all), and the
	// end tokens that may not be sampled while fewer than minTokens are recorded.
	allowed   []uint64
	minTokens int
	ends      []int32

	// The grammar of a constrained request (nil: none), and the first error it met:
	// a token it refused, or no token of the vocabulary allowed.
	gram    *grammar.Matcher
	gramErr error

	sc    *sampleScratch // nil once given back to owner
	owner *samplerBufs   // where sc and pen came from; nil: they are the sampler's own

	// sumT1 caches Σ exp(logit − max) over the whole vocabulary when a
	// sampling path computed it at T = 1, so logprobs need no second pass.
	sumT1      float64
	sumT1Valid bool
}

type biasEntry struct {
	id int32
	v  float32
}

// penalties is one sequence's penalty bookkeeping.
type penalties struct {
	counts     []int32  // generated-token counts by id
	promptSeen []uint64 // bitset of prompt ids
	touched    []int32  // ids in the prompt or generated, each once; cap = vocab
}

func newPenalties(vocab int) *penalties {
	return &penalties{counts: make([]int32, vocab), promptSeen: make([]uint64, (vocab+63)/64), touched: make([]int32, 0, vocab)}
}

// addPrompt records that id is in the prompt.
func (p *penalties) addPrompt(id int32) {
	if !p.inPrompt(id) {
		p.promptSeen[id>>6] |= 1 << (id & 63)
		p.touched = append(p.touched, id)
	}
}

// addGenerated counts one more generation of id.
func (p *penalties) addGenerated(id int32) {
	if p.counts[id] == 0 && !p.inPrompt(id) {
		p.touched = append(p.touched, id) // at most vocab distinct ids: never grows past cap
	}
	p.counts[id]++
}

func (p *penalties) inPrompt(id int32) bool { return p.promptSeen[id>>6]&(1<<(id&63)) != 0 }

// reset clears p for another sequence, in time proportional to the ids it
// touched: every non-zero count and prompt bit belongs to a touched id.
func (p *penalties) reset() {
	for _, id := range p.touched {
		p.counts[id] = 0
		p.promptSeen[id>>6] = 0 // the word's other set bits are touched ids too
	}
	p.touched = p.touched[:0]
}

// sampleScratch is what Sample works in. Nothing in it outlives a call
// (except Top, handed out), so samplers that sample one at a time can share
// one: the engine's step loop lends one to all its sequences.
type sampleScratch struct {
	cands []cand    // top-k / top-p candidates (cap ≥ k, or vocab)
	w     []float64 // weights by id when neither top-k nor top-p is on
	topC  []cand
	top   []TokenLogprob
	mask  []uint64 // the grammar's allowed tokens, one bit per id
}

// fit grows sc to what s needs.
func (sc *sampleScratch) fit(s *Sampler) {
	if !s.greedy {
		switch {
		case s.topK > 0:
			if cap(sc.cands) < s.topK {
				sc.cands = make([]cand, 0, s.topK)
			}
		case s.topP < 1:
			if cap(sc.cands) < s.vocab {
				sc.cands = make([]cand, 0, s.vocab)
			}
		default:
			if len(sc.w) < s.vocab {
				sc.w = make([]float64, s.vocab)
			}
		}
	}
	if s.gram != nil && len(sc.mask) < (s.vocab+63)/64 {
		sc.mask = make([]uint64, (s.vocab+63)/64)
	}
	if s.nTop > 0 {
		if cap(sc.topC) < s.nTop {
			sc.topC = make([]cand, 0, s.nTop)
		}
		if len(sc.top) < s.nTop {
			sc.top = make([]TokenLogprob, s.nTop)
		}
	}
}

// NewSampler prepares sampling for one sequence with vocabSize tokens. p
// should have passed Validate; out-of-range values are clamped or ignored
// rather than causing a panic. prompt feeds the repetition penalty.
func NewSampler(p SamplingParams, vocabSize int, prompt []int32) *Sampler {
	return newSampler(p, vocabSize, prompt, nil, nil)
}

// newSampler is NewSampler with its buffers lent by b, or its own if b is nil, and
// constrained by g's grammar when g is not nil (g's vocabulary must be vocabSize tokens).
func newSampler(p SamplingParams, vocabSize int, prompt []int32, b *samplerBufs, g *grammar.Bound) *Sampler {
	if vocabSize <= 0 {
		panic("engine: NewSampler: vocabulary size must be positive")
	}
	s := &Sampler{vocab: vocabSize}
	if p.HasSeed {
		s.seed = p.Seed
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go ≥ 1.24)
		s.seed = binary.LittleEndian.Uint64(b[:])
	}
	s.rng = s.seed

	t := float64(p.Temperature)
	s.topK = p.TopK
	if s.topK < 0 || s.topK >= vocabSize {
		s.topK = 0
	}
	s.greedy = !(t >= greedyEpsilon) || s.topK == 1 // !(>=) also catches NaN
	if !s.greedy {
		s.invT = 1 / t
	}
	s.topP = float64(p.TopP)
	if !(s.topP > 0 && s.topP < 1) {
		s.topP = 1
	}
	s.minP = float64(p.MinP)
	if !(s.minP > 0) {
		s.minP = 0
	}
	s.nTop = min(max(p.TopLogprobs, 0), llm.MaxTopLogprobs, vocabSize)
	s.wantLP = p.Logprobs || s.nTop > 0

	for id, v := range p.LogitBias {
		if id >= 0 && int(id) < vocabSize && v == v && v != 0 {
			s.bias = append(s.bias, biasEntry{id, v})
		}
	}
	slices.SortFunc(s.bias, func(a, b biasEntry) int { return int(a.id) - int(b.id) })

	s.rep = p.RepetitionPenalty
	if !(s.rep > 0) || math.IsInf(float64(s.rep), 0) {
		s.rep = 1
	}
	s.presence, s.freq = p.PresencePenalty, p.FrequencyPenalty
	if s.rep != 1 || s.presence != 0 || s.freq != 0 {
		if b != nil {
			s.pen = b.penalties()
		} else {
			s.pen = newPenalties(vocabSize)
		}
		for _, id := range prompt {
			if id >= 0 && int(id) < vocabSize {
				s.pen.addPrompt(id)
			}
		}
	}

	if len(p.AllowedTokens) > 0 {
		s.allowed = make([]uint64, (vocabSize+63)/64)
		for _, id := range p.AllowedTokens {
			if id >= 0 && int(id) < vocabSize {
				s.allowed[id>>6] |= 1 << (id & 63)
			}
		}
	}
	s.minTokens = max(p.MinTokens, 0)
	if g != nil {
		s.gram = g.NewMatcher()
	}
	if b != nil {
		s.sc, s.owner = &b.scratch, b
	} else {
		s.sc = new(sampleScratch)
	}
	s.sc.fit(s)
	return s
}

// Seed returns the seed in use: the requested one, or the one drawn from
// crypto/rand when none was given. Reusing it reproduces the sequence.
func (s *Sampler) Seed() uint64 { return s.seed }

// Sample picks the next token from logits, which must hold at least the
// vocabulary size entries (extra entries, e.g. a padded vocabulary, are
// ignored and never chosen). It records the token for the penalties.
//
// logits is modified in place: on return logits[:vocab] hold the logits
// after bias, penalties and sanitising (steps 1–3 above), i.e. the values
// the reported logprobs are the log-softmax of.
func (s *Sampler) Sample(logits []float32) Sample {
	if len(logits) < s.vocab {
		panic(fmt.Sprintf("engine: Sampler.Sample: %d logits for a vocabulary of %d", len(logits), s.vocab))
	}
	if s.sc == nil {
		panic("engine: Sampler.Sample after its buffers were given back")
	}
	l := logits[:s.vocab]
	best, lmax := s.prepare(l)
	u := s.uniform()
	s.sumT1Valid = false

	id := best
	if !s.greedy {
		c, w, mass := s.support(l, lmax)
		switch {
		case c != nil:
			if i := pickCand(c, mass, u); i >= 0 {
				id = c[i].id
			}
		default:
			if i := pick(w, mass, u); i >= 0 {
				id = int32(i)
			}
		}
		// i < 0 (all weights zero) cannot happen: the argmax has weight 1.
	}

	out := Sample{ID: id}
	if s.wantLP {
		sum := s.sumT1
		if !s.sumT1Valid {
			sum = 0
			m := float64(lmax)
			for _, x := range l {
				sum += expDet(float64(x) - m)
			}
		}
		logZ := float64(lmax) + math.Log(sum)
		out.Logprob = float32(float64(l[id]) - logZ)
		if s.nTop > 0 {
			top := selectTop(l, s.nTop, s.sc.topC)
			for i, c := range top {
				s.sc.top[i] = TokenLogprob{ID: c.id, Logprob: float32(float64(c.logit) - logZ)}
			}
			out.Top = s.sc.top[:len(top)]
		}
	}
	s.record(id)
	return out
}

// withEnds sets the end tokens (end-of-generation and stop tokens) that MinTokens holds
// back; the sampler keeps ids.
func (s *Sampler) withEnds(ids []int32) *Sampler {
	s.ends = ids
	return s
}

// resumedSampler is req's sampler, its buffers lent by b, with the Resumed tail of its
// prompt replayed as output (see llm.Request.Resumed); ends are the tokens MinTokens
// holds back.
func resumedSampler(req *llm.Request, b *samplerBufs, g *grammar.Bound, ends []int32) *Sampler {
	orig := len(req.Prompt) - req.Resumed
	s := newSampler(req.Sampling, b.vocab, req.Prompt[:orig], b, g).withEnds(ends)
	for _, id := range req.Prompt[orig:] {
		s.Accept(id)
	}
	return s
}

// Accept records a token chosen elsewhere (for example one replayed after
// preemption) as if Sample had returned it: it counts for the penalties and
// consumes one RNG draw, so that later samples match an uninterrupted run.
func (s *Sampler) Accept(id int32) {
	s.uniform()
	s.record(id)
}

func (s *Sampler) record(id int32) {
	s.n++
	if s.pen != nil && id >= 0 && int(id) < s.vocab {
		s.pen.addGenerated(id)
	}
	if s.gram != nil && s.gramErr == nil {
		if err := s.gram.Accept(id); err != nil {
			s.gramErr = fmt.Errorf("engine: the grammar refused a token: %w", err)
		}
	}
}

// constraintDone reports whether the sequence's grammar is complete: nothing may follow.
func (s *Sampler) constraintDone() bool { return s.gram != nil && s.gram.Done() }

// constraintErr is the first error of the sequence's grammar: a token it refused, or a
// step where no token of the vocabulary could go on.
func (s *Sampler) constraintErr() error { return s.gramErr }

// applyMask sets to −Inf the logits of the tokens the grammar does not allow next, and
// reports how many it allows.
func (s *Sampler) applyMask(l []float32) int {
	mask := s.sc.mask[:(s.vocab+63)/64]
	s.gram.FillMask(mask)
	negInf := float32(math.Inf(-1))
	allowed := 0
	for w, word := range mask {
		lo := w * 64
		hi := min(lo+64, len(l))
		switch word {
		case ^uint64(0):
			allowed += hi - lo
		case 0:
			for i := lo; i < hi; i++ {
				l[i] = negInf
			}
		default:
			allowed += bits.OnesCount64(word)
			for i := lo; i < hi; i++ {
				if word&(1<<(i-lo)) == 0 {
					l[i] = negInf
				}
			}
		}
	}
	return allowed
}

// prepare applies bias and penalties, sanitises, and returns the argmax
// (lowest id on ties) and the maximum logit (finite).
func (s *Sampler) prepare(l []float32) (int32, float32) {
	for _, b := range s.bias {
		l[b.id] += b.v
	}
	if pen := s.pen; pen != nil {
		for _, id := range pen.touched {
			x := l[id]
			if s.rep != 1 {
				if x > 0 {
					x /= s.rep
				} else {
					x = float32(x * s.rep) // conversion: no fused multiply-add
				}
			}
			if c := pen.counts[id]; c > 0 {
				x -= float32(float32(c) * s.freq) // conversion: no fused multiply-add
				x -= s.presence
			}
			l[id] = x
		}
	}
	negInf := float32(math.Inf(-1))
	if s.allowed != nil {
		for w, word := range s.allowed {
			if word == ^uint64(0) {
				continue
			}
			for i, hi := w*64, min(w*64+64, len(l)); i < hi; i++ {
				if word&(1<<(i-w*64)) == 0 {
					l[i] = negInf
				}
			}
		}
	}
	if s.n < s.minTokens {
		for _, id := range s.ends {
			if id >= 0 && int(id) < len(l) {
				l[id] = negInf
			}
		}
	}
	allowed := -1
	if s.gram != nil {
		allowed = s.applyMask(l)
	}
	best, lmax := int32(-1), float32(math.Inf(-1))
	for i, x := range l {
		if x <= lmax { // the common case: one comparison per token
			continue
		}
		switch { // NaN, +Inf, or a new maximum
		case x != x:
			l[i] = float32(math.Inf(-1))
		case x > math.MaxFloat32:
			l[i] = math.MaxFloat32
			if lmax < math.MaxFloat32 {
				best, lmax = int32(i), math.MaxFloat32
			}
		default:
			best, lmax = int32(i), x
		}
	}
	if best < 0 { // every logit −Inf (or NaN): no information, uniform
		switch {
		case allowed >= 0:
			return s.uniformAllowed(l, allowed)
		case s.allowed != nil: // uniform over the allowed tokens
			return uniformOver(l, s.allowed), 0
		}
		clear(l)
		return 0, 0
	}
	return best, lmax
}

// uniformAllowed makes the logits of the tokens the grammar allows 0 and the others −Inf
// (a uniform choice among them), and returns the first of them. With none allowed (a
// grammar the vocabulary cannot spell on) it records the error; the engine ends the
// sequence.
func (s *Sampler) uniformAllowed(l []float32, allowed int) (int32, float32) {
	if allowed == 0 {
		if s.gramErr == nil {
			s.gramErr = errors.New("engine: the grammar allows no token of the vocabulary here")
		}
		clear(l)
		return 0, 0
	}
	return uniformOver(l, s.sc.mask), 0
}

// uniformOver makes the logits of the tokens in mask (one bit per id) 0 and the others
// −Inf, a uniform choice among them, and returns the first of them (−1: none).
func uniformOver(l []float32, mask []uint64) int32 {
	best := int32(-1)
	for i := range l {
		if mask[i>>6]&(1<<(i&63)) != 0 {
			l[i] = 0
			if best < 0 {
				best = int32(i)
			}
		} else {
			l[i] = float32(math.Inf(-1))
		}
	}
	return best
}

// uniform returns the next splitmix64 output as a float64 in [0, 1).
func (s *Sampler) uniform() float64 {
	s.rng += 0x9E3779B97F4A7C15
	z := s.rng
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(float64(z>>11) * 0x1p-53)
}

// support computes the truncated, unnormalised sampling distribution: either
// candidates c with weights c[i].w (top-k and/or top-p on), or, with c nil,
// weights w indexed by token id. mass is the sum of the weights.
func (s *Sampler) support(l []float32, lmax float32) (c []cand, w []float64, mass float64) {
	m := float64(lmax)
	invT := s.invT
	scaled := func(x float32) float64 { return float64((float64(x) - m) * invT) }

	if s.topK > 0 {
		// Top-k by partial selection, best first; then top-p and min-p
		// cut the sorted prefix.
		c = selectTop(l, s.topK, s.sc.cands)
		total := 0.0
		for i := range c {
			c[i].w = expDet(scaled(c[i].logit))
			total += c[i].w
		}
		target := math.Inf(1)
		if s.topP < 1 {
			target = s.topP * total
		}
		n, mass := s.cut(c, target)
		return c[:n], nil, mass
	}

	if s.topP < 1 {
		// Every token's weight and the total.
		c = s.sc.cands[:0]
		total := 0.0
		for i, x := range l {
			e := expDet(scaled(x))
			total += e
			if e > 0 {
				c = append(c, cand{e, int32(i), x})
			}
		}
		if invT == 1 {
			s.sumT1, s.sumT1Valid = total, true
		}
		target := s.topP * total
		// The tokens lighter than eps weigh < (1-p)·total/2 together, so
		// the rest reach the target: the nucleus is among them. Min-p drops
		// tokens lighter than minP after top-p; if the tokens at least that
		// heavy reach the target, the nucleus is among them too, otherwise
		// they are exactly the result.
		eps := float64((1-s.topP)*total) / float64(2*len(l))
		th := max(eps, s.minP)
		n, heavy := 0, 0.0
		for _, e := range c {
			if e.w >= th {
				c[n] = e
				n++
				heavy += e.w
			}
		}
		if heavy < target && th == s.minP {
			return c[:n], nil, heavy // min-p is the binding cut
		}
		// heavy < target otherwise only through rounding; nucleus then
		// keeps all of c[:n].
		n, mass = nucleus(c[:n], target)
		return c[:n], nil, mass
	}

	// No top-k, no top-p: the whole vocabulary, in id order.
	w = s.sc.w[:len(l)]
	all := 0.0
	for i, x := range l {
		e := expDet(scaled(x))
		all += e
		if e < s.minP {
			e = 0
		}
		w[i] = e
		mass += e
	}
	if invT == 1 {
		s.sumT1, s.sumT1Valid = all, true
	}
	return nil, w, mass
}

// nucleus reorders c so that c[:n] holds the best-ranked candidates, as few as
// possible, whose weight reaches target, and returns n and their mass. It is a
// quickselect on cumulative weight, O(len(c)) expected, with a sort as the
// fallback against bad pivots. If all of c weighs less than target, n is
// len(c).
func nucleus(c []cand, target float64) (n int, mass float64) {
	lo, hi := 0, len(c) // c[:lo] is kept, with weight mass; c[hi:] is dropped
	budget := 2 * bits.Len(uint(len(c)))
	for hi-lo > 16 && budget > 0 {
		budget--
		p := partition(c[lo:hi]) + lo // c[lo:p] rank above c[p], c[p+1:hi] below
		better := 0.0
		for _, e := range c[lo:p] {
			better += e.w
		}
		switch {
		case mass+better >= target:
			hi = p
		case mass+better+c[p].w >= target:
			return p + 1, mass + better + c[p].w
		default:
			mass += better + c[p].w
			lo = p + 1
		}
	}
	slices.SortFunc(c[lo:hi], cmpCand)
	for i := lo; i < hi; i++ {
		mass += c[i].w
		if mass >= target {
			return i + 1, mass
		}
	}
	return hi, mass
}

// partition partitions c (len ≥ 3) around a median-of-three pivot and returns
// the pivot's index: the candidates before it rank above it, those after below.
func partition(c []cand) int {
	a, b, z := 0, len(c)/2, len(c)-1
	if worse(c[a], c[b]) {
		a, b = b, a
	}
	if worse(c[b], c[z]) {
		b = z
		if worse(c[a], c[b]) {
			b = a
		}
	}
	c[0], c[b] = c[b], c[0]
	pv := c[0]
	i, j := 1, len(c)-1
	for {
		for i <= j && worse(pv, c[i]) {
			i++
		}
		for i <= j && worse(c[j], pv) {
			j--
		}
		if i > j {
			break
		}
		c[i], c[j] = c[j], c[i]
		i++
		j--
	}
	c[0], c[j] = c[j], c[0]
	return j
}

// cut returns the length n of the prefix of c (best first) that survives
// top-p (smallest prefix with cumulative weight ≥ target) and then min-p
// (weight ≥ minP, the top weight being 1), and the prefix's mass.
func (s *Sampler) cut(c []cand, target float64) (n int, mass float64) {
	for i, e := range c {
		if e.w < s.minP {
			return i, mass
		}
		mass += e.w
		if mass >= target {
			return i + 1, mass
		}
	}
	return len(c), mass
}

// pick returns the index i where the running sum of w first exceeds u·mass
// (weights of zero are never chosen), or -1 if all weights are zero.
func pick(w []float64, mass, u float64) int {
	r := float64(u * mass)
	acc, last := 0.0, -1
	for i, x := range w {
		if x > 0 {
			acc += x
			last = i
			if r < acc {
				return i
			}
		}
	}
	return last // rounding left r ≥ the final sum
}

// pickCand is pick over candidate weights.
func pickCand(c []cand, mass, u float64) int {
	r := float64(u * mass)
	acc, last := 0.0, -1
	for i := range c {
		if x := c[i].w; x > 0 {
			acc += x
			last = i
			if r < acc {
				return i
			}
		}
	}
	return last
}

// worse reports whether a ranks below b: lower logit, or equal logit and
// higher id.
func worse(a, b cand) bool {
	return a.logit < b.logit || (a.logit == b.logit && a.id > b.id)
}

func cmpCand(a, b cand) int {
	switch {
	case worse(b, a):
		return -1
	case worse(a, b):
		return 1
	}
	return 0
}

// selectTop returns the k best tokens of l (no NaNs), best first, in h
// (which must have capacity ≥ k). It keeps a heap whose root is the worst of
// the k, so for small k it is one pass with one comparison per token.
func selectTop(l []float32, k int, h []cand) []cand {
	k = min(k, len(l))
	h = h[:k]
	if k == 0 {
		return h
	}
	for i := range k {
		h[i] = cand{id: int32(i), logit: l[i]}
	}
	for i := k/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	for i := k; i < len(l); i++ {
		if x := l[i]; x > h[0].logit { // equal logit: the later (higher) id ranks lower
			h[0] = cand{id: int32(i), logit: x}
			siftDown(h, 0)
		}
	}
	for end := k - 1; end > 0; end-- { // pop the worst to the back
		h[0], h[end] = h[end], h[0]
		siftDown(h[:end], 0)
	}
	return h
}

// siftDown restores the heap property (every parent ranks at or below its
// children) below i.
func siftDown(h []cand, i int) {
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && worse(h[c+1], h[c]) {
			c++
		}
		if !worse(h[c], h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// expDet is e**x computed with a fixed sequence of individually rounded IEEE
// operations, so it gives bit-identical results on every platform (math.Exp
// uses assembly on some, and the compiler may fuse multiply-adds on others).
// Cody–Waite reduction x = k·ln2 + r, |r| ≤ ln2/2, then the Taylor series of
// e**r to r**12 evaluated by Estrin's scheme: relative error < 1e-15 (a few
// ulp), and no division.
func expDet(x float64) float64 {
	const (
		log2e = 1.44269504088896338700e+00
		ln2Hi = 6.93147180369123816490e-01 // low bits zero: k·ln2Hi is exact
		ln2Lo = 1.90821492927058770002e-10
		shift = 0x1.8p52 // adding it rounds to an integer

		c2  = 1.0 / 2
		c3  = 1.0 / 6
		c4  = 1.0 / 24
		c5  = 1.0 / 120
		c6  = 1.0 / 720
		c7  = 1.0 / 5040
		c8  = 1.0 / 40320
		c9  = 1.0 / 362880
		c10 = 1.0 / 3628800
		c11 = 1.0 / 39916800
		c12 = 1.0 / 479001600
	)
	if !(x > -745.1332191019412) { // underflows to 0, or NaN
		if x != x {
			return x
		}
		return 0
	}
	if x > 709.782712893384 {
		return math.Inf(1)
	}
	// Every product is wrapped in a float64 conversion, which the Go spec
	// says rounds and so forbids fusing it with the following add.
	kf := (float64(x*log2e) + shift) - shift
	k := int(kf)
	r := (x - float64(kf*ln2Hi)) - float64(kf*ln2Lo)
	r2 := float64(r * r)
	r4 := float64(r2 * r2)
	r8 := float64(r4 * r4)
	p01 := 1 + r
	p23 := c2 + float64(c3*r)
	p45 := c4 + float64(c5*r)
	p67 := c6 + float64(c7*r)
	p89 := c8 + float64(c9*r)
	p1011 := c10 + float64(c11*r)
	p03 := p01 + float64(r2*p23)
	p47 := p45 + float64(r2*p67)
	p811 := p89 + float64(r2*p1011)
	p07 := p03 + float64(r4*p47)
	p812 := p811 + float64(r4*c12)
	y := p07 + float64(r8*p812)
	// y·2**k, with exact power-of-two scale factors.
	if k < -1021 {
		y *= 0x1p-54
		k += 54
	} else if k > 1023 {
		y *= 2
		k--
	}
	return float64(y * math.Float64frombits(uint64(k+1023)<<52))
}
