// Package cluster holds the messages that engines (workers) and routers exchange over ORPC:
// the model card, load reports, KV event batches, snapshots and the generate stream, with
// their method names. It is a leaf package (it imports only orpc, llm and kvcache), shared by
// package worker and the live router. The contract is the "Services" section of docs/orpc.md.
package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"tandem/kvcache"
	"tandem/llm"
	"tandem/orpc"
)

// Version is the version of the services below; it travels first in the ModelCard, and a
// router refuses a card of another version.
const Version = 1

// Methods. Router.* are served by tandem-router and called by workers; Worker.* are served by
// workers and called by routers.
const (
	// MethodRegister (server-streaming): ModelCard → RegisterReply, then the same reply
	// every RegisterReply.BeatMs (a sign of life; nothing from routers that do not set it)
	// until the registration ends. The worker is a member for as long as this call lasts:
	// the router removes it (and its index entries) when the call ends, whichever side
	// ends it.
	MethodRegister = "Router.Register"
	// MethodHeartbeat (unary): LoadReport → Ack, every RegisterReply.HeartbeatMs.
	MethodHeartbeat = "Router.Heartbeat"
	// MethodEvents (unary): KVEvents → Ack; batches in strictly increasing event ids.
	MethodEvents = "Router.Events"
	// MethodGenerate (server-streaming): GenerateRequest → GenerateEvent*: first an Accepted
	// (or Error) event, then tokens; the last token carries the finish reason and usage.
	// Cancelling the call frees the sequence on the worker.
	MethodGenerate = "Worker.Generate"
	// MethodSnapshot (unary): SnapshotRequest → Snapshot of the worker's prefix cache.
	MethodSnapshot = "Worker.Snapshot"
)

// Roles of a worker (ModelCard.Role).
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Tokenizer formats (ModelCard.TokenizerFormat).
const (
	// TokenizerGGUF: one file "tokenizer.gguf", a GGUF file with only the tokenizer.* keys.
	TokenizerGGUF = "gguf"
	// TokenizerHF: Hugging Face files (tokenizer.json, tokenizer_config.json and, if the
	// model has them, generation_config.json and config.json).
	TokenizerHF = "hf"
)

// File is a named blob (a tokenizer file).
type File struct {
	Name string
	Data []byte
}

// ModelCard is what a worker registers with: everything the router needs to serve the model's
// API (tokenizer, chat template, context length) and to route (block size, salt, capacity).
type ModelCard struct {
	Version     int    // Version
	Model       string // served model name
	Node        string // the worker's name, unique in the cluster (X-Tandem-Worker)
	Addr        string // the worker's ORPC address host:port; an empty or unspecified host means "the address I connect from"
	Role        string // RoleBoth, RolePrefill or RoleDecode
	HashVersion int    // kvcache.HashVersion
	BlockSize   int    // tokens per KV block
	Salt        uint64 // kvcache.Salt(model, namespace, lora)
	KVBlocks    int    // KV capacity in blocks
	ContextLen  int    // context length in tokens

	TokenizerFormat string // TokenizerGGUF or TokenizerHF
	TokenizerFiles  []File
	ChatTemplate    string // overrides the tokenizer's chat template when set

	// GrammarFormat is the newest constraint format (GenerateRequest) the worker follows:
	// 0 (a worker from before constraints) none, so the router refuses constrained
	// requests for the model rather than have them ignored.
	GrammarFormat int
	// ToolCallParser and ReasoningParser are the worker's --tool-call-parser and
	// --reasoning-parser ("" or "auto": chosen from the chat template), so that the
	// router parses the model's output as the worker's own API would.
	ToolCallParser  string
	ReasoningParser string
	// RequestLevel is the newest set of GenerateRequest fields the worker reads (0: a
	// worker from before RequestTokens, which would ignore them), so that the router
	// refuses what the worker would silently drop.
	RequestLevel int
	// Pooling is how the worker pools embeddings (llm.Poolings: its --pooling, else the
	// model's metadata).
	Pooling string
	// ContentHash is the SHA-256 of the model's file(s) (empty: not known), Prepared the
	// backend's prepared-weights key (hal.WeightPorter.PreparedKey; empty: none): a new
	// engine of the same hash may pull its prepared weights from this one (weights.go).
	ContentHash []byte
	Prepared    string
	Startup     Startup // how this engine started
	// Stages is the layers of each pipeline stage when the worker is the head of a replica
	// spread over several processes (package pipeline), nil when it is one process. The
	// replica is one worker: the head schedules, samples and sends the KV events.
	Stages []int
	// KVFormat names how the worker stores a KV block (kvcache.BlockFormat's String), ""
	// when it cannot export blocks: the router sends a decode worker's prompts only to
	// prefill workers of its format, whose blocks it can import.
	KVFormat string
	// RouterIndex of Routers: where the router the card registers with stands among the
	// routers the worker joins (its --join addresses, sorted, each once; 0 of 0: not said,
	// or one router). Routers that front the same workers learn from it which share of the
	// workers is theirs (router.State.SetShare). Set per registration.
	RouterIndex, Routers int
}

