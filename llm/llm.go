// Package llm is the generation contract shared by the OpenAI layer, the
// engine and the router: token-level requests, sampling parameters and results.
package llm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Request is one generation over token ids. Text, chat templates and stop
// strings stay with the caller, which holds the tokenizer.
type Request struct {
	ID         string
	Model      string
	Prompt     []int32
	Sampling   SamplingParams
	MaxTokens  int     // most tokens to generate; 0: up to the context length
	StopTokens []int32 // token ids that end generation, besides end-of-generation ones
	IgnoreEOS  bool    // keep going past end-of-generation tokens
	Priority   int     // lower runs first; equal priorities run first come, first served
	Arrival    time.Time
	// Resumed is how many trailing Prompt tokens are this request's own earlier output,
	// generated elsewhere before it moved here (a migrated request). The sampler counts
	// them as output for penalties and replays their RNG draws, so a seeded sampled
	// request continues exactly as it would have on one worker.
	Resumed int
	// Constraint limits the output to a grammar's texts (structured outputs, forced tool
	// calls). The zero value is no constraint.
	Constraint Constraint
	// Session groups requests that should run on one worker (a conversation): the
	// X-Session-Id header, else the body's "user" field. Only the router reads it; it
	// does not travel to workers.
	Session string
	// PromptLogprobs asks for the log-probability of every prompt token after the first
	// under the model's raw distribution (no bias, penalties or grammar), with
	// PromptTopLogprobs alternatives each (0..MaxTopLogprobs); they come on the first event.
	// Every prompt position is then computed: none is taken from the prefix cache.
	PromptLogprobs    bool
	PromptTopLogprobs int
	// Pooling, when set, makes the request an embedding: the prompt's final normalised
	// hidden states are pooled (PoolLast, PoolMean) and returned on one event
	// (Event.Embedding, unnormalised), and nothing is generated.
	Pooling Pooling
	// Adapter names the LoRA adapter the request runs under ("": the base model): the
	// OpenAI API's model field when it names an adapter rather than the base.
	Adapter string
	// NoSpeculation turns speculative decoding off for the request where the engine would
	// otherwise draft for it; the tokens are the same either way.
	NoSpeculation bool
	// Collected says that the caller reads the answer only whole (an API response that is
	// not streamed), so that a router may have its worker send the tokens many to a
	// message. Only the router reads it; it does not travel to workers.
	Collected bool
}

// AdapterInfo describes a LoRA adapter an engine serves.
type AdapterInfo struct {
	Name     string // what a request names it by
	Path     string // where it was loaded from
	Format   string // "gguf" or "peft"
	ID       string // a hash of its content
	Rank     int
	Resident bool // its weights are in memory (else they are read again when next asked for)
}

// Pooling is how an embedding is made from a prompt's hidden states.
type Pooling string

// Poolings.
const (
	PoolNone Pooling = ""     // not an embedding: generate
	PoolLast Pooling = "last" // the last prompt token's hidden state
	PoolMean Pooling = "mean" // the mean over the prompt's positions
)

// Poolings are the poolings an embedding request may name.
var Poolings = []Pooling{PoolLast, PoolMean}

// PromptLogprob is one prompt token's log-probability given the tokens before it.
type PromptLogprob struct {
	Logprob float32
	Rank    int            // 1 + the number of tokens more likely
	Top     []TokenLogprob // the most likely tokens, best first
}

// Constraint limits a generation to the texts of a grammar: before each token the
// sampler masks the tokens that would leave the grammar, and generation ends with
// FinishStop once the grammar's text is complete (or on an end-of-generation token,
// which is allowed exactly where the text may end). The mask depends on the sequence
// alone, so batch invariance holds.
type Constraint struct {
	// Grammar is the grammar in package grammar's GBNF dialect
	// (docs/structured-outputs.md); "" means none. It is text so that it crosses the
	// wire as it is; each engine compiles it against its own vocabulary.
	Grammar string
}

// IsZero reports whether c constrains nothing.
func (c Constraint) IsZero() bool { return c.Grammar == "" }

// TokenLogprob is a token id with its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Limits enforced by SamplingParams.Validate.
const (
	MaxTemperature   = 100 // vLLM has no upper bound; OpenAI stops at 2
	MaxTopLogprobs   = 20
	MaxLogitBias     = 100
	MaxOpenAIPenalty = 2 // presence and frequency penalties lie in [-2, 2]
)

