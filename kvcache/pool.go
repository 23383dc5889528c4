package kvcache

import (
	"errors"
	"math"
	"sync"
)

// ErrNoBlocks is returned when a reservation needs more blocks than are free or
// evictable.
var ErrNoBlocks = errors.New("kvcache: not enough free KV blocks")

// none marks an absent block id in links.
const none int32 = -1

// Which evictable list a block is on.
const (
	onNone uint8 = iota
	onLeaves
	onInner
)

// block is the bookkeeping of one physical block.
type block struct {
	ref    int32  // sequences holding the block
	cached bool   // the canonical holder of hash in Pool.index
	list   uint8  // evictable list the block is on (cached, ref 0)
	hash   uint64 // sequence hash, when cached
	parent uint64 // parent's sequence hash, when cached (0: first block)

	// Tree links among cached blocks, for leaf-first eviction. up is the cached
	// parent block linked at commit time, valid while blocks[up].gen == upGen;
	// children counts the cached blocks linked to this one in its current gen.
	up       int32
	upGen    uint32
	gen      uint32 // incremented whenever the block leaves the cache
	children int32

	prev, next int32  // evictable list links
	lastUse    uint64 // pool tick of the last release
	uses       uint32 // commit and prefix-cache hits since it was cached (lower tiers' frequency filter)
}

// list is an intrusive doubly linked list of blocks, oldest first.
type list struct {
	head, tail int32
	n          int
}

// A Pool hands out the ids of a KV store's blocks and keeps the prefix cache over
// them. Every block is in exactly one state: free (holds nothing), used (referenced
// by at least one [Seq]) or cached (unreferenced, holding a committed block that a
// later [Seq.Match] may reuse until it is evicted).
//
// A Pool is safe for concurrent use by multiple goroutines.
type Pool struct {
	mu        sync.Mutex
	blockSize int
	tier      Tier
	blocks    []block
	free      []int32          // stack of free block ids
	index     map[uint64]int32 // sequence hash → canonical block
	leaves    list             // evictable blocks without cached children
	inner     list             // evictable blocks with cached children
	used      int
	tick      uint64

	// events
	lastID  uint64
	subs    []*subscriber
	pending []uint64 // hashes of the event being built

	// statistics
	queries, hits, evictions, dropped uint64

	// lower tiers (tier.go)
	lower   []*lowerTier
	byTier  [numTiers]*lowerTier
	opts    Options
	saves   []saveJob     // chosen under the lock, run by the caller that chose them
	xfers   []Transfer    // queued for the caller (TakeTransfers)
	xferN   int           // transfers queued or running
	work    chan struct{} // a transfer was queued
	loaded  uint64        // tokens onboarded from lower tiers
	held    int           // distinct hashes in any tier, announced (what a router's index holds)
	scratch []uint64      // emitStored's
}

// NewPool returns a pool of numBlocks blocks of blockSize token positions, all
// free, on the device tier. It panics unless 0 < numBlocks ≤ math.MaxInt32 and
// blockSize > 0.
func NewPool(numBlocks, blockSize int) *Pool {
	if numBlocks <= 0 || numBlocks > math.MaxInt32 || blockSize <= 0 {
		panic("kvcache: invalid pool size")
	}
	p := &Pool{
		blockSize: blockSize,
		tier:      TierDevice,
		blocks:    make([]block, numBlocks),
		free:      make([]int32, numBlocks),
		index:     make(map[uint64]int32),
		leaves:    list{head: none, tail: none},
		inner:     list{head: none, tail: none},
	}
	for i := range p.blocks {
		p.blocks[i].up = none
		p.blocks[i].prev, p.blocks[i].next = none, none
		p.free[i] = int32(numBlocks - 1 - i) // hand out 0, 1, 2, … first
	}
	return p
}

// BlockSize returns the number of token positions per block.
func (p *Pool) BlockSize() int { return p.blockSize }

// NumBlocks returns the number of blocks in the pool.
func (p *Pool) NumBlocks() int { return len(p.blocks) }