// maxRouters bounds a card's count of routers.
const maxRouters = 1 << 16

// maxStages bounds a card's pipeline stages.
const maxStages = 1024

// Request levels (ModelCard.RequestLevel).
const (
	// RequestTokens: min tokens, allowed tokens, prompt logprobs and embeddings
	// (GenerateRequest), and their answers (GenerateEvent).
	RequestTokens = 1
	// RequestAdapters: the LoRA adapter a request runs under and its speculative decoding
	// switch (GenerateRequest), and the adapters a worker serves (LoadReport).
	RequestAdapters = 2
)

// Constraint formats (GenerateRequest's constraint, ModelCard.GrammarFormat).
const (
	// GrammarGBNF: llm.Constraint.Grammar, package grammar's GBNF dialect.
	GrammarGBNF = 1
)

// MarshalORPC implements orpc.Marshaler.
func (c *ModelCard) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(uint64(c.Version))
	e.String(c.Model)
	e.String(c.Node)
	e.String(c.Addr)
	e.String(c.Role)
	e.Uvarint(uint64(c.HashVersion))
	e.Uvarint(uint64(c.BlockSize))
	e.Uint64(c.Salt)
	e.Uvarint(uint64(c.KVBlocks))
	e.Uvarint(uint64(c.ContextLen))
	e.String(c.TokenizerFormat)
	e.Uvarint(uint64(len(c.TokenizerFiles)))
	for _, f := range c.TokenizerFiles {
		e.String(f.Name)
		e.BytesField(f.Data)
	}
	e.String(c.ChatTemplate)
	e.Uvarint(uint64(max(c.GrammarFormat, 0)))
	e.String(c.ToolCallParser)
	e.String(c.ReasoningParser)
	e.Uvarint(uint64(max(c.RequestLevel, 0)))
	e.String(c.Pooling)
	e.BytesField(c.ContentHash)
	e.String(c.Prepared)
	c.Startup.marshal(e)
	e.Uvarint(uint64(len(c.Stages)))
	for _, n := range c.Stages {
		e.Uvarint(uint64(max(n, 0)))
	}
	e.String(c.KVFormat)
	e.Uvarint(uint64(max(c.RouterIndex, 0)))
	e.Uvarint(uint64(max(c.Routers, 0)))
}

// maxFiles bounds the tokenizer files of a card.
const maxFiles = 16

// UnmarshalORPC implements orpc.Unmarshaler.
func (c *ModelCard) UnmarshalORPC(d *orpc.Decoder) error {
	c.Version = int(d.Uvarint())
	c.Model = d.String()
	c.Node = d.String()
	c.Addr = d.String()
	c.Role = d.String()
	c.HashVersion = int(d.Uvarint())
	c.BlockSize = int(d.Uvarint())
	c.Salt = d.Uint64()
	c.KVBlocks = int(d.Uvarint())
	c.ContextLen = int(d.Uvarint())
	c.TokenizerFormat = d.String()
	n := d.Uvarint()
	if n > maxFiles {
		d.Fail(fmt.Errorf("cluster: model card with %d tokenizer files (at most %d)", n, maxFiles))
		return d.Err()
	}
	c.TokenizerFiles = nil
	for range n {
		name := d.String()
		data := slices.Clone(d.BytesField())
		if d.Err() != nil {
			break
		}
		c.TokenizerFiles = append(c.TokenizerFiles, File{Name: name, Data: data})
	}
	c.ChatTemplate = d.String()
	if d.Len() > 0 {
		c.GrammarFormat = uvint(d)
		c.ToolCallParser = d.String()
		c.ReasoningParser = d.String()
	}
	if d.Len() > 0 {
		c.RequestLevel = uvint(d)
		c.Pooling = d.String()
	}
	c.ContentHash, c.Prepared, c.Startup = nil, "", Startup{}
	if d.Len() > 0 { // absent from engines before weights.go
		c.ContentHash = cloneBytes(d.BytesField())
		c.Prepared = d.String()
		c.Startup.unmarshal(d)
	}
	c.Stages = nil
	if d.Len() > 0 { // absent from engines before pipelines
		n := d.Uvarint()
		if n > maxStages {
			d.Fail(fmt.Errorf("cluster: a card of %d pipeline stages (at most %d)", n, maxStages))
		}
		for i := uint64(0); i < n && d.Err() == nil; i++ {
			c.Stages = append(c.Stages, uvint(d))
		}
	}
	c.KVFormat = ""
	if d.Len() > 0 { // absent from engines before the router paired formats
		c.KVFormat = d.String()
	}
	c.RouterIndex, c.Routers = 0, 0
	if d.Len() > 0 { // absent from engines before routers' shares
		i, n := d.Uvarint(), d.Uvarint()
		if n > maxRouters || n > 0 && i >= n {
			d.Fail(fmt.Errorf("cluster: a card placing its router %d of %d (want index < routers ≤ %d)", i, n, maxRouters))
			return d.Err()
		}
		c.RouterIndex, c.Routers = int(i), int(n)
	}
	return d.Err()
}

