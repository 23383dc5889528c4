package router

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// A Pool restricts a decision to the workers of some roles (the model card's role).
type Pool uint8

// Pools. PoolAny is every worker: the decision of a cluster without roles.
const (
	PoolAny     Pool = iota
	PoolDecode       // workers with role decode or both
	PoolPrefill      // workers with role prefill
)

// admitsWorker is admits(w.Card.Role), from the role's flag.
func (p Pool) admitsWorker(w *WorkerState) bool {
	switch p {
	case PoolDecode:
		return !w.prefillRole
	case PoolPrefill:
		return w.prefillRole
	}
	return true
}

func (p Pool) admits(role string) bool {
	switch p {
	case PoolDecode:
		return role != RolePrefill
	case PoolPrefill:
		return role == RolePrefill
	}
	return true
}

func (p Pool) String() string {
	switch p {
	case PoolDecode:
		return "decode"
	case PoolPrefill:
		return "prefill"
	}
	return "any"
}

// PoolSize returns the number of registered workers in pool p, and of those the healthy ones.
func (s *State) PoolSize(p Pool) (workers, healthy int) {
	if p == PoolPrefill && s.prefillers == 0 {
		return 0, 0 // the usual, aggregated case: no walk on every request
	}
	for _, w := range s.workers {
		if p.admits(w.Card.Role) {
			workers++
			if w.Healthy {
				healthy++
			}
		}
	}
	return workers, healthy
}

// KVFormats returns the KV formats (Card.KVFormat) of pool p's healthy workers, sorted,
// each once.
func (s *State) KVFormats(p Pool) []string {
	var formats []string
	for _, w := range s.workers {
		if w.Healthy && p.admitsWorker(w) && !slices.Contains(formats, w.Card.KVFormat) {
			formats = append(formats, w.Card.KVFormat)
		}
	}
	slices.Sort(formats)
	return formats
}

// DisaggConfig holds the knobs of disaggregated prefill and decode; docs/disaggregation.md
// explains the defaults.
type DisaggConfig struct {
	// MinRemoteTokens: prefill runs on a prefill worker only when the prompt tokens the
	// decode worker lacks (not in its prefix cache) number at least this many, and at least
	// a block; shorter ones are cheaper to compute where they are decoded than to move.
	MinRemoteTokens int
	// Strict fails a request whose remote prefill or KV transfer failed, instead of
	// prefilling it on the decode worker.
	Strict bool
	// Hold is how long a prefill worker keeps a prompt's blocks for the decode worker's
	// pull; TransferTimeout bounds the pull, after which it is abandoned. The pull starts
	// with the prefill and overlaps it, so TransferTimeout bounds P's queue and compute too.
	Hold            time.Duration
	TransferTimeout time.Duration
}

// DefaultDisaggConfig returns the documented defaults.
func DefaultDisaggConfig() DisaggConfig {
	return DisaggConfig{MinRemoteTokens: 256, Hold: 30 * time.Second, TransferTimeout: 30 * time.Second}
}

// Where the prefill of a request runs, and why (DisaggDecision.Where and Reason, and the
// labels of tandem_router:prefills_total).
const (
	PrefillRemote = "remote" // on a prefill worker; the decode worker pulls the KV
	PrefillLocal  = "local"  // on the decode worker

	ReasonLongPrompt    = "uncached_above_threshold" // remote: enough uncached tokens to pay for the move
	ReasonShortPrompt   = "uncached_below_threshold" // local: too few uncached tokens on the decode worker
	ReasonPrefillBusy   = "prefill_pool_busy"        // local: every prefill worker is busy
	ReasonNoPrefill     = "no_prefill_worker"        // local: no healthy prefill worker
	ReasonKVFormat      = "kv_format_mismatch"       // local: no healthy prefill worker stores KV as D does
	ReasonPrefillFailed = "prefill_failed"           // local: the remote prefill failed (fallback)
	ReasonAggregated    = "aggregated"               // the model has no prefill pool
)

// A DisaggDecision is where a request's prefill and decode run.
type DisaggDecision struct {
	Decode  Decision
	Prefill *Decision // nil: the decode worker prefills
	Where   string    // PrefillRemote or PrefillLocal
	Reason  string
	// Uncached is the number of prompt tokens the decode worker lacks.
	Uncached int
}

// DecideDisagg routes req in a cluster with a prefill pool: a decode worker D by the policy
// over the decode pool (counting the blocks D holds), then, when the prompt tokens D lacks
// reach cfg.MinRemoteTokens, a prefill worker P by the policy over the prefill pool. The
// prefill pool being busy, or empty, keeps the prefill on D. Both decisions record their
// in-flight requests, as Decide does. Without a prefill pool it is Decide over every worker.
func DecideDisagg(s *State, req Request, cfg DisaggConfig) (DisaggDecision, error) {
	if n, _ := s.PoolSize(PoolPrefill); n == 0 {
		d, err := s.Decide(req)
		return DisaggDecision{Decode: d, Where: PrefillLocal, Reason: ReasonAggregated}, err
	}
	dreq := req
	dreq.Pool = PoolDecode
	if n, _ := s.PoolSize(PoolDecode); n == 0 {
		dreq.Pool = PoolAny // prefill workers only: they decode too
	}
	d, err := s.Decide(dreq)
	if err != nil {
		return DisaggDecision{}, err
	}
	out := DisaggDecision{Decode: d, Where: PrefillLocal}
	bs := s.card.BlockSize
	tokens := req.PromptTokens
	if tokens <= 0 {
		tokens = len(req.Hashes) * bs
	}
	out.Uncached = max(0, tokens-d.Overlap*bs)
	// Less than a block to move moves nothing: D would compute it anyway.
	if dreq.Pool == PoolAny || out.Uncached < max(cfg.MinRemoteTokens, bs) {
		out.Reason = ReasonShortPrompt
		if dreq.Pool == PoolAny {
			out.Reason = ReasonNoPrefill
		}
		return out, nil
	}
	preq := req
	preq.Pool, preq.SessionID = PoolPrefill, "" // sessions bind to their decode worker
	// Only a prefill worker whose blocks D can import: D would refuse another format's
	// blocks after P had computed them, and compute the prompt again.
	if dw := s.lookup(d.Worker); dw != nil {
		preq.KVFormat = dw.Card.KVFormat
	}
	p, err := s.Decide(preq)
	switch {
	case errors.Is(err, ErrAllBusy):
		out.Reason = ReasonPrefillBusy
	case errors.Is(err, ErrNoWorkers) && preq.KVFormat != "" && s.healthyIn(PoolPrefill):
		out.Reason = ReasonKVFormat
	case errors.Is(err, ErrNoWorkers):
		out.Reason = ReasonNoPrefill
	case err != nil:
		s.RemoveInflight(d.Inflight)
		return DisaggDecision{}, fmt.Errorf("router: prefill decision: %w", err)
	default:
		out.Prefill, out.Where, out.Reason = &p, PrefillRemote, ReasonLongPrompt
	}
	return out, nil
}

// healthyIn reports whether pool p has a healthy worker.
func (s *State) healthyIn(p Pool) bool {
	_, healthy := s.PoolSize(p)
	return healthy > 0
}