// SamplingParams configures a Sampler. The zero value is greedy decoding.
type SamplingParams struct {
	Temperature       float32           // 0 → greedy (argmax, ties to the lowest id); values < 1e-5 also greedy
	TopK              int               // 0 or <0 → disabled; ≥ vocab → disabled
	TopP              float32           // 1 or 0 → disabled
	MinP              float32           // 0 → disabled
	RepetitionPenalty float32           // 1 or 0 → disabled; prompt + generated tokens (vLLM/HF: logit>0 → /p, else *p)
	PresencePenalty   float32           // OpenAI semantics, generated tokens only
	FrequencyPenalty  float32           // OpenAI semantics, generated tokens only
	LogitBias         map[int32]float32 // added to logits before everything else
	Seed              uint64
	HasSeed           bool // without a seed, one is drawn from crypto/rand (see Sampler.Seed)
	TopLogprobs       int  // number of alternatives to report (0..20)
	Logprobs          bool // report the chosen token's logprob
	// MinTokens: until this many tokens are generated, end-of-generation and stop tokens
	// are not sampled (their logits are −Inf).
	MinTokens int
	// AllowedTokens, when not empty, are the only tokens that may be sampled.
	AllowedTokens []int32
}

// Validate reports the first invalid field, naming it as the OpenAI/vLLM API
// does. Zero values that mean "disabled" (TopP 0, RepetitionPenalty 0) are
// accepted.
func (p SamplingParams) Validate(vocabSize int) error {
	bad := func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }
	switch {
	case vocabSize <= 0:
		return fmt.Errorf("sampling: vocabulary size must be positive, got %d", vocabSize)
	case bad(p.Temperature) || p.Temperature < 0 || p.Temperature > MaxTemperature:
		return fmt.Errorf("sampling: temperature must be in [0, %d], got %v", MaxTemperature, p.Temperature)
	case p.TopK < -1:
		return fmt.Errorf("sampling: top_k must be -1 (disabled), 0 (disabled) or positive, got %d", p.TopK)
	case bad(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("sampling: top_p must be in (0, 1] (0 means disabled), got %v", p.TopP)
	case bad(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("sampling: min_p must be in [0, 1], got %v", p.MinP)
	case bad(p.RepetitionPenalty) || p.RepetitionPenalty < 0:
		return fmt.Errorf("sampling: repetition_penalty must be > 0 (0 means disabled), got %v", p.RepetitionPenalty)
	case bad(p.PresencePenalty) || p.PresencePenalty < -MaxOpenAIPenalty || p.PresencePenalty > MaxOpenAIPenalty:
		return fmt.Errorf("sampling: presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case bad(p.FrequencyPenalty) || p.FrequencyPenalty < -MaxOpenAIPenalty || p.FrequencyPenalty > MaxOpenAIPenalty:
		return fmt.Errorf("sampling: frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs:
		return fmt.Errorf("sampling: top_logprobs must be in [0, %d], got %d", MaxTopLogprobs, p.TopLogprobs)
	case p.MinTokens < 0:
		return fmt.Errorf("sampling: min_tokens must be at least 0, got %d", p.MinTokens)
	}
	for _, id := range p.AllowedTokens {
		if id < 0 || int(id) >= vocabSize {
			return fmt.Errorf("sampling: allowed_token_ids: token id %d out of range [0, %d)", id, vocabSize)
		}
	}
	// Report the lowest offending id so the message does not depend on map order.
	found, badID, badVal := false, int32(0), float32(0)
	for id, v := range p.LogitBias {
		if id < 0 || int(id) >= vocabSize || bad(v) || v < -MaxLogitBias || v > MaxLogitBias {
			if !found || id < badID {
				found, badID, badVal = true, id, v
			}
		}
	}
	switch {
	case found && (badID < 0 || int(badID) >= vocabSize):
		return fmt.Errorf("sampling: logit_bias token id %d out of range [0, %d)", badID, vocabSize)
	case found:
		return fmt.Errorf("sampling: logit_bias value for token %d must be in [-100, 100], got %v", badID, badVal)
	}
	return nil
}

// FinishReason says why a generation ended, as the OpenAI API names it.
type FinishReason string

// Finish reasons.
const (
	FinishStop   FinishReason = "stop"   // an end-of-generation or stop token
	FinishLength FinishReason = "length" // max tokens or the context length
	FinishAbort  FinishReason = "abort"  // cancelled or failed
)

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int
	CachedTokens     int // prompt tokens served from the prefix cache
	CompletionTokens int
}

// Event is one generated token; the last event of a stream also carries
// the finish reason and usage.
type Event struct {
	Token   int32
	Logprob float32
	Top     []TokenLogprob // the receiver owns it
	Finish  FinishReason   // "" until the last event
	Usage   Usage          // set on the last event
	// PromptLogprobs, on the first event of a request that asked for them, are the
	// prompt's tokens 1… (the first has none); the receiver owns them.
	PromptLogprobs []PromptLogprob
	// Embedding is an embedding request's pooled hidden state, unnormalised, on its one
	// event (Token is then -1 and nothing was generated); the receiver owns it.
	Embedding []float32
	// Step, on a request's first event and on its last, is the engine step that produced
	// it: the first load report whose Load.Step is at least Step counts the request past
	// its first token (or gone). 0 on the other events, and from an engine that does not
	// number its steps (docs/routing.md, "A report against the events the router has
	// seen").
	Step uint64
}

// Stream delivers a generation's events in order.
type Stream interface {
	// Next blocks for the next event. After the event with a finish reason
	// it returns io.EOF.
	Next(ctx context.Context) (Event, error)
	// Close abandons the generation if it is still running and frees what
	// it holds at once. It is safe to call more than once.
	Close() error
}

// Errors a backend returns from Generate, for callers to map to statuses.
var (
	ErrInvalid       = errors.New("invalid request")           // 400
	ErrPromptTooLong = errors.New("prompt too long")           // 400
	ErrQueueFull     = errors.New("too many waiting requests") // 429
	ErrUnavailable   = errors.New("backend unavailable")       // 503
)

// Load is a worker's load as its router weighs it: the one shape that a worker reports
// (worker.Load), the wire carries (cluster.LoadReport) and the routing policy reads
// (router.LoadReport).
type Load struct {
	Running int // sequences decoding
	Waiting int // sequences accepted but without a first token yet: queued or prefilling
	// PrefillTokens is the prompt tokens of the waiting sequences not yet computed: the
	// admitted ones' less their prefix cache hits, the queued ones' less the hits their
	// admission is expected to find. Queued and QueuedTokens are the queued ones' share of
	// Waiting and PrefillTokens (not admitted yet: behind a long prompt or a full batch).
	PrefillTokens int
	Queued        int
	QueuedTokens  int
	DecodeBlocks  int     // KV blocks held by sequences
	KVUsage       float64 // fraction of KV blocks in use, 0…1
	KVBlocks      int     // KV capacity in blocks (0: the card's)
	LastEventID   uint64  // the worker's last KV event id
	CachedBlocks  int     // blocks in the worker's prefix cache: what the router's index should hold for it
	Healthy       bool    // false while draining or failing: send nothing new
	StepMicros    int     // duration of the last engine step, µs (0: unknown)
	StepTokens    int     // tokens in the last engine step (0: unknown)
	// Received is the highest dispatch number of the router's registration that the worker
	// had taken when it made the report; Tracked says it is set. The router keeps predicting
	// the load of its later dispatches, which the report cannot include; without Tracked,
	// the report counts every dispatch.
	Received uint64
	Tracked  bool
	// StepsOverTarget counts the engine steps, since it started, that carried decode tokens
	// and were predicted past its inter-token latency target: the worker has more streams
	// than it can keep at the target. The router and the planner difference it between
	// reports.
	StepsOverTarget uint64
	// Lower tiers (docs/kv-tiers.md). Onboarding is the sequences loading their prompt's
	// blocks from the worker's lower tiers (counted in Waiting too). TierLoadMicros is the
	// measured time to load one block into the device from each tier, indexed by the tier's
	// number (kvcache.Tier: 1 host, 2 disk, 3 remote; 0, the device, unused), in µs, 0 until
	// measured; BlockPrefillMicros the measured time to compute one block of prompt, µs, 0
	// until measured; PullMicros the measured time per block of a KV pull from a peer, µs,
	// 0 until measured. The router charges a block in a lower tier load/prefill of a
	// block's prefill.
	Onboarding         int
	TierLoadMicros     [4]int
	BlockPrefillMicros int
	PullMicros         int
	// Adapters are the LoRA adapters the worker serves, each NAME@ID (its name and the
	// hash of its content, which its KV's block hash salt includes), separated by spaces
	// (a name has none): a string, so that a Load stays comparable.
	Adapters string
	// Step is the engine step the figures were taken after (1, 2, …; 0: the worker does not
	// number its steps): they count every request whose first or last event carries a
	// Step at most this one as past its first token or gone, and no other (Event.Step).
	Step uint64
}

// Adapter returns the content ID of the adapter name among l.Adapters.
func (l *Load) Adapter(name string) (id string, ok bool) {
	rest := l.Adapters
	for rest != "" {
		var one string
		one, rest, _ = strings.Cut(rest, " ")
		if n, id, _ := strings.Cut(one, "@"); n == name {
			return id, true
		}
	}
	return "", false
}

// AdapterList is adapters as Load.Adapters lists them.
func AdapterList(adapters []AdapterInfo) string {
	var b strings.Builder
	for i, a := range adapters {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.Name + "@" + a.ID)
	}
	return b.String()
}