// RegisterReply is the router's first message on a Register call. A router that sets
// BeatMs sends it again every BeatMs for as long as the registration lasts, a sign of life.
type RegisterReply struct {
	WorkerID    uint64 // the worker's id in this router, sent back in heartbeats and events
	HeartbeatMs int    // heartbeat interval the router expects
	Router      string // the router's name, for logs
	// DispatchKey identifies this registration (random). The router's Generate calls to
	// the worker carry it; the worker counts them and reports the count back
	// (LoadReport.Received), so that the router knows which dispatches a report counts.
	DispatchKey uint64
	// HeartbeatTimeoutMs is how long the router waits for a heartbeat before it declares
	// the worker dead (0: not said). The worker takes a heartbeat unanswered for as long
	// for the router's loss, and cancels the requests that router sent it.
	HeartbeatTimeoutMs int
	// BeatMs is how often the router repeats this reply on the Register stream (0: it does
	// not). The repeats tell the worker that its router is alive, as the answers to its
	// Router.Heartbeat calls did: a worker that gets them makes none of those calls while
	// its reports go on Worker.Publish, and takes a silence of three heartbeat timeouts
	// and one beat for the router's loss. Workers that predate it read the repeats and
	// ignore them.
	BeatMs int
}

// MarshalORPC implements orpc.Marshaler.
func (r *RegisterReply) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(r.WorkerID)
	e.Uvarint(uint64(r.HeartbeatMs))
	e.String(r.Router)
	e.Uint64(r.DispatchKey)
	e.Uvarint(uint64(r.HeartbeatTimeoutMs))
	e.Uvarint(uint64(r.BeatMs))
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *RegisterReply) UnmarshalORPC(d *orpc.Decoder) error {
	r.WorkerID = d.Uvarint()
	r.HeartbeatMs = int(d.Uvarint())
	r.Router = d.String()
	if d.Len() > 0 {
		r.DispatchKey = d.Uint64()
	}
	if d.Len() > 0 {
		r.HeartbeatTimeoutMs = int(d.Uvarint())
	}
	if d.Len() > 0 {
		r.BeatMs = int(d.Uvarint())
	}
	return d.Err()
}

// LoadReport is a worker's heartbeat: its id at the router and its load.
type LoadReport struct {
	WorkerID uint64
	llm.Load
}

// MarshalORPC implements orpc.Marshaler.
func (r *LoadReport) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(r.WorkerID)
	e.Uvarint(uint64(r.Running))
	e.Uvarint(uint64(r.Waiting))
	e.Uvarint(uint64(r.PrefillTokens))
	e.Uvarint(uint64(r.DecodeBlocks))
	e.Float64(r.KVUsage)
	e.Uvarint(uint64(r.KVBlocks))
	e.Uvarint(r.LastEventID)
	e.Bool(r.Healthy)
	e.Uvarint(uint64(r.StepMicros))
	e.Uvarint(uint64(r.StepTokens))
	e.Uvarint(r.Received)
	e.Bool(r.Tracked)
	e.Uvarint(uint64(r.Queued))
	e.Uvarint(uint64(r.QueuedTokens))
	e.Uvarint(uint64(r.CachedBlocks))
	e.Uvarint(r.StepsOverTarget)
	// Lower tiers (docs/kv-tiers.md).
	e.Uvarint(uint64(r.Onboarding))
	for _, us := range r.TierLoadMicros[1:] {
		e.Uvarint(uint64(max(us, 0)))
	}
	e.Uvarint(uint64(max(r.BlockPrefillMicros, 0)))
	e.Uvarint(uint64(max(r.PullMicros, 0)))
	e.String(r.Adapters)
	e.Uvarint(r.Step)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *LoadReport) UnmarshalORPC(d *orpc.Decoder) error {
	r.WorkerID = d.Uvarint()
	r.Running = uvint(d)
	r.Waiting = uvint(d)
	r.PrefillTokens = uvint(d)
	r.DecodeBlocks = uvint(d)
	r.KVUsage = d.Float64()
	r.KVBlocks = uvint(d)
	r.LastEventID = d.Uvarint()
	r.Healthy = d.Bool()
	r.StepMicros = uvint(d)
	r.StepTokens = uvint(d)
	if d.Len() > 0 {
		r.Received = d.Uvarint()
		r.Tracked = d.Bool()
	}
	if d.Len() > 0 { // since the queued prompts and the cache size were reported
		r.Queued = uvint(d)
		r.QueuedTokens = uvint(d)
		r.CachedBlocks = uvint(d)
	}
	if d.Len() > 0 { // trailing, as Received: an older worker's report ends before it
		r.StepsOverTarget = d.Uvarint()
	}
	if d.Len() > 0 { // since lower tiers' load costs were reported
		r.Onboarding = uvint(d)
		for i := 1; i < len(r.TierLoadMicros); i++ {
			r.TierLoadMicros[i] = uvint(d)
		}
		r.BlockPrefillMicros = uvint(d)
		r.PullMicros = uvint(d)
	}
	if d.Len() > 0 { // since LoRA adapters (RequestAdapters)
		r.Adapters = d.String()
	}
	r.Step = 0
	if d.Len() > 0 { // since engine steps were numbered: 0 from an older worker
		r.Step = d.Uvarint()
	}
	return d.Err()
}

