package cluster

// Messages of disaggregated prefill and decode (docs/disaggregation.md): the router asks a
// prefill worker P for a prompt's KV and first token (Worker.Prefill), then a decode worker D
// to continue the request (Worker.Decode); D pulls the blocks it lacks from P directly
// (Worker.PullKV) and tells P it may free them (Worker.ReleaseKV).

import (
	"fmt"
	"hash/crc32"

	"tandem/kvcache"
	"tandem/orpc"
)

// Methods of disaggregation, served by workers.
const (
	// MethodPrefill (unary): PrefillRequest → PrefillReply. P computes the prompt's KV and the
	// first token, and holds the prompt's blocks for a pull until released or HoldMs passes.
	MethodPrefill = "Worker.Prefill"
	// MethodDecode (server-streaming): DecodeRequest → GenerateEvent*, as Worker.Generate: an
	// Accepted (or Error) event at once, then the tokens after the prompt (whose last token is
	// the first token P produced). Before generating, D pulls from Source the prompt's blocks
	// it lacks; if that fails it computes them itself, unless Source.Strict.
	MethodDecode = "Worker.Decode"
	// MethodPullKV (server-streaming): PullRequest → KVBlock*, one per wanted block, in the
	// order asked. A layout that differs from the holder's fails with FailedPrecondition, an
	// unknown or expired handle with NotFound.
	MethodPullKV = "Worker.PullKV"
	// MethodReleaseKV (unary): ReleaseRequest → ReleaseReply: the holder frees the blocks.
	MethodReleaseKV = "Worker.ReleaseKV"
)

// KVLayout is a KV block's format on the wire: kvcache.BlockFormat (what the engine's
// KV store reads and writes, engine.KVFormat), with its codec.
type KVLayout kvcache.BlockFormat

// MarshalORPC implements orpc.Marshaler.
func (l *KVLayout) MarshalORPC(e *orpc.Encoder) {
	e.String(l.Store)
	e.String(l.DType)
	e.Uvarint(uint64(l.BlockSize))
	e.Uvarint(uint64(l.Layers))
	e.Uvarint(uint64(l.KVHeads))
	e.Uvarint(uint64(l.HeadDim))
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (l *KVLayout) UnmarshalORPC(d *orpc.Decoder) error {
	l.Store = d.String()
	l.DType = d.String()
	l.BlockSize = uvint(d)
	l.Layers = uvint(d)
	l.KVHeads = uvint(d)
	l.HeadDim = uvint(d)
	return d.Err()
}

// PrefillRequest asks P for a prompt's KV and first token.
type PrefillRequest struct {
	Generate GenerateRequest // the whole request; P generates only its first token
	HoldMs   int             // how long P keeps the blocks for a pull, unless released
	// TransferID names the transfer in PullKV and ReleaseKV (the caller's choice, random;
	// 0: P picks one and returns it as PrefillReply.Handle). A pull may arrive before the
	// prefill does, and wait for it: so the router can start D as it starts P, and the
	// blocks flow while later ones are still being computed.
	TransferID uint64
}

// MarshalORPC implements orpc.Marshaler.
func (r *PrefillRequest) MarshalORPC(e *orpc.Encoder) {
	e.Message(&r.Generate)
	e.Uvarint(uint64(max(r.HoldMs, 0)))
	e.Uint64(r.TransferID)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *PrefillRequest) UnmarshalORPC(d *orpc.Decoder) error {
	d.Message(&r.Generate)
	r.HoldMs = durationMs(d)
	if d.Len() > 0 {
		r.TransferID = d.Uint64()
	}
	return d.Err()
}

// PrefillReply is P's answer: the first token (an EventToken, or an EventError when P
// refused or failed the request) and the handle of the held blocks. When the first token
// ends the request (a stop token, or a request for one token) its Finish and Usage are set
// and nothing is held (Handle 0).
type PrefillReply struct {
	First  GenerateEvent
	Handle uint64 // the transfer id: names the held blocks in PullKV and ReleaseKV
	Blocks int    // full prompt blocks held
	Layout KVLayout
}

// MarshalORPC implements orpc.Marshaler.
func (r *PrefillReply) MarshalORPC(e *orpc.Encoder) {
	e.Message(&r.First)
	e.Uvarint(r.Handle)
	e.Uvarint(uint64(r.Blocks))
	r.Layout.MarshalORPC(e)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *PrefillReply) UnmarshalORPC(d *orpc.Decoder) error {
	d.Message(&r.First)
	r.Handle = d.Uvarint()
	r.Blocks = uvint(d)
	return r.Layout.UnmarshalORPC(d)
}

// KVSource says where D finds a prompt's KV.
type KVSource struct {
	Addr   string // P's ORPC address
	Node   string // P's name, for logs
	Handle uint64
	// PromptLen is the length of the prompt P computed: the DecodeRequest's prompt without
	// the first token appended. Only its full blocks are pulled.
	PromptLen int
	// TimeoutMs bounds the pull; past it the transfer is abandoned (and, unless Strict, D
	// computes the rest itself).
	TimeoutMs int
	// Strict fails the request when the transfer fails, instead of prefilling locally.
	Strict bool
}

// DecodeRequest asks D to run a request whose prompt's KV is (being) computed on P.
type DecodeRequest struct {
	// Generate is the request. Its prompt is the original one (D computes the first token
	// again from the pulled KV: the same token, the kernels being batch-invariant), or,
	// when the router waited for P, the original with P's first token appended and resumed.
	Generate GenerateRequest
	Source   KVSource
}

// MarshalORPC implements orpc.Marshaler.
func (r *DecodeRequest) MarshalORPC(e *orpc.Encoder) {
	e.Message(&r.Generate)
	s := &r.Source
	e.String(s.Addr)
	e.String(s.Node)
	e.Uvarint(s.Handle)
	e.Uvarint(uint64(max(s.PromptLen, 0)))
	e.Uvarint(uint64(max(s.TimeoutMs, 0)))
	e.Bool(s.Strict)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *DecodeRequest) UnmarshalORPC(d *orpc.Decoder) error {
	d.Message(&r.Generate)
	s := &r.Source
	s.Addr = d.String()
	s.Node = d.String()
	s.Handle = d.Uvarint()
	s.PromptLen = uvint(d)
	s.TimeoutMs = durationMs(d)
	s.Strict = d.Bool()
	if d.Err() == nil && s.PromptLen > len(r.Generate.Prompt) {
		d.Fail(fmt.Errorf("cluster: KV source prompt length %d beyond the prompt's %d", s.PromptLen, len(r.Generate.Prompt)))
	}
	return d.Err()
}

// PullRequest asks the holder of Handle for the blocks with the given sequence hashes, in
// the receiver's Layout (which must equal the holder's). With Cached, there is no handle:
// the holder sends the leading run of the hashes that its cache holds (device, host
// memory, disk), as far as it goes, for a peer pull (docs/kv-tiers.md).
type PullRequest struct {
	Handle uint64
	Layout KVLayout
	Hashes []uint64
	Cached bool
}

// MarshalORPC implements orpc.Marshaler.
func (r *PullRequest) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(r.Handle)
	r.Layout.MarshalORPC(e)
	e.FixedUint64s(r.Hashes)
	e.Bool(r.Cached)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *PullRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.Handle = d.Uvarint()
	r.Layout.UnmarshalORPC(d)
	r.Hashes = d.FixedUint64s()
	if d.Len() > 0 {
		r.Cached = d.Bool()
	}
	return d.Err()
}

