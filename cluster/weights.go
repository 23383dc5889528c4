package cluster

// Messages of the weights transfer (docs/orpc.md, "Weights from a peer"): a new engine
// asks a router for the workers serving a model of its content hash (Router.WeightPeers),
// then pulls the prepared form of every weight from one of them (Worker.PullWeights), in
// several streams at once, and uses it in place of preparing its own.

import (
	"fmt"
	"iter"
	"math"
	"slices"

	"tandem/orpc"
)

const (
	// MethodWeightPeers (unary, served by routers): WeightPeersRequest → WeightPeers, the
	// registered workers whose model has the content hash asked.
	MethodWeightPeers = "Router.WeightPeers"
	// MethodPullWeights (server-streaming, served by workers): WeightsRequest →
	// WeightChunk*. A worker whose model has another content hash refuses with
	// FailedPrecondition, as it does a weight it does not have in the format and size
	// asked; one that sends too many pulls already, with ResourceExhausted.
	MethodPullWeights = "Worker.PullWeights"
)

// Where an engine's weights came from (Startup.Weights).
const (
	WeightsFile      = "file"       // the model file, prepared here
	WeightsPackCache = "pack-cache" // prepared weights mapped from a pack cache
	WeightsPeer      = "peer"       // prepared weights pulled from a peer
)

// Startup is how an engine started: where its weights came from and how long each phase
// took, in order. The planner weighs what a new replica costs to start by it.
type Startup struct {
	Weights string
	Phases  []Phase
}

// Phase is one start-up phase and its duration in seconds.
type Phase struct {
	Name    string
	Seconds float64
}

// Total is the phases' sum.
func (s Startup) Total() float64 {
	var t float64
	for _, p := range s.Phases {
		t += p.Seconds
	}
	return t
}

// maxPhases bounds a Startup's phases.
const maxPhases = 32

func (s *Startup) marshal(e *orpc.Encoder) {
	e.String(s.Weights)
	e.Uvarint(uint64(len(s.Phases)))
	for _, p := range s.Phases {
		e.String(p.Name)
		e.Float64(p.Seconds)
	}
}

func (s *Startup) unmarshal(d *orpc.Decoder) {
	s.Weights = d.String()
	n := d.Uvarint()
	if n > maxPhases {
		d.Fail(fmt.Errorf("cluster: start-up of %d phases (at most %d)", n, maxPhases))
		return
	}
	s.Phases = nil
	for range n {
		p := Phase{Name: d.String(), Seconds: d.Float64()}
		if d.Err() != nil {
			return
		}
		s.Phases = append(s.Phases, p)
	}
}

// WeightPeersRequest asks a router for the workers of a model's content hash.
type WeightPeersRequest struct {
	Model       string // the served model name, for logs
	ContentHash []byte
}

// MarshalORPC implements orpc.Marshaler.
func (r *WeightPeersRequest) MarshalORPC(e *orpc.Encoder) {
	e.String(r.Model)
	e.BytesField(r.ContentHash)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *WeightPeersRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.Model = d.String()
	r.ContentHash = cloneBytes(d.BytesField())
	return d.Err()
}

// WeightPeer is a worker that may serve a pull: its name, ORPC address and backend's
// prepared-weights key (a puller of another key would be refused every weight).
type WeightPeer struct {
	Node, Addr, Prepared string
}

// WeightPeers is the router's answer: healthy workers first, then by registration.
type WeightPeers struct {
	Peers []WeightPeer
}

// maxPeers bounds a WeightPeers answer.
const maxPeers = 1024

// MarshalORPC implements orpc.Marshaler.
func (p *WeightPeers) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(uint64(len(p.Peers)))
	for _, w := range p.Peers {
		e.String(w.Node)
		e.String(w.Addr)
		e.String(w.Prepared)
	}
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (p *WeightPeers) UnmarshalORPC(d *orpc.Decoder) error {
	n := d.Uvarint()
	if n > maxPeers {
		d.Fail(fmt.Errorf("cluster: %d weight peers (at most %d)", n, maxPeers))
		return d.Err()
	}
	p.Peers = nil
	for range n {
		w := WeightPeer{Node: d.String(), Addr: d.String(), Prepared: d.String()}
		if d.Err() != nil {
			break
		}
		p.Peers = append(p.Peers, w)
	}
	return d.Err()
}

// WantedWeight is one weight a puller wants: its name in the model file, and the format
// and size of the prepared form its own backend would make of it.
type WantedWeight struct {
	Name   string
	Format string
	Size   int64
}

