package kvcache

import "strconv"

// Tier is the storage tier a block lives in.
type Tier uint8

// Storage tiers, fastest first. The values are part of the KV event wire format
// (docs/kv-events.md).
const (
	TierDevice Tier = iota // accelerator memory (or the CPU engine's KV store)
	TierHost               // host memory
	TierDisk               // local disk
	TierRemote             // another machine
)

var tierNames = [...]string{"device", "host", "disk", "remote"}

// numTiers is the number of tiers a pool may have.
const numTiers = len(tierNames)

func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return "tier(" + strconv.Itoa(int(t)) + ")"
}

// EventKind says what an [Event] reports.
type EventKind uint8

// Event kinds. The values are part of the KV event wire format.
const (
	EventStored  EventKind = 1 // blocks entered the cache
	EventRemoved EventKind = 2 // blocks left the cache
	EventCleared EventKind = 3 // the whole cache was dropped
)

func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// An Event reports a change of a pool's prefix cache. Events of a pool have
// strictly increasing IDs starting at 1, one per event, whether or not anybody
// subscribed; a subscriber that sees an ID other than the previous one plus 1
// missed events and should resynchronise from [Pool.Snapshot].
type Event struct {
	ID   uint64
	Kind EventKind
	Tier Tier
	// Parent is, for EventStored, the sequence hash of the first stored block's
	// parent (0 for a sequence's first block). Each later block's parent is the
	// block before it in Hashes. The parent need not be cached.
	Parent uint64
	// Hashes are the sequence hashes stored or removed, for EventStored in
	// sequence order. The slice is shared by all subscribers: do not modify it.
	Hashes []uint64
}

// A CachedBlock is one entry of a [Snapshot].
type CachedBlock struct {
	Hash   uint64 // sequence hash
	Parent uint64 // parent's sequence hash, 0 for a sequence's first block
}

// A Snapshot is the content of a pool's prefix cache after event LastID: the device
// tier's blocks, and those of each lower tier (docs/kv-tiers.md).
type Snapshot struct {
	LastID uint64
	Tier   Tier
	Blocks []CachedBlock // in no particular order
	Lower  []TierSnapshot
}

// A TierSnapshot is the blocks one lower tier holds, ready (announced).
type TierSnapshot struct {
	Tier   Tier
	Blocks []CachedBlock // in no particular order
}

// Snapshot returns every hash in the prefix cache, referenced or not, with its
// parent, those of the lower tiers, and the ID of the last event emitted. Applying
// the events with IDs greater than LastID to the snapshot tracks the cache from then on.
func (p *Pool) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{LastID: p.lastID, Tier: p.tier, Blocks: make([]CachedBlock, 0, len(p.index))}
	for h, id := range p.index {
		s.Blocks = append(s.Blocks, CachedBlock{Hash: h, Parent: p.blocks[id].parent})
	}
	for _, t := range p.lower {
		ts := TierSnapshot{Tier: t.cfg.Tier, Blocks: make([]CachedBlock, 0, t.ready)}
		for i := range t.ents {
			if e := &t.ents[i]; e.state == entReady {
				ts.Blocks = append(ts.Blocks, CachedBlock{Hash: e.hash, Parent: e.parent})
			}
		}
		s.Lower = append(s.Lower, ts)
	}
	return s
}

type subscriber struct {
	ch chan Event
}

// Subscribe returns a channel delivering the pool's events from now on, and a
// function that ends the subscription and closes the channel. The pool never
// waits for a subscriber: when the channel's buffer of buf events is full, the
// event is dropped for that subscriber (and counted in [Stats.Dropped]), which
// the subscriber notices as a gap in event IDs when the next event arrives.
// A negative buf is treated as 0 (every event not already awaited is dropped).
func (p *Pool) Subscribe(buf int) (<-chan Event, func()) {
	if buf < 0 {
		buf = 0
	}
	s := &subscriber{ch: make(chan Event, buf)}
	p.mu.Lock()
	p.subs = append(p.subs, s)
	p.mu.Unlock()
	cancel := func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for i, t := range p.subs {
			if t == s {
				p.subs = append(p.subs[:i], p.subs[i+1:]...)
				close(s.ch)
				return
			}
		}
	}
	return s.ch, cancel
}

// emit assigns the next event ID and delivers an event of the device tier with the hashes
// in p.pending, which it empties. It is called with p.mu held.
func (p *Pool) emit(kind EventKind, parent uint64) {
	p.emitHashes(kind, p.tier, parent, p.pending)
	p.pending = p.pending[:0]
}

// emitHashes assigns the next event ID and delivers an event of tier with (a copy of)
// hashes. It is called with p.mu held.
func (p *Pool) emitHashes(kind EventKind, tier Tier, parent uint64, hashes []uint64) {
	p.lastID++
	if len(p.subs) > 0 {
		ev := Event{ID: p.lastID, Kind: kind, Tier: tier, Parent: parent}
		if len(hashes) > 0 {
			ev.Hashes = append([]uint64(nil), hashes...)
		}
		for _, s := range p.subs {
			select {
			case s.ch <- ev:
			default:
				p.dropped++
			}
		}
	}
}