// uvint reads a uvarint that must fit an int.
func uvint(d *orpc.Decoder) int {
	v := d.Uvarint()
	if v > 1<<62 {
		d.Fail(orpc.ErrOverflow)
		return 0
	}
	return int(v)
}

// Ack is an empty reply.
type Ack struct{}

// MarshalORPC implements orpc.Marshaler.
func (*Ack) MarshalORPC(*orpc.Encoder) {}

// UnmarshalORPC implements orpc.Unmarshaler.
func (*Ack) UnmarshalORPC(d *orpc.Decoder) error { return d.Err() }

// maxEvents bounds a KVEvents batch.
const maxEvents = 1 << 16

// KVEvents is a batch of a worker's KV events (docs/kv-events.md), in increasing id order.
type KVEvents struct {
	WorkerID uint64
	Events   []kvcache.Event
}

// MarshalORPC implements orpc.Marshaler.
func (b *KVEvents) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(b.WorkerID)
	e.Uvarint(uint64(len(b.Events)))
	for _, ev := range b.Events {
		e.Uvarint(ev.ID)
		e.Uint8(uint8(ev.Kind))
		e.Uint8(uint8(ev.Tier))
		e.Uint64(ev.Parent)
		e.FixedUint64s(ev.Hashes)
	}
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (b *KVEvents) UnmarshalORPC(d *orpc.Decoder) error {
	b.WorkerID = d.Uvarint()
	n := d.Uvarint()
	if n > maxEvents || n > uint64(d.Len()) {
		d.Fail(fmt.Errorf("cluster: KV event batch of %d events", n))
		return d.Err()
	}
	b.Events = make([]kvcache.Event, 0, n)
	for range n {
		var ev kvcache.Event
		ev.ID = d.Uvarint()
		ev.Kind = kvcache.EventKind(d.Uint8())
		ev.Tier = kvcache.Tier(d.Uint8())
		ev.Parent = d.Uint64()
		ev.Hashes = d.FixedUint64s()
		if d.Err() != nil {
			break
		}
		b.Events = append(b.Events, ev)
	}
	return d.Err()
}

// SnapshotRequest asks a worker for its prefix cache.
type SnapshotRequest struct{}

// MarshalORPC implements orpc.Marshaler.
func (*SnapshotRequest) MarshalORPC(*orpc.Encoder) {}

// UnmarshalORPC implements orpc.Unmarshaler.
func (*SnapshotRequest) UnmarshalORPC(d *orpc.Decoder) error { return d.Err() }

// Snapshot carries a kvcache.Snapshot: hashes and parents as two parallel arrays.
type Snapshot struct {
	kvcache.Snapshot
}