// WeightsRequest asks a worker for prepared weights. The weights' bytes, one after
// another in the order asked, are cut into chunks of ChunkBytes (the last of each weight
// shorter); the chunks are numbered in that order across all weights, and this call
// carries those whose number is Stream modulo Streams, so that Streams calls at once
// carry each chunk once.
type WeightsRequest struct {
	ContentHash     []byte // the puller's model's SHA-256
	Weights         []WantedWeight
	Stream, Streams int
	ChunkBytes      int
}

// Limits of a WeightsRequest.
const (
	maxWantedWeights  = 1 << 16
	MaxWeightStreams  = 64
	MaxWeightChunk    = 8 << 20
	DefaultChunkBytes = 4 << 20
)

// MarshalORPC implements orpc.Marshaler.
func (r *WeightsRequest) MarshalORPC(e *orpc.Encoder) {
	e.BytesField(r.ContentHash)
	e.Uvarint(uint64(len(r.Weights)))
	for _, w := range r.Weights {
		e.String(w.Name)
		e.String(w.Format)
		e.Uvarint(uint64(w.Size))
	}
	e.Uvarint(uint64(r.Stream))
	e.Uvarint(uint64(r.Streams))
	e.Uvarint(uint64(r.ChunkBytes))
}

// UnmarshalORPC implements orpc.Unmarshaler; it refuses a stream number, stream count or
// chunk size out of range.
func (r *WeightsRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.ContentHash = cloneBytes(d.BytesField())
	n := d.Uvarint()
	if n > maxWantedWeights || n > uint64(d.Len()) {
		d.Fail(fmt.Errorf("cluster: a pull of %d weights", n))
		return d.Err()
	}
	r.Weights = make([]WantedWeight, 0, n)
	for range n {
		w := WantedWeight{Name: d.String(), Format: d.String()}
		size := d.Uvarint()
		if size > math.MaxInt64/2 {
			d.Fail(orpc.ErrOverflow)
		}
		w.Size = int64(size)
		if d.Err() != nil {
			return d.Err()
		}
		r.Weights = append(r.Weights, w)
	}
	r.Stream, r.Streams, r.ChunkBytes = uvint(d), uvint(d), uvint(d)
	switch {
	case d.Err() != nil:
	case r.Streams < 1 || r.Streams > MaxWeightStreams || r.Stream >= r.Streams:
		d.Fail(fmt.Errorf("cluster: stream %d of %d (at most %d streams)", r.Stream, r.Streams, MaxWeightStreams))
	case r.ChunkBytes < 1 || r.ChunkBytes > MaxWeightChunk:
		d.Fail(fmt.Errorf("cluster: chunks of %d bytes (at most %d)", r.ChunkBytes, MaxWeightChunk))
	}
	return d.Err()
}

// Chunk is a piece of a pull: bytes [Off, Off+N) of the weight Weight (its index in the
// request).
type Chunk struct {
	Weight int
	Off, N int64
}

// StreamChunks yields the chunks r's stream carries, in the order the worker sends them.
func (r *WeightsRequest) StreamChunks() iter.Seq[Chunk] {
	return func(yield func(Chunk) bool) {
		c := 0
		for i, w := range r.Weights {
			for off := int64(0); off < w.Size; off += int64(r.ChunkBytes) {
				if c%r.Streams == r.Stream && !yield(Chunk{Weight: i, Off: off, N: min(int64(r.ChunkBytes), w.Size-off)}) {
					return
				}
				c++
			}
		}
	}
}

// WeightChunk is a chunk's bytes: Data lies at Offset of the weight Weight (its index in
// the request), and a stream's chunks come in StreamChunks' order; CRC is the CRC-32C of the weight's whole
// prepared form, which the puller checks once all its chunks have landed.
type WeightChunk struct {
	Weight int
	Offset int64
	CRC    uint32
	Data   []byte // aliases the message it was decoded from
}

// MarshalORPC implements orpc.Marshaler.
func (c *WeightChunk) MarshalORPC(e *orpc.Encoder) {
	e.Uvarint(uint64(c.Weight))
	e.Uvarint(uint64(c.Offset))
	e.Uint32(c.CRC)
	e.BytesField(c.Data)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (c *WeightChunk) UnmarshalORPC(d *orpc.Decoder) error {
	c.Weight = uvint(d)
	off := d.Uvarint()
	if off > math.MaxInt64/2 {
		d.Fail(orpc.ErrOverflow)
	}
	c.Offset = int64(off)
	c.CRC = d.Uint32()
	c.Data = d.BytesField()
	return d.Err()
}

// cloneBytes copies b, nil when empty.
func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return slices.Clone(b)
}

// WeightCRC is the CRC-32C (Castagnoli) of a prepared form, as WeightChunk carries it.
func WeightCRC(data []byte) uint32 { return BlockCRC(data) }