// KVBlock is one block of a pull: its index among the prompt's blocks, its sequence hash,
// the CRC-32C (Castagnoli) of Data, and Data in the agreed layout.
type KVBlock struct {
	Index int
	Hash  uint64
	CRC   uint32
	Data  []byte // aliases the received frame: copy or consume before the next receive
}

// MarshalORPC implements orpc.Marshaler.
func (b *KVBlock) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(uint64(b.Index))
	e.Uint64(b.Hash)
	e.Uint32(b.CRC)
	e.BytesField(b.Data)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (b *KVBlock) UnmarshalORPC(d *orpc.Decoder) error {
	b.Index = uvint(d)
	b.Hash = d.Uint64()
	b.CRC = d.Uint32()
	b.Data = d.BytesField()
	return d.Err()
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// BlockCRC is the checksum a KVBlock carries.
func BlockCRC(data []byte) uint32 { return crc32.Checksum(data, castagnoli) }

// Verify checks the block's checksum.
func (b *KVBlock) Verify() error {
	if got := BlockCRC(b.Data); got != b.CRC {
		return fmt.Errorf("cluster: KV block %d (%#016x): checksum %08x, sent %08x", b.Index, b.Hash, got, b.CRC)
	}
	return nil
}

// ReleaseRequest tells a holder to free the blocks under Handle.
type ReleaseRequest struct{ Handle uint64 }

// MarshalORPC implements orpc.Marshaler.
func (r *ReleaseRequest) MarshalORPC(e *orpc.Encoder) { e.Uvarint(r.Handle) }

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *ReleaseRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.Handle = d.Uvarint()
	return d.Err()
}

// ReleaseReply says whether the handle was still held.
type ReleaseReply struct{ Released bool }

// MarshalORPC implements orpc.Marshaler.
func (r *ReleaseReply) MarshalORPC(e *orpc.Encoder) { e.Bool(r.Released) }

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *ReleaseReply) UnmarshalORPC(d *orpc.Decoder) error {
	r.Released = d.Bool()
	return d.Err()
}

// maxDurationMs bounds the durations a peer may ask for (a hold, a pull deadline): a day,
// far above any sensible value, and far below what overflows a time.Duration in ms.
const maxDurationMs = 24 * 60 * 60 * 1000

// durationMs reads a duration in milliseconds of at most maxDurationMs.
func durationMs(d *orpc.Decoder) int {
	v := d.Uvarint()
	if v > maxDurationMs {
		d.Fail(fmt.Errorf("cluster: a duration of %d ms (at most %d)", v, maxDurationMs))
		return 0
	}
	return int(v)
}