// MarshalORPC implements orpc.Marshaler.
func (s *Snapshot) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(s.LastID)
	e.Uint8(uint8(s.Tier))
	hashes := make([]uint64, len(s.Blocks))
	parents := make([]uint64, len(s.Blocks))
	for i, b := range s.Blocks {
		hashes[i], parents[i] = b.Hash, b.Parent
	}
	e.FixedUint64s(hashes)
	e.FixedUint64s(parents)
	// The lower tiers (docs/kv-tiers.md), trailing: an older router reads the device's.
	e.Uvarint(uint64(len(s.Lower)))
	for _, t := range s.Lower {
		e.Uint8(uint8(t.Tier))
		hs := make([]uint64, len(t.Blocks))
		ps := make([]uint64, len(t.Blocks))
		for i, b := range t.Blocks {
			hs[i], ps[i] = b.Hash, b.Parent
		}
		e.FixedUint64s(hs)
		e.FixedUint64s(ps)
	}
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (s *Snapshot) UnmarshalORPC(d *orpc.Decoder) error {
	s.LastID = d.Uvarint()
	s.Tier = kvcache.Tier(d.Uint8())
	hashes := d.FixedUint64s()
	parents := d.FixedUint64s()
	if d.Err() != nil {
		return d.Err()
	}
	if len(hashes) != len(parents) {
		d.Fail(fmt.Errorf("cluster: snapshot with %d hashes and %d parents", len(hashes), len(parents)))
		return d.Err()
	}
	s.Blocks = blocksOf(hashes, parents)
	if d.Len() == 0 {
		return nil // from a worker that predates lower tiers
	}
	n := d.Uvarint()
	if n > 8 {
		d.Fail(fmt.Errorf("cluster: snapshot of %d lower tiers", n))
		return d.Err()
	}
	for range n {
		t := kvcache.Tier(d.Uint8())
		hs, ps := d.FixedUint64s(), d.FixedUint64s()
		if d.Err() != nil {
			return d.Err()
		}
		if len(hs) != len(ps) {
			d.Fail(fmt.Errorf("cluster: snapshot of tier %v with %d hashes and %d parents", t, len(hs), len(ps)))
			return d.Err()
		}
		s.Lower = append(s.Lower, kvcache.TierSnapshot{Tier: t, Blocks: blocksOf(hs, ps)})
	}
	return d.Err()
}

func blocksOf(hashes, parents []uint64) []kvcache.CachedBlock {
	bs := make([]kvcache.CachedBlock, len(hashes))
	for i := range hashes {
		bs[i] = kvcache.CachedBlock{Hash: hashes[i], Parent: parents[i]}
	}
	return bs
}

// GenerateRequest is an llm.Request on the wire.
type GenerateRequest struct {
	llm.Request
	// PredictedCached is the router's prediction of the prompt tokens the worker holds in
	// its prefix cache; the worker counts the rest as pending prefill in its load reports
	// until the first token.
	PredictedCached int
	// DispatchKey is the worker's RegisterReply.DispatchKey at the dispatching router
	// (0: none) and DispatchSeq the router's number for this dispatch (1, 2, …); the
	// worker reports the highest number received per key.
	DispatchKey uint64
	DispatchSeq uint64
	// Peer, when its Addr is set, is a worker holding the prompt's leading blocks that this
	// worker lacks (docs/kv-tiers.md, "Peer pulls"): the router found pulling them
	// cheaper than computing them. The worker pulls them (Worker.PullKV from the peer's
	// cache) before it generates, and computes whatever the pull does not bring.
	Peer KVPeer
	// StreamInterval, above 1, lets Worker.Generate send its tokens StreamInterval to a
	// message (one EventTokens event; the first token alone, the last ones with the
	// finish), as the router's --stream-interval writes them to its client. 0 or 1: one
	// token per message. A worker that does not know the field sends one per message.
	StreamInterval int
}

// KVPeer names a worker to pull a prompt's leading blocks from.
type KVPeer struct {
	Addr   string // its ORPC address
	Node   string // its name, for logs
	Blocks int    // the prompt's leading full blocks it holds (in any of its tiers but remote)
	// TimeoutMs bounds the pull (0: the worker's --kv-transfer-timeout); past it the
	// worker computes the rest.
	TimeoutMs int
}

// maxLogitBias bounds the logit bias entries decoded.
const maxLogitBias = 1 << 20

