package router

import (
	"errors"
	"fmt"
	"strings"
)

// A Card is the part of a worker's model card that the router checks and uses
// (docs/block-hashing.md): the workers serving one model must name blocks the
// same way, or the index would compare unrelated hashes.
type Card struct {
	Model       string // model name as served
	HashVersion int    // kvcache.HashVersion of the worker
	BlockSize   int    // tokens per KV block
	Salt        uint64 // kvcache.Salt(model, namespace, lora)
	KVBlocks    int    // KV capacity in blocks
	Role        string // RoleBoth (or ""), RolePrefill or RoleDecode: the pools it serves in
	// KVFormat names how the worker stores a KV block (kvcache.BlockFormat's String; ""
	// when it cannot export blocks or does not say). Workers of one model may differ
	// (another --kv-type), but a prefill worker's blocks are only of use to a decode worker
	// of the same format: DecideDisagg pairs them by it.
	KVFormat string
	// Node is the worker's name, the same in every router (the model card's Node): a router
	// with a share (State.SetShare) finds the worker's by it.
	Node string
}

// ErrCardMismatch is wrapped by the errors of CheckCard.
var ErrCardMismatch = errors.New("router: model card disagrees")

// CheckCard checks a registering worker's card against the router's card for
// the model (the card of the model's other workers). It refuses, naming both
// values, a worker of another model or whose hash version, block size or salt
// differs, and a card without a positive block size.
func CheckCard(router, worker Card) error {
	var bad []string
	if worker.BlockSize <= 0 {
		bad = append(bad, fmt.Sprintf("block size %d is not positive", worker.BlockSize))
	}
	if router.Model != worker.Model {
		bad = append(bad, fmt.Sprintf("model %q is not the pool's model %q", worker.Model, router.Model))
	}
	if router.HashVersion != worker.HashVersion {
		bad = append(bad, fmt.Sprintf("hash version %d, the other workers use %d", worker.HashVersion, router.HashVersion))
	}
	if router.BlockSize != worker.BlockSize && worker.BlockSize > 0 {
		bad = append(bad, fmt.Sprintf("block size %d, the other workers use %d", worker.BlockSize, router.BlockSize))
	}
	if router.Salt != worker.Salt {
		bad = append(bad, fmt.Sprintf("salt %#016x, the other workers use %#016x", worker.Salt, router.Salt))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: refusing worker of model %q: %s", ErrCardMismatch, worker.Model, strings.Join(bad, "; "))
}

// A worker's roles, as its model card names them (cluster.RoleBoth, RolePrefill and
// RoleDecode, which live's tests hold equal to these): repeated here so that the policy
// core links no wire code.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)