// Stats is a snapshot of a pool's occupancy and counters. Used+Cached+Free == Blocks.
type Stats struct {
	Blocks      int    // blocks in the pool
	Used        int    // blocks referenced by at least one sequence
	Cached      int    // unreferenced blocks kept for prefix reuse (evictable)
	Free        int    // blocks holding nothing
	Queries     uint64 // prompt tokens looked up by Match
	Hits        uint64 // of those, tokens found in the cache
	Evictions   uint64 // cached blocks evicted to make room
	Dropped     uint64 // events not delivered to slow subscribers
	LastEventID uint64 // id of the last event emitted, 0 if none
	Indexed     int    // blocks in the prefix cache (used or cached): what a router's index of the pool holds
	// Onboarded is the prompt tokens loaded from lower tiers into the device (Seq.OnboardDone),
	// hits that Hits does not count; LowerIndexed the blocks the lower tiers hold (ready).
	Onboarded    uint64
	LowerIndexed int
	// Held is the distinct blocks the pool holds in any tier, announced: what a router's
	// index holds for it (Indexed without lower tiers).
	Held int
}

// Usage returns the fraction of blocks in use: Used/Blocks. Cached blocks count
// as available, since they are given up on demand.
func (s Stats) Usage() float64 { return float64(s.Used) / float64(s.Blocks) }

// Stats returns the pool's current occupancy and counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		Blocks:       len(p.blocks),
		Used:         p.used,
		Cached:       p.leaves.n + p.inner.n,
		Free:         len(p.free),
		Queries:      p.queries,
		Hits:         p.hits,
		Evictions:    p.evictions,
		Dropped:      p.dropped,
		LastEventID:  p.lastID,
		Indexed:      len(p.index),
		Onboarded:    p.loaded,
		LowerIndexed: p.lowerReady(),
		Held:         p.held,
	}
}

// lowerReady is the blocks the lower tiers hold, ready. Called with p.mu held.
func (p *Pool) lowerReady() int {
	n := 0
	for _, t := range p.lower {
		n += t.ready
	}
	return n
}

// Usage returns the fraction of blocks in use, as [Stats.Usage].
func (p *Pool) Usage() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(p.used) / float64(len(p.blocks))
}

// Clear drops every entry of the prefix cache and emits an [EventCleared] event.
// Unreferenced cached blocks become free; referenced ones stay with their
// sequences as private blocks and are freed when released.
func (p *Pool) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.blocks {
		b := &p.blocks[i]
		if !b.cached {
			continue
		}
		b.cached = false
		b.gen++
		b.children = 0
		b.up = none
		if !p.heldElsewhere(b.hash, p.tier) {
			p.held--
		}
		if b.ref == 0 {
			b.list = onNone
			b.prev, b.next = none, none
			p.free = append(p.free, int32(i))
		}
	}
	clear(p.index)
	p.leaves = list{head: none, tail: none}
	p.inner = list{head: none, tail: none}
	p.emit(EventCleared, 0)
}

// The methods below are called with p.mu held.

// heldElsewhere reports whether a tier other than except holds hash (the device in its
// prefix cache, a lower tier ready).
func (p *Pool) heldElsewhere(h uint64, except Tier) bool {
	if except != p.tier {
		if _, ok := p.index[h]; ok {
			return true
		}
	}
	for _, t := range p.lower {
		if t.cfg.Tier != except {
			if _, ok := t.lookup(h); ok {
				return true
			}
		}
	}
	return false
}

// available returns the number of blocks a reservation may take.
func (p *Pool) available() int { return len(p.free) + p.leaves.n + p.inner.n }

// take returns a block for a new use, with ref 1: a free block if there is one,
// else the cached block chosen by evict. The caller has checked available.
// Evicted hashes are appended to p.pending.
func (p *Pool) take() int32 {
	var id int32
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		id = p.evict()
	}
	p.blocks[id].ref = 1
	p.blocks[id].uses = 0
	p.used++
	return id
}

// evict removes the least recently used leaf of the cache (a block no other
// cached block was committed under), or, when every evictable block has cached
// children, the least recently used evictable block; and returns its id.
func (p *Pool) evict() int32 {
	l := &p.leaves
	if l.n == 0 {
		l = &p.inner
	}
	id := l.head
	p.unlink(l, id)
	p.pending = append(p.pending, p.blocks[id].hash)
	p.offloadEvicted(id)
	p.uncache(id)
	p.evictions++
	return id
}