// MarshalORPC implements orpc.Marshaler.
func (r *GenerateRequest) MarshalORPC(e *orpc.Encoder) {
	e.String(r.ID)
	e.String(r.Model)
	e.Int32s(r.Prompt)
	e.Uvarint(uint64(max(r.MaxTokens, 0)))
	e.Int32s(r.StopTokens)
	e.Bool(r.IgnoreEOS)
	e.Varint(int64(r.Priority))
	var arrival int64
	if !r.Arrival.IsZero() {
		arrival = r.Arrival.UnixNano()
	}
	e.Varint(arrival)
	p := &r.Sampling
	e.Float32(p.Temperature)
	e.Varint(int64(p.TopK))
	e.Float32(p.TopP)
	e.Float32(p.MinP)
	e.Float32(p.RepetitionPenalty)
	e.Float32(p.PresencePenalty)
	e.Float32(p.FrequencyPenalty)
	ids := make([]int32, 0, len(p.LogitBias))
	for id := range p.LogitBias {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	e.Uvarint(uint64(len(ids)))
	for _, id := range ids {
		e.Varint(int64(id))
		e.Float32(p.LogitBias[id])
	}
	e.Uint64(p.Seed)
	e.Bool(p.HasSeed)
	e.Uvarint(uint64(max(p.TopLogprobs, 0)))
	e.Bool(p.Logprobs)
	e.Uvarint(uint64(max(r.PredictedCached, 0)))
	e.Uint64(r.DispatchKey)
	e.Uvarint(uint64(max(r.Resumed, 0)))
	e.Uvarint(r.DispatchSeq)
	if r.Constraint.IsZero() {
		e.Uvarint(0)
	} else {
		e.Uvarint(GrammarGBNF)
	}
	e.String(r.Constraint.Grammar)
	// RequestTokens.
	e.Uvarint(uint64(max(p.MinTokens, 0)))
	e.Int32s(p.AllowedTokens)
	e.Bool(r.PromptLogprobs)
	e.Uvarint(uint64(max(r.PromptTopLogprobs, 0)))
	e.String(string(r.Pooling))
	// Peer pulls (docs/kv-tiers.md).
	e.String(r.Peer.Addr)
	e.String(r.Peer.Node)
	e.Uvarint(uint64(max(r.Peer.Blocks, 0)))
	e.Uvarint(uint64(max(r.Peer.TimeoutMs, 0)))
	// RequestAdapters.
	e.String(r.Adapter)
	e.Bool(r.NoSpeculation)
	// The stream interval, written only when above 1 (a request stays as it was before it).
	// A field added after it must write it always.
	if r.StreamInterval > 1 {
		e.Uvarint(uint64(r.StreamInterval))
	}
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *GenerateRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.ID = d.String()
	r.Model = d.String()
	r.Prompt = d.Int32s()
	r.MaxTokens = uvint(d)
	r.StopTokens = d.Int32s()
	r.IgnoreEOS = d.Bool()
	r.Priority = int(d.Varint())
	if a := d.Varint(); a != 0 {
		r.Arrival = time.Unix(0, a)
	}
	p := &r.Sampling
	p.Temperature = d.Float32()
	p.TopK = int(d.Varint())
	p.TopP = d.Float32()
	p.MinP = d.Float32()
	p.RepetitionPenalty = d.Float32()
	p.PresencePenalty = d.Float32()
	p.FrequencyPenalty = d.Float32()
	n := d.Uvarint()
	if n > maxLogitBias || n > uint64(d.Len()) {
		d.Fail(fmt.Errorf("cluster: %d logit bias entries", n))
		return d.Err()
	}
	if n > 0 {
		p.LogitBias = make(map[int32]float32, n)
		for range n {
			id := d.Varint()
			v := d.Float32()
			if id < -1<<31 || id >= 1<<31 {
				d.Fail(orpc.ErrOverflow)
				break
			}
			p.LogitBias[int32(id)] = v
		}
	}
	p.Seed = d.Uint64()
	p.HasSeed = d.Bool()
	p.TopLogprobs = uvint(d)
	p.Logprobs = d.Bool()
	if d.Len() > 0 {
		r.PredictedCached = uvint(d)
	}
	if d.Len() > 0 {
		r.DispatchKey = d.Uint64()
		r.Resumed = uvint(d)
		r.DispatchSeq = d.Uvarint()
	}
	if d.Len() > 0 {
		format := d.Uvarint()
		grammar := d.String()
		switch format {
		case 0:
		case GrammarGBNF:
			r.Constraint.Grammar = grammar
		default:
			d.Fail(fmt.Errorf("cluster: constraint format %d is unknown (this worker follows format %d)", format, GrammarGBNF))
		}
	}
	if d.Len() > 0 {
		p.MinTokens = uvint(d)
		p.AllowedTokens = d.Int32s()
		r.PromptLogprobs = d.Bool()
		r.PromptTopLogprobs = uvint(d)
		r.Pooling = llm.Pooling(d.String())
	}
	if d.Len() > 0 {
		r.Peer.Addr = d.String()
		r.Peer.Node = d.String()
		r.Peer.Blocks = uvint(d)
		r.Peer.TimeoutMs = durationMs(d)
	}
	if d.Len() > 0 { // since LoRA adapters (RequestAdapters)
		r.Adapter = d.String()
		r.NoSpeculation = d.Bool()
	}
	if d.Len() > 0 { // since the stream interval
		r.StreamInterval = min(uvint(d), MaxStreamInterval)
	}
	return d.Err()
}

// MaxStreamInterval bounds GenerateRequest.StreamInterval: the tokens of one EventTokens
// message.
const MaxStreamInterval = 1024

// EventKind says what a GenerateEvent is.
type EventKind uint8

// Generate event kinds.
const (
	EventToken    EventKind = 0 // a generated token (the last one has Finish and Usage)
	EventAccepted EventKind = 1 // the worker queued the request; tokens follow
	EventError    EventKind = 2 // the request failed: Err and Message; nothing follows
	// EventTokens is several tokens in one message (Tokens), sent only to a router that
	// asked for them (GenerateRequest.StreamInterval): each as an EventToken would carry it.
	EventTokens EventKind = 3
)

// ErrKind classifies a generation error so that the router can answer as the engine would.
type ErrKind uint8

// Error kinds, one per llm error.
const (
	ErrOther         ErrKind = 0 // 500
	ErrInvalid       ErrKind = 1 // llm.ErrInvalid, 400
	ErrPromptTooLong ErrKind = 2 // llm.ErrPromptTooLong, 400
	ErrQueueFull     ErrKind = 3 // llm.ErrQueueFull, 429
	ErrUnavailable   ErrKind = 4 // llm.ErrUnavailable, 503
)

// Kind returns the ErrKind of err.
func Kind(err error) ErrKind {
	switch {
	case errors.Is(err, llm.ErrInvalid):
		return ErrInvalid
	case errors.Is(err, llm.ErrPromptTooLong):
		return ErrPromptTooLong
	case errors.Is(err, llm.ErrQueueFull):
		return ErrQueueFull
	case errors.Is(err, llm.ErrUnavailable):
		return ErrUnavailable
	}
	return ErrOther
}

// GenerateEvent is one message of a Generate stream.
type GenerateEvent struct {
	Kind    EventKind
	Event   llm.Event   // EventToken
	Err     ErrKind     // EventError
	Message string      // EventError: the worker's error text
	Tokens  []llm.Event // EventTokens, in order; the decoder reuses the slice
}

// ErrorEvent returns the EventError event for err.
func ErrorEvent(err error) *GenerateEvent {
	return &GenerateEvent{Kind: EventError, Err: Kind(err), Message: err.Error()}
}

// Error returns the error an EventError event stands for, wrapping the matching llm error.
func (g *GenerateEvent) Error() error {
	var base error
	switch g.Err {
	case ErrInvalid:
		base = llm.ErrInvalid
	case ErrPromptTooLong:
		base = llm.ErrPromptTooLong
	case ErrQueueFull:
		base = llm.ErrQueueFull
	case ErrUnavailable:
		base = llm.ErrUnavailable
	default:
		return fmt.Errorf("worker: %s", g.Message)
	}
	return &workerError{msg: g.Message, base: base}
}

// workerError is a worker's error text wrapping the llm error of its kind.
type workerError struct {
	msg  string
	base error
}

func (e *workerError) Error() string { return "worker: " + e.msg }
func (e *workerError) Unwrap() error { return e.base }

// maxTop bounds the alternatives decoded per token.
const maxTop = 1024

// MarshalORPC implements orpc.Marshaler.
func (g *GenerateEvent) MarshalORPC(e *orpc.Encoder) {
	if g.Kind == EventTokens {
		// u8 kind · uvarint n · n × message GenerateEvent (an EventToken each).
		e.Uint8(uint8(EventTokens))
		e.Uvarint(uint64(len(g.Tokens)))
		for i := range g.Tokens {
			mark := e.BeginMessage()
			marshalGenerateEvent(e, EventToken, &g.Tokens[i], 0, "")
			e.EndMessage(mark)
		}
		return
	}
	marshalGenerateEvent(e, g.Kind, &g.Event, g.Err, g.Message)
}

// marshalGenerateEvent writes one event of any kind but EventTokens.
func marshalGenerateEvent(e *orpc.Encoder, kind EventKind, ev *llm.Event, errKind ErrKind, msg string) {
	e.Uint8(uint8(kind))
	e.Varint(int64(ev.Token))
	e.Float32(ev.Logprob)
	e.Uvarint(uint64(len(ev.Top)))
	for _, t := range ev.Top {
		e.Varint(int64(t.ID))
		e.Float32(t.Logprob)
	}
	e.String(string(ev.Finish))
	e.Uvarint(uint64(ev.Usage.PromptTokens))
	e.Uvarint(uint64(ev.Usage.CachedTokens))
	e.Uvarint(uint64(ev.Usage.CompletionTokens))
	e.Uint8(uint8(errKind))
	e.String(msg)
	// The tail (prompt logprobs, embedding, step), written only when there is something: a
	// token's event stays short. A field added after step is written whenever the tail is.
	if len(ev.PromptLogprobs) == 0 && ev.Embedding == nil && ev.Step == 0 {
		return
	}
	e.Uvarint(uint64(len(ev.PromptLogprobs)))
	for _, p := range ev.PromptLogprobs {
		e.Float32(p.Logprob)
		e.Uvarint(uint64(max(p.Rank, 0)))
		e.Uvarint(uint64(len(p.Top)))
		for _, t := range p.Top {
			e.Varint(int64(t.ID))
			e.Float32(t.Logprob)
		}
	}
	e.Float32s(ev.Embedding)
	e.Uvarint(ev.Step)
}

// UnmarshalORPC implements orpc.Unmarshaler. An EventTokens event's Tokens reuse the
// slice g had.
func (g *GenerateEvent) UnmarshalORPC(d *orpc.Decoder) error {
	g.Kind = EventKind(d.Uint8())
	g.Tokens = g.Tokens[:0]
	if g.Kind != EventTokens {
		return unmarshalGenerateEvent(d, g)
	}
	g.Event, g.Err, g.Message = llm.Event{}, 0, ""
	n := d.Uvarint()
	if n > MaxStreamInterval || n > uint64(d.Len()) {
		d.Fail(fmt.Errorf("cluster: %d tokens in one message", n))
		return d.Err()
	}
	for range n {
		sub := orpc.DecoderOf(d.BytesField())
		if d.Err() != nil {
			return d.Err()
		}
		var one GenerateEvent
		if one.Kind = EventKind(sub.Uint8()); one.Kind != EventToken {
			d.Fail(fmt.Errorf("cluster: an event of kind %d among tokens", one.Kind))
			return d.Err()
		}
		if err := unmarshalGenerateEvent(&sub, &one); err != nil {
			d.Fail(err)
			return d.Err()
		}
		g.Tokens = append(g.Tokens, one.Event)
	}
	return d.Err()
}

// unmarshalGenerateEvent reads the fields after the kind of one event of any kind but
// EventTokens.
func unmarshalGenerateEvent(d *orpc.Decoder, g *GenerateEvent) error {
	ev := &g.Event
	ev.Token = int32(d.Varint())
	ev.Logprob = d.Float32()
	n := d.Uvarint()
	if n > maxTop || n > uint64(d.Len()) {
		d.Fail(fmt.Errorf("cluster: %d top logprobs", n))
		return d.Err()
	}
	ev.Top = nil
	if n > 0 {
		ev.Top = make([]llm.TokenLogprob, n)
		for i := range ev.Top {
			ev.Top[i] = llm.TokenLogprob{ID: int32(d.Varint()), Logprob: d.Float32()}
		}
	}
	ev.Finish = llm.FinishReason(d.String())
	ev.Usage.PromptTokens = uvint(d)
	ev.Usage.CachedTokens = uvint(d)
	ev.Usage.CompletionTokens = uvint(d)
	g.Err = ErrKind(d.Uint8())
	g.Message = d.String()
	ev.PromptLogprobs, ev.Embedding, ev.Step = nil, nil, 0
	if d.Len() > 0 {
		n := d.Uvarint()
		if n > uint64(d.Len()) {
			d.Fail(fmt.Errorf("cluster: %d prompt logprobs", n))
			return d.Err()
		}
		if n > 0 {
			ev.PromptLogprobs = make([]llm.PromptLogprob, 0, n)
		}
		for range n {
			p := llm.PromptLogprob{Logprob: d.Float32(), Rank: uvint(d)}
			k := d.Uvarint()
			if k > maxTop || k > uint64(d.Len()) {
				d.Fail(fmt.Errorf("cluster: %d top prompt logprobs", k))
				return d.Err()
			}
			if k > 0 {
				p.Top = make([]llm.TokenLogprob, k)
				for i := range p.Top {
					p.Top[i] = llm.TokenLogprob{ID: int32(d.Varint()), Logprob: d.Float32()}
				}
			}
			if d.Err() != nil {
				return d.Err()
			}
			ev.PromptLogprobs = append(ev.PromptLogprobs, p)
		}
		ev.Embedding = d.Float32s()
		if d.Len() > 0 { // since engine steps were numbered
			ev.Step = d.Uvarint()
		}
	}
	return d.Err()
}

// TokenizerFile returns the named file of the card, or nil.
func (c *ModelCard) TokenizerFile(name string) []byte {
	i := slices.IndexFunc(c.TokenizerFiles, func(f File) bool { return f.Name == name })
	if i < 0 {
		return nil
	}
	return c.TokenizerFiles[i].Data
}

// SameTokenizer reports whether two cards carry the same tokenizer and chat template.
func SameTokenizer(a, b *ModelCard) bool {
	if a.TokenizerFormat != b.TokenizerFormat || a.ChatTemplate != b.ChatTemplate || len(a.TokenizerFiles) != len(b.TokenizerFiles) {
		return false
	}
	fa, fb := slices.Clone(a.TokenizerFiles), slices.Clone(b.TokenizerFiles)
	byName := func(x, y File) int { return cmp.Compare(x.Name, y.Name) }
	slices.SortFunc(fa, byName)
	slices.SortFunc(fb, byName)
	for i := range fa {
		if fa[i].Name != fb[i].Name || string(fa[i].Data) != string(fb[i].Data) {
			return false
		}
	}
	return true
}