// uncache removes block id from the cache index and the cache tree.
func (p *Pool) uncache(id int32) {
	b := &p.blocks[id]
	delete(p.index, b.hash)
	if !p.heldElsewhere(b.hash, p.tier) {
		p.held--
	}
	b.cached = false
	b.gen++
	b.children = 0
	if up := b.up; up != none {
		b.up = none
		pb := &p.blocks[up]
		if pb.gen == b.upGen {
			pb.children--
			if pb.children == 0 && pb.list == onInner {
				p.unlink(&p.inner, up)
				p.insert(&p.leaves, onLeaves, up)
			}
		}
	}
}

// commit makes block id the canonical holder of hash, a block whose parent has
// sequence hash parent and, if cached, is held in block up (none if unknown). It
// reports false, leaving the block private, if hash is already cached.
func (p *Pool) commit(id int32, hash, parent uint64, up int32) bool {
	if _, dup := p.index[hash]; dup {
		return false
	}
	if !p.heldElsewhere(hash, p.tier) {
		p.held++
	}
	p.index[hash] = id
	b := &p.blocks[id]
	b.cached = true
	b.hash = hash
	b.parent = parent
	if b.uses == 0 { // an onboarded block carries the uses its lower tier counted
		b.uses = 1
	}
	if up == none || !p.blocks[up].cached || p.blocks[up].hash != parent {
		up = none
		if parent != 0 {
			if c, ok := p.index[parent]; ok {
				up = c
			}
		}
	}
	if up != none {
		pb := &p.blocks[up]
		b.up, b.upGen = up, pb.gen
		pb.children++
		if pb.children == 1 && pb.list == onLeaves {
			p.unlink(&p.leaves, up)
			p.insert(&p.inner, onInner, up)
		}
	}
	return true
}

// acquire adds a reference to cached block id.
func (p *Pool) acquire(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		switch b.list {
		case onLeaves:
			p.unlink(&p.leaves, id)
		case onInner:
			p.unlink(&p.inner, id)
		}
		p.used++
	}
	b.ref++
}

// release drops a reference to block id; an unreferenced block becomes
// evictable if cached, else free.
func (p *Pool) release(id int32) {
	b := &p.blocks[id]
	b.ref--
	if b.ref > 0 {
		return
	}
	if b.ref < 0 {
		panic("kvcache: block released more often than acquired")
	}
	p.used--
	if !b.cached {
		p.free = append(p.free, id)
		return
	}
	b.lastUse = p.tick
	if b.children > 0 {
		p.insert(&p.inner, onInner, id)
	} else {
		p.insert(&p.leaves, onLeaves, id)
	}
}

// insert puts block id into l, ordered by lastUse (after blocks of equal age).
// Releases append in O(1); an older block (a parent that became a leaf) is
// placed by a walk from the head, which usually stops at once.
func (p *Pool) insert(l *list, which uint8, id int32) {
	b := &p.blocks[id]
	b.list = which
	l.n++
	if l.tail == none || p.blocks[l.tail].lastUse <= b.lastUse {
		b.prev, b.next = l.tail, none
		if l.tail == none {
			l.head = id
		} else {
			p.blocks[l.tail].next = id
		}
		l.tail = id
		return
	}
	at := l.head
	for p.blocks[at].lastUse <= b.lastUse {
		at = p.blocks[at].next
	}
	// insert before at
	b.next, b.prev = at, p.blocks[at].prev
	if b.prev == none {
		l.head = id
	} else {
		p.blocks[b.prev].next = id
	}
	p.blocks[at].prev = id
}

// unlink removes block id from l.
func (p *Pool) unlink(l *list, id int32) {
	b := &p.blocks[id]
	if b.prev == none {
		l.head = b.next
	} else {
		p.blocks[b.prev].next = b.next
	}
	if b.next == none {
		l.tail = b.prev
	} else {
		p.blocks[b.next].prev = b.prev
	}
	b.prev, b.next = none, none
	b.list = onNone
	l.n--
}
