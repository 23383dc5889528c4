package router

import (
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"tandem/kvcache"
)

// WorkerID names a worker inside the router. The registry assigns it when the
// worker registers; the core only compares and orders ids.
type WorkerID uint32

// Tier bits of the index. A block's tier mask has bit t set when the worker
// holds it in tier t; tiers ≥ maxTiers are not tracked.
const (
	maxTiers  = 8
	numLevels = 4 // device, host, disk, remote: the tiers lookups count (docs/kv-tiers.md)
	devBit    = uint8(1) << kvcache.TierDevice
	hostBit   = uint8(1) << kvcache.TierHost
	usedBits  = uint8(1)<<numLevels - 1 // tiers that count as cached for routing
)

// The index's layout. Hashes are spread over shards, each an open-addressing table of
// sequence hash → holders with its own lock. Workers are numbered by dense slots: a
// holder is a slot and a tier mask in 32 bits, a block held by one worker (the common
// case) is one 12-byte table entry, one held by a few a sorted list of such holders,
// one held by many two bitmaps over the slots. A worker's slot is retired, not
// cleaned, when it is reset from a snapshot or removed: lookups ignore retired slots,
// and Sweep purges their entries later, a shard chunk at a time, before the slot is
// used again.
const (
	shardBits  = 5
	numShards  = 1 << shardBits
	slotBits   = 23 // a holder: slot << 8 | tier mask
	maxSlots   = 1 << slotBits
	multiBit   = uint32(1) << 31 // a value naming a holder set rather than one holder
	listMax    = 48              // holders of a set kept as a sorted list; more become bitmaps
	sweepChunk = 4096            // table entries swept under one shard lock
	applyChunk = 128             // blocks changed under one shard lock: a lookup waits for no more
)

// holder packs a slot and a tier mask.
func holder(slot uint32, mask uint8) uint32 { return slot<<8 | uint32(mask) }

func holderSlot(v uint32) uint32 { return v >> 8 }

func holderMask(v uint32) uint8 { return uint8(v) }

// A holderSet is the holders of a block held by more than one worker: a list sorted by
// slot while small, else bitmaps of the slots holding it in each tier that counts for
// routing (device, host, disk, remote; other tiers' bits are not kept in bitmaps).
type holderSet struct {
	list []uint32
	bits *setBits
	fp   uint64 // XOR of holderFP over the holders: equal sets, equal fingerprints
}

// holderFP is a holder's share of a set's fingerprint: its slot and its bits of the tiers
// a lookup reads, 0 for a holder in none.
func holderFP(h uint32) uint64 {
	if h&uint32(usedBits) == 0 {
		return 0
	}
	x := uint64(h&^0xff|h&uint32(usedBits)) + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// fpOf is the fingerprint of the holders v of a block of sh.
func fpOf(sh *shard, v uint32) uint64 {
	if v&multiBit == 0 {
		return holderFP(v)
	}
	return sh.sets[v&^multiBit].fp
}

type setBits struct {
	tier  [numLevels][]uint64 // by tier: the slots holding the block there
	n     int                 // slots with a bit in any
	upper int                 // slots with a bit in a tier above the device
}

// workerRec is what the index knows of one worker. mu serialises the worker's events,
// resets and removal; slot is written with the index's wmu held for writing.
type workerRec struct {
	mu      sync.Mutex
	id      WorkerID
	slot    uint32
	last    atomic.Uint64 // id of the last event applied (or of the snapshot)
	blocks  atomic.Int64  // blocks held, in any tier
	tiers   uint8         // tiers it has stored blocks in since its slot was assigned
	removed bool
	scratch []uint64 // updateAll's: the hashes grouped by shard
	homes   []uint32 // updateAll's: their home positions in their shards' tables
}

// An entry is a hash and its value, 12 bytes, so that a probe reads one cache line (the
// hash split in halves keeps the entry 4-byte aligned, with no padding).
type entry struct{ lo, hi, v uint32 }

func (e *entry) key() uint64 { return uint64(e.lo) | uint64(e.hi)<<32 }

type shard struct {
	mu   sync.RWMutex
	tab  []entry // the table; a zero key is empty (hash 0 lives in zero)
	n    int
	zero uint32 // the value of hash 0; 0: none
	sets []holderSet
	free []uint32 // unused set indices

	cursor int           // Sweep's position in tab
	passes atomic.Uint64 // Sweep's completed passes over tab
	sink   uint32        // applyChunkLocked's loads go here, so that they are not dropped

	_ [64]byte // keep shards' locks on separate cache lines
}

// retiredSlot is a slot whose entries Sweep must purge before it is used again: free
// once every shard has completed a pass that started after the retirement.
type retiredSlot struct {
	slot uint32
	need [numShards]uint64
}

// An Index is the router's global view of the workers' prefix caches: for every
// block sequence hash, the workers that hold it and in which tiers. It follows
// each worker's KV event stream (docs/kv-events.md) and answers, for a prompt's
// block hashes, how many leading blocks each worker holds.
//
// An Index is safe for concurrent use. A lookup holds every shard's read lock for its
// walk when no writer holds or wants one, else it takes one shard's read lock at a time,
// around its reads of one block's holders, and sees the events applied while it walks in
// the blocks it reads after them (see walk); events, resets and sweeps take one shard's
// write lock at a time, briefly (a reset adds its snapshot a chunk at a time), so lookups
// do not wait for a whole batch or snapshot, and events of different workers apply in
// parallel. One worker's events, resets and removal are serialised.
type Index struct {
	shards [numShards]shard

	wmu     sync.RWMutex // guards workers, owner, live, retired, freeSlots; taken before any shard lock
	workers map[WorkerID]*workerRec
	owner   []WorkerID // slot → worker
	live    []uint64   // bitmap of the slots in use
	retired []retiredSlot
	free    []uint32 // slots free for reuse
	// slotEpoch counts changes of the workers' slots (assignments and retirements), so that
	// a State that caches its workers' slots (State.syncSlots) knows when to read them again.
	slotEpoch uint64

	// spins is how often the hot paths try a shard's lock before parking on it
	// (lockSpins), 0 with one P: there the holder cannot run while the waiter spins.
	spins int

	dead      atomic.Int64 // retired slots not freed yet: Sweep has work
	sweepNext atomic.Uint32
	walks     sync.Pool // *Walk, for OverlapInto
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	x := &Index{workers: make(map[WorkerID]*workerRec)}
	if runtime.GOMAXPROCS(0) > 1 {
		x.spins = lockSpins
	}
	for i := range x.shards {
		x.shards[i].init(16)
	}
	return x
}

func (sh *shard) init(capacity int) {
	sh.tab = make([]entry, capacity)
	sh.n = 0
}

// mix spreads a hash over shards (top bits) and table positions (middle bits); sequence
// hashes are random already, but tests and callers may use small numbers.
func mix(h uint64) uint64 { return h * 0x9e3779b97f4a7c15 }

// rlookup returns h's shard, read-locked for wk's walk (the caller unlocks it with
// wk.runlock), and h's value there (0: none), mixing h once for both.
func (x *Index) rlookup(wk *Walk, h uint64) (*shard, uint32) {
	m := mix(h)
	sh := &x.shards[m>>(64-shardBits)]
	if !wk.lockedAll {
		sh.rlock(x.spins)
	}
	if h == 0 {
		return sh, sh.zero
	}
	tab := sh.tab
	mask := len(tab) - 1
	for i := int(m>>24) & mask; ; i = (i + 1) & mask {
		switch k := tab[i].key(); k {
		case h:
			return sh, tab[i].v
		case 0:
			return sh, 0
		}
	}
}

// lockSpins bounds how often the hot paths (a lookup's probe, an event's chunk) try a
// shard's lock before they park on it: 4 µs of trying or more (a failed try is a load
// of the lock's word, longer while another core writes it). The holder lets go soon (a
// chunk of applyChunk blocks takes about 10 µs, a probe a fraction of one), while
// parking costs a futex wake-up from the holder and the waiter's thread a start; on a
// 2-core machine a core stays idle meanwhile. After the tries, Lock and RLock queue as
// sync.RWMutex does (a waiting writer holds new readers back), so that nobody starves.
const lockSpins = 400

// rlock takes sh's read lock, trying it up to spins times before parking.
func (sh *shard) rlock(spins int) {
	for range spins {
		if sh.mu.TryRLock() {
			return
		}
		spinPause()
	}
	sh.mu.RLock()
}

// lock takes sh's write lock, trying it up to spins times before parking.
func (sh *shard) lock(spins int) {
	for range spins {
		if sh.mu.TryLock() {
			return
		}
		spinPause()
	}
	sh.mu.Lock()
}

// spinPause waits some tens of nanoseconds between tries without touching shared memory.
//
//go:noinline
func spinPause() {
	for range 30 {
	}
}

// reserve grows sh's table, doubling it, until it holds n entries within its load limit.
func (sh *shard) reserve(n int) {
	c := len(sh.tab)
	for n*5 > c*4 {
		c *= 2
	}
	if c > len(sh.tab) {
		sh.grow(c)
	}
}

func (sh *shard) grow(capacity int) {
	old := sh.tab
	sh.tab = make([]entry, capacity)
	m := capacity - 1
	for _, e := range old {
		k := e.key()
		if k == 0 {
			continue
		}
		i := int(mix(k)>>24) & m
		for sh.tab[i].key() != 0 {
			i = (i + 1) & m
		}
		sh.tab[i] = e
	}
	sh.cursor = 0
}

// del empties position i, shifting later entries of its probe run back (no tombstones).
func (sh *shard) del(i int) {
	m := len(sh.tab) - 1
	sh.n--
	for {
		sh.tab[i] = entry{}
		j := i
		for {
			j = (j + 1) & m
			k := sh.tab[j].key()
			if k == 0 {
				return
			}
			home := int(mix(k)>>24) & m
			// k may move to i if its home is not in (i, j] (cyclically).
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				sh.tab[i] = sh.tab[j]
				i = j
				break
			}
		}
	}
}

// newSet stores s and returns its value.
func (sh *shard) newSet(s holderSet) uint32 {
	if n := len(sh.free); n > 0 {
		i := sh.free[n-1]
		sh.free = sh.free[:n-1]
		sh.sets[i] = s
		return multiBit | i
	}
	sh.sets = append(sh.sets, s)
	return multiBit | uint32(len(sh.sets)-1)
}

func (sh *shard) freeSet(v uint32) {
	i := v &^ multiBit
	sh.sets[i] = holderSet{}
	sh.free = append(sh.free, i)
}

// Blocks' transitions for a worker: entered (held in no tier before) or left (in none
// after).
const (
	noChange = iota
	entered
	left
)

// change sets slot's mask of the block whose value is v to mask(old) with set added and
// clear removed, and returns the new value (0: nobody holds it) and the transition.
// Retired slots met on the way are dropped. Called with the shard's write lock and the
// index's wmu held (for reading at least).
func (x *Index) change(sh *shard, v uint32, slot uint32, set, clear uint8) (uint32, int) {
	switch {
	case v == 0:
		if set == 0 {
			return 0, noChange
		}
		return holder(slot, set), entered
	case v&multiBit == 0:
		s, m := holderSlot(v), holderMask(v)
		if s == slot {
			nm := (m | set) &^ clear
			switch {
			case nm == 0:
				return 0, left
			case m == 0:
				return holder(slot, nm), entered
			}
			return holder(slot, nm), noChange
		}
		if set == 0 {
			return v, noChange
		}
		if !x.isLive(s) {
			return holder(slot, set), entered
		}
		a, b := v, holder(slot, set)
		if slot < s {
			a, b = b, a
		}
		return sh.newSet(holderSet{list: []uint32{a, b}, fp: holderFP(a) ^ holderFP(b)}), entered
	}
	hs := &sh.sets[v&^multiBit]
	var tr int
	if hs.bits != nil {
		tr = x.changeBits(hs, slot, set, clear)
	} else {
		tr = x.changeList(hs, slot, set, clear)
	}
	// Shrink: one holder left becomes a plain value, none frees the set.
	if hs.bits == nil && len(hs.list) <= 1 {
		nv := uint32(0)
		if len(hs.list) == 1 {
			nv = hs.list[0]
		}
		sh.freeSet(v)
		return nv, tr
	}
	if hs.bits != nil && hs.bits.n == 0 {
		sh.freeSet(v)
		return 0, tr
	}
	return v, tr
}

func (x *Index) changeList(hs *holderSet, slot uint32, set, clear uint8) int {
	// Drop retired holders while the list is being rewritten anyway.
	if x.dead.Load() > 0 {
		hs.list = slices.DeleteFunc(hs.list, func(h uint32) bool {
			if holderSlot(h) != slot && !x.isLive(holderSlot(h)) {
				hs.fp ^= holderFP(h)
				return true
			}
			return false
		})
	}
	i, found := slices.BinarySearchFunc(hs.list, slot, func(h uint32, s uint32) int {
		switch hs := holderSlot(h); {
		case hs < s:
			return -1
		case hs > s:
			return 1
		}
		return 0
	})
	var m uint8
	if found {
		m = holderMask(hs.list[i])
	}
	nm := (m | set) &^ clear
	switch {
	case found && nm == 0:
		hs.fp ^= holderFP(hs.list[i])
		hs.list = slices.Delete(hs.list, i, i+1)
		return left
	case found:
		hs.fp ^= holderFP(hs.list[i]) ^ holderFP(holder(slot, nm))
		hs.list[i] = holder(slot, nm)
		return noChange
	case nm == 0:
		return noChange
	}
	hs.fp ^= holderFP(holder(slot, nm))
	hs.list = slices.Insert(hs.list, i, holder(slot, nm))
	if len(hs.list) > listMax {
		b := &setBits{}
		for _, h := range hs.list {
			b.put(holderSlot(h), holderMask(h))
		}
		hs.list, hs.bits = nil, b
	}
	return entered
}

// put records slot with mask m (only the bits of the tiers that count are kept) in b.
func (b *setBits) put(slot uint32, m uint8) {
	w := int(slot / 64)
	for len(b.tier[0]) <= w {
		for t := range b.tier {
			b.tier[t] = append(b.tier[t], 0)
		}
	}
	bit := uint64(1) << (slot % 64)
	had, hadUp := false, false
	for t := range b.tier {
		if b.tier[t][w]&bit != 0 {
			had, hadUp = true, hadUp || t > 0
		}
		b.tier[t][w] &^= bit
		if m&(1<<t) != 0 {
			b.tier[t][w] |= bit
		}
	}
	switch now := m&usedBits != 0; {
	case now && !had:
		b.n++
	case had && !now:
		b.n--
	}
	switch up := m&usedBits&^devBit != 0; {
	case up && !hadUp:
		b.upper++
	case hadUp && !up:
		b.upper--
	}
}

func (b *setBits) mask(slot uint32) uint8 {
	w := int(slot / 64)
	if w >= len(b.tier[0]) {
		return 0
	}
	bit := uint64(1) << (slot % 64)
	var m uint8
	for t := range b.tier {
		if b.tier[t][w]&bit != 0 {
			m |= 1 << t
		}
	}
	return m
}

// any is word w of the slots holding the block in some tier.
func (b *setBits) any(w int) uint64 {
	var u uint64
	for t := range b.tier {
		u |= b.tier[t][w]
	}
	return u
}

// changeBits is changeList for a bitmap set. A bitmap keeps only the bits of the tiers
// that count for routing, so a block held in a bitmap set in another tier is not counted
// for the worker.
func (x *Index) changeBits(hs *holderSet, slot uint32, set, clear uint8) int {
	b := hs.bits
	if x.dead.Load() > 0 {
		x.purgeBits(hs)
	}
	m := b.mask(slot)
	nm := (m | set) &^ clear
	b.put(slot, nm)
	hs.fp ^= holderFP(holder(slot, m)) ^ holderFP(holder(slot, nm&usedBits))
	switch {
	case m == 0 && nm&usedBits != 0:
		return entered
	case m != 0 && nm&usedBits == 0:
		return left
	}
	return noChange
}

// purgeBits drops retired slots from a bitmap set: one AND per word.
func (x *Index) purgeBits(hs *holderSet) {
	b := hs.bits
	for w := range b.tier[0] {
		lv := uint64(0)
		if w < len(x.live) {
			lv = x.live[w]
		}
		for gone := b.any(w) &^ lv; gone != 0; gone &= gone - 1 {
			slot := uint32(w*64 + bits.TrailingZeros64(gone))
			m := b.mask(slot)
			hs.fp ^= holderFP(holder(slot, m))
			b.n--
			if m&^devBit != 0 {
				b.upper--
			}
		}
		for t := range b.tier {
			b.tier[t][w] &= lv
		}
	}
}

// isLive reports whether slot is in use. Called with wmu held.
func (x *Index) isLive(slot uint32) bool {
	w := int(slot / 64)
	return w < len(x.live) && x.live[w]&(1<<(slot%64)) != 0
}

// clearAt clears bit for slot in the holders of sh's entry i (-1: hash 0's, sh.zero) and
// returns the change in the slot's blocks (-1 or 0), which the caller adds to rec.blocks
// once per shard. Called with sh's write lock held.
func (x *Index) clearAt(sh *shard, i int, slot uint32, bit uint8) int {
	if i < 0 {
		nv, tr := x.change(sh, sh.zero, slot, 0, bit)
		sh.zero = nv
		return delta(tr)
	}
	nv, tr := x.change(sh, sh.tab[i].v, slot, 0, bit)
	if nv == 0 {
		sh.del(i)
	} else {
		sh.tab[i].v = nv
	}
	return delta(tr)
}

// lockRec returns worker w's record with its mu locked, creating it (with a slot) if
// the index has not seen w.
func (x *Index) lockRec(w WorkerID) *workerRec {
	for {
		x.wmu.RLock()
		rec := x.workers[w]
		x.wmu.RUnlock()
		if rec == nil {
			x.wmu.Lock()
			if rec = x.workers[w]; rec == nil {
				rec = &workerRec{id: w, slot: x.newSlotLocked(w)}
				x.workers[w] = rec
			}
			x.wmu.Unlock()
		}
		rec.mu.Lock()
		if !rec.removed {
			return rec
		}
		rec.mu.Unlock() // removed meanwhile: a new record is made
	}
}

// newSlotLocked gives w a slot. Called with wmu held for writing.
func (x *Index) newSlotLocked(w WorkerID) uint32 {
	var s uint32
	if n := len(x.free); n > 0 {
		s = x.free[n-1]
		x.free = x.free[:n-1]
	} else {
		s = uint32(len(x.owner))
		if s >= maxSlots {
			panic("router: more than 8M worker slots in the KV index")
		}
		x.owner = append(x.owner, 0)
	}
	x.owner[s] = w
	x.slotEpoch++
	for int(s/64) >= len(x.live) {
		x.live = append(x.live, 0)
	}
	x.live[s/64] |= 1 << (s % 64)
	return s
}

// retireLocked takes rec's slot out of use; Sweep purges its entries. Called with wmu
// held for writing and rec.mu.
func (x *Index) retireLocked(rec *workerRec) {
	s := rec.slot
	x.live[s/64] &^= 1 << (s % 64)
	x.slotEpoch++
	r := retiredSlot{slot: s}
	for i := range x.shards {
		r.need[i] = x.shards[i].passes.Load() + 2
	}
	x.retired = append(x.retired, r)
	x.dead.Add(1)
	rec.blocks.Store(0)
	rec.tiers = 0
}

// Apply applies worker w's event ev, following docs/kv-events.md. An event
// whose ID is the last applied ID plus 1 is applied. An ID at or below the last
// is already covered (by a snapshot) and ignored. A higher ID is a gap: Apply
// returns true and applies nothing; the caller fetches a snapshot and passes it
// to Reset, and meanwhile every later event reports the gap again.
//
// A worker the index has not seen starts at ID 0, so its first event must be
// ID 1 or it resynchronises from a snapshot. A worker whose pool restarts
// (IDs from 1 again) must be removed with RemoveWorker or Reset first.
// Events of unknown kinds, and of tiers the index does not track, advance the
// ID and change nothing.
func (x *Index) Apply(w WorkerID, ev kvcache.Event) (gap bool) {
	rec := x.lockRec(w)
	defer rec.mu.Unlock()
	last := rec.last.Load()
	if ev.ID <= last {
		return false
	}
	if ev.ID != last+1 {
		return true
	}
	rec.last.Store(ev.ID)
	if ev.Tier >= maxTiers {
		return false
	}
	bit := uint8(1) << ev.Tier
	switch ev.Kind {
	case kvcache.EventStored:
		rec.tiers |= bit
		x.updateAll(rec, ev.Hashes, bit, 0)
	case kvcache.EventRemoved:
		x.updateAll(rec, ev.Hashes, 0, bit)
	case kvcache.EventCleared:
		x.clearTier(rec, bit)
	}
	return false
}

// clearTier drops every block rec holds in the tier of bit. Called with rec.mu held.
func (x *Index) clearTier(rec *workerRec, bit uint8) {
	if rec.tiers&^bit == 0 { // nothing in other tiers: a fresh slot is the same and O(1)
		x.wmu.Lock()
		x.retireLocked(rec)
		rec.slot = x.newSlotLocked(rec.id)
		x.wmu.Unlock()
		return
	}
	// Blocks in other tiers too: walk the tables for rec's entries.
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	for si := range x.shards {
		sh := &x.shards[si]
		sh.mu.Lock()
		d := 0
		if sh.zero != 0 {
			d += x.clearAt(sh, -1, rec.slot, bit)
		}
		for i := 0; i < len(sh.tab); {
			k := sh.tab[i].key()
			if k == 0 || !x.holds(sh, sh.tab[i].v, rec.slot) {
				i++
				continue
			}
			n := sh.n
			d += x.clearAt(sh, i, rec.slot, bit)
			if sh.n == n || sh.tab[i].key() == k {
				i++ // not deleted (else a later entry may have shifted into i)
			}
		}
		sh.mu.Unlock()
		rec.blocks.Add(int64(d))
	}
	rec.tiers &^= bit
}

// holds reports whether the holders v include slot.
func (x *Index) holds(sh *shard, v uint32, slot uint32) bool {
	if v&multiBit == 0 {
		return v != 0 && holderSlot(v) == slot
	}
	hs := &sh.sets[v&^multiBit]
	if hs.bits != nil {
		return hs.bits.mask(slot) != 0
	}
	for _, h := range hs.list {
		if holderSlot(h) == slot {
			return true
		}
	}
	return false
}

// Reset replaces everything the index holds for worker w by the snapshot
// (its blocks in snap.Tier, and those of its lower tiers) and continues from its LastID: the next
// event applied is LastID+1. The worker's old entries are dropped at once (its slot is
// retired) and the snapshot's blocks are added a chunk at a time, so lookups meanwhile
// see part of it; w's events wait until Reset returns.
func (x *Index) Reset(w WorkerID, snap kvcache.Snapshot) {
	rec := x.lockRec(w)
	defer rec.mu.Unlock()
	x.wmu.Lock()
	x.retireLocked(rec)
	rec.slot = x.newSlotLocked(w)
	x.wmu.Unlock()
	rec.last.Store(snap.LastID)
	x.resetTier(rec, snap.Tier, snap.Blocks)
	for _, t := range snap.Lower {
		x.resetTier(rec, t.Tier, t.Blocks)
	}
}

// resetTier adds a snapshot's blocks of tier t for rec. Called with rec.mu held.
func (x *Index) resetTier(rec *workerRec, t kvcache.Tier, blocks []kvcache.CachedBlock) {
	if t >= maxTiers || len(blocks) == 0 {
		return
	}
	bit := uint8(1) << t
	rec.tiers |= bit
	hs := make([]uint64, len(blocks))
	for i, b := range blocks {
		hs[i] = b.Hash
	}
	x.updateAll(rec, hs, bit, 0)
}

// updateAll applies set/clear for rec's slot to every hash of hs, grouped by shard (a
// counting sort into rec's scratch) so that each shard's write lock is taken once per
// applyChunk hashes rather than once per hash: a lookup waits for at most applyChunk
// blocks. One shard's lock at a time: two goroutines applying events of different
// workers then queue behind each other for one shard's chunk, not for the whole event
// (holding the locks of several shards at once, to overlap the misses of more hashes,
// made the 2-core replay's events slower). Called with rec.mu held.
func (x *Index) updateAll(rec *workerRec, hs []uint64, set, clear uint8) {
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	var start [numShards + 1]int
	for _, h := range hs {
		start[mix(h)>>(64-shardBits)+1]++
	}
	for i := 1; i <= numShards; i++ {
		start[i] += start[i-1]
	}
	if cap(rec.scratch) < len(hs) {
		rec.scratch = make([]uint64, len(hs))
		rec.homes = make([]uint32, len(hs))
	}
	by, homes := rec.scratch[:len(hs)], rec.homes[:len(hs)]
	pos := start
	for _, h := range hs {
		sh := mix(h) >> (64 - shardBits)
		by[pos[sh]] = h
		pos[sh]++
	}
	d := 0
	for si := range numShards {
		sh := &x.shards[si]
		for a := start[si]; a < start[si+1]; a += applyChunk {
			b := min(a+applyChunk, start[si+1])
			sh.lock(x.spins)
			d += x.applyChunkLocked(sh, rec.slot, by[a:b], homes[a:b], set, clear)
			sh.mu.Unlock()
		}
	}
	rec.blocks.Add(int64(d))
	if cap(rec.scratch) > 1<<16 {
		rec.scratch, rec.homes = nil, nil // a snapshot's worth: do not keep it
	}
}

// applyChunkLocked applies set/clear for slot to the hashes hs of shard sh, with sh's
// write lock held, and returns the change in the slot's blocks; homes is scratch beside
// hs. It makes room for every hash first (so that no insertion grows the table), then
// reads the table entries where the hashes' probes start, and the holder sets they name,
// before it updates any (applyRun): the loads do not depend on each other, so their cache
// misses overlap instead of each update waiting for its own.
func (x *Index) applyChunkLocked(sh *shard, slot uint32, hs []uint64, homes []uint32, set, clear uint8) int {
	if set != 0 {
		sh.reserve(sh.n + len(hs))
	}
	tab, sets := sh.tab, sh.sets
	m := uint32(len(tab) - 1)
	homes = homes[:len(hs)]
	var t uint32
	for j, h := range hs {
		i := uint32(mix(h)>>24) & m
		homes[j] = i
		v := tab[i].v
		t += v
		if v&multiBit != 0 && int(v&^multiBit) < len(sets) {
			t += uint32(len(sets[v&^multiBit].list))
		}
	}
	sh.sink += t
	return x.applyRun(sh, slot, hs, homes, set, clear)
}

// applyRun applies set/clear for slot to the hashes hs of shard sh, whose probes start at
// homes, with sh's write lock held (and room for every hash in its table), and returns
// the change in the slot's blocks. The common cases are inline: a block nobody holds
// stored, and the slot's own single-holder entry changed; the others go through change.
func (x *Index) applyRun(sh *shard, slot uint32, hs []uint64, homes []uint32, set, clear uint8) int {
	tab := sh.tab
	m := uint32(len(tab) - 1)
	homes = homes[:len(hs)]
	d := 0
	for j, h := range hs {
		if h == 0 { // hash 0 lives in sh.zero
			nv, tr := x.change(sh, sh.zero, slot, set, clear)
			sh.zero = nv
			d += delta(tr)
			continue
		}
		hl, hh := uint32(h), uint32(h>>32)
		i := homes[j] & m
		for {
			e := &tab[i]
			if e.lo == hl && e.hi == hh || e.lo|e.hi == 0 {
				break
			}
			i = (i + 1) & m
		}
		e := &tab[i]
		if e.lo|e.hi == 0 { // nobody holds h
			if set != 0 {
				e.lo, e.hi, e.v = hl, hh, holder(slot, set)
				sh.n++
				d++
			}
			continue
		}
		v := e.v
		if v&multiBit == 0 && holderSlot(v) == slot { // the slot alone holds h
			om := holderMask(v)
			switch nm := (om | set) &^ clear; {
			case nm == 0:
				sh.del(int(i))
				d--
			case om == 0:
				e.v = holder(slot, nm)
				d++
			default:
				e.v = holder(slot, nm)
			}
			continue
		}
		nv, tr := x.change(sh, v, slot, set, clear)
		if nv == 0 {
			sh.del(int(i))
		} else {
			e.v = nv
		}
		d += delta(tr)
	}
	return d
}

// delta is a transition's change in a worker's blocks.
func delta(tr int) int {
	switch tr {
	case entered:
		return 1
	case left:
		return -1
	}
	return 0
}

// RemoveWorker forgets worker w: its blocks and its last event ID.
func (x *Index) RemoveWorker(w WorkerID) {
	x.wmu.RLock()
	rec := x.workers[w]
	x.wmu.RUnlock()
	if rec == nil {
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.removed {
		return
	}
	x.wmu.Lock()
	x.retireLocked(rec)
	delete(x.workers, w)
	rec.removed = true
	x.wmu.Unlock()
}

// Reserve sizes the tables for n more entries, so that the events that fill them do not
// grow the tables (each growth copies a shard under its lock). The router reserves a
// worker's KV capacity when it registers.
func (x *Index) Reserve(n int) {
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	per := (n + numShards - 1) / numShards
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		sh.reserve(sh.n + per)
		sh.mu.Unlock()
	}
}

// Sweep purges up to budget table entries' worth of retired slots' entries and returns
// the entries it looked at (0 when nothing is left to purge). Call it from time to time
// (the live router does on its heartbeat ticker); Compact sweeps until nothing is left.
func (x *Index) Sweep(budget int) int {
	if x.dead.Load() == 0 {
		return 0
	}
	done := 0
	for done < budget {
		s := int(x.sweepNext.Add(1)-1) % numShards
		n := x.sweepShard(&x.shards[s], min(sweepChunk, budget-done))
		done += n
		if s == numShards-1 {
			x.freeSlots()
			if x.dead.Load() == 0 {
				break
			}
		}
	}
	return done
}

// Compact sweeps until every retired slot is free: Len then counts only the blocks of
// workers in the index.
func (x *Index) Compact() {
	for x.dead.Load() > 0 {
		if x.Sweep(1<<20) == 0 {
			x.freeSlots()
		}
	}
}

func (x *Index) sweepShard(sh *shard, budget int) int {
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.zero != 0 {
		sh.zero = x.purge(sh, sh.zero)
	}
	n := 0
	for n < budget {
		if sh.cursor >= len(sh.tab) {
			sh.cursor = 0
			sh.passes.Add(1)
			break
		}
		i := sh.cursor
		n++
		v := sh.tab[i].v
		if sh.tab[i].key() == 0 {
			sh.cursor++
			continue
		}
		if nv := x.purge(sh, v); nv != 0 {
			sh.tab[i].v = nv
			sh.cursor++
			continue
		}
		sh.del(i) // a later entry may shift into i: look at i again
	}
	return n
}

// purge drops retired slots from the holders v and returns what is left (0: none).
func (x *Index) purge(sh *shard, v uint32) uint32 {
	if v&multiBit == 0 {
		if x.isLive(holderSlot(v)) {
			return v
		}
		return 0
	}
	hs := &sh.sets[v&^multiBit]
	if hs.bits != nil {
		x.purgeBits(hs)
		if hs.bits.n == 0 {
			sh.freeSet(v)
			return 0
		}
		return v
	}
	hs.list = slices.DeleteFunc(hs.list, func(h uint32) bool {
		if !x.isLive(holderSlot(h)) {
			hs.fp ^= holderFP(h)
			return true
		}
		return false
	})
	switch len(hs.list) {
	case 0:
		sh.freeSet(v)
		return 0
	case 1:
		nv := hs.list[0]
		sh.freeSet(v)
		return nv
	}
	return v
}

// freeSlots frees the retired slots every shard has swept since.
func (x *Index) freeSlots() {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.retired = slices.DeleteFunc(x.retired, func(r retiredSlot) bool {
		for i := range x.shards {
			if x.shards[i].passes.Load() < r.need[i] {
				return false
			}
		}
		x.free = append(x.free, r.slot)
		x.dead.Add(-1)
		return true
	})
}

// rec returns worker w's record, made if the index has not seen w: the State keeps it
// to read the worker's block count without a lookup.
func (x *Index) rec(w WorkerID) *workerRec {
	rec := x.lockRec(w)
	rec.mu.Unlock()
	return rec
}

// LastID returns the ID of the last event applied for worker w (or of the
// snapshot it was reset from), and whether the index knows w.
func (x *Index) LastID(w WorkerID) (uint64, bool) {
	x.wmu.RLock()
	rec := x.workers[w]
	x.wmu.RUnlock()
	if rec == nil {
		return 0, false
	}
	return rec.last.Load(), true
}

// Behind reports whether worker w has emitted events beyond those applied:
// its load report's last event ID is greater than the index's.
func (x *Index) Behind(w WorkerID, reportedLastID uint64) bool {
	last, _ := x.LastID(w)
	return reportedLastID > last
}

// Len returns the number of distinct block hashes in the index. Until Sweep has purged
// them, it counts blocks of workers reset or removed since.
func (x *Index) Len() int {
	n := 0
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		n += sh.n
		if sh.zero != 0 {
			n++
		}
		sh.mu.RUnlock()
	}
	return n
}

// Blocks returns the number of blocks worker w holds, in any tier.
func (x *Index) Blocks(w WorkerID) int {
	x.wmu.RLock()
	rec := x.workers[w]
	x.wmu.RUnlock()
	if rec == nil {
		return 0
	}
	return int(rec.blocks.Load())
}

// Entries returns the number of (worker, block) entries: the sum of Blocks.
func (x *Index) Entries() int {
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	n := 0
	for _, rec := range x.workers {
		n += int(rec.blocks.Load())
	}
	return n
}

// Bytes returns the memory the index's tables and holder sets take, in bytes.
func (x *Index) Bytes() int {
	n := int(unsafe.Sizeof(*x))
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		n += cap(sh.tab)*int(unsafe.Sizeof(entry{})) + cap(sh.sets)*int(unsafe.Sizeof(holderSet{})) + cap(sh.free)*4
		for _, s := range sh.sets {
			n += cap(s.list) * 4
			if s.bits != nil {
				n += int(unsafe.Sizeof(*s.bits))
				for _, t := range s.bits.tier {
					n += cap(t) * 8
				}
			}
		}
		sh.mu.RUnlock()
	}
	x.wmu.RLock()
	n += len(x.workers)*(int(unsafe.Sizeof(workerRec{}))+16) + cap(x.owner)*4 + cap(x.live)*8
	x.wmu.RUnlock()
	return n
}

// Overlap returns, for every worker holding at least the prompt's first block
// in the device tier, the number of leading blocks of the prompt it holds
// there. hashes are the prompt's sequence hashes (kvcache.HashBlocks). It
// allocates the map; the router's hot path uses OverlapInto.
func (x *Index) Overlap(hashes []uint64) map[WorkerID]int {
	ms := x.OverlapInto(hashes, nil)
	out := make(map[WorkerID]int, len(ms))
	for _, m := range ms {
		if m.Device > 0 {
			out[m.Worker] = m.Device
		}
	}
	return out
}

// A Match is one worker's share of a prompt's leading blocks. Each field is the length of
// the leading run of the prompt's blocks held in the tiers up to its own (so Device ≤ Host
// ≤ Disk ≤ Remote): a block of the Host run beyond Device is in host memory (or on the
// device after a block that is not), and so on.
type Match struct {
	Worker WorkerID
	Device int // leading blocks held in the device tier
	Host   int // leading blocks held in the device or the host tier
	Disk   int // … or on its disk
	Remote int // … or in a shared directory it reads: in any tier
}

// run returns the leading run of the tiers up to level t.
func (m *Match) run(t int) int {
	switch t {
	case 0:
		return m.Device
	case 1:
		return m.Host
	case 2:
		return m.Disk
	}
	return m.Remote
}

func (m *Match) setRun(t, n int) {
	switch t {
	case 0:
		m.Device = n
	case 1:
		m.Host = n
	case 2:
		m.Disk = n
	default:
		m.Remote = n
	}
}

// OverlapInto appends to dst[:0] one Match for every worker that holds the
// prompt's first block in some tier, in no particular order, and returns it.
// Sequence hashes chain, so a worker holds a prompt's leading block i only if it
// holds hash i: the walk keeps, for each tier level, the workers whose run is
// unbroken as a bitmap over their slots, intersects them with each block's holders a
// word at a time, and ends when no worker is left: O(blocks × words of the workers
// still matching), one table lookup per block. It does not allocate once dst has grown.
func (x *Index) OverlapInto(hashes []uint64, dst []Match) []Match {
	wk, _ := x.walks.Get().(*Walk)
	if wk == nil {
		wk = new(Walk)
	}
	dst = x.OverlapWith(wk, hashes, dst)
	x.walks.Put(wk)
	return dst
}

// A Walk is the scratch of one overlap lookup at a time; a caller that looks up often
// keeps one (OverlapWith).
type Walk struct {
	// lv[t]: the slots whose run of blocks held in tiers ≤ t is unbroken (lv[3]: alive,
	// held somewhere); hb[t]: the block's holders in tier t; ends[t][slot]: where the slot's
	// run of level t ended, once it has (t < 3; a slot that leaves lv[3] is matched then).
	lv   [numLevels][]uint64
	hb   [numLevels][]uint64
	ends [numLevels - 1][]int32

	// stamp, when set, takes the runs of the workers it knows instead of dst (State.Decide's
	// walk: no Match to write and read back per worker).
	stamp *runStamp

	// lockedAll: the walk holds every shard's read lock, and its probes take none.
	lockedAll bool

	// grouping (the grouped decision's walk, State.pickGrouped) reports runs by slot: h0
	// holds the slots that hold the prompt's first block; groups the sets of at least
	// walkGroupMin slots whose device runs ended at the same block, recorded as bitmaps
	// instead of one by one; the other slots of h0 are listed in sp, with their runs in
	// runs[slot]; pend holds the device runs ending at the block being stepped, until the
	// block is done and their number known. dst gets no Match.
	grouping bool
	h0       []uint64
	pend     []uint64
	npend    int
	groups   []walkGroup
	ngroups  int
	sp       []uint32
	runs     [][numLevels]int32
}

// A walkGroup is slots whose runs of the prompt are all run blocks on the device.
type walkGroup struct {
	run  int
	bits []uint64 // by slot
}

// Grouping limits: a block where fewer device runs end stamps them one by one; a walk
// records at most maxWalkGroups groups (each of at least walkGroupMin slots), and stamps
// further ones.
const (
	walkGroupMin  = 64
	maxWalkGroups = 8
)

// A runStamp writes the walk's runs straight into the policy's workers: worker id's into
// dense[id], marked with the decision seq. A Match is appended for a worker id beyond
// dense only; one of dense without a state (not registered) is skipped.
type runStamp struct {
	dense []*WorkerState
	seq   uint64
}

func (wk *Walk) grow(words, slots int) {
	if cap(wk.lv[0]) < words {
		for t := range wk.lv {
			wk.lv[t], wk.hb[t] = make([]uint64, words), make([]uint64, words)
		}
		wk.h0, wk.pend = make([]uint64, words), make([]uint64, words)
		wk.groups = nil
	}
	if cap(wk.ends[0]) < slots {
		for t := range wk.ends {
			wk.ends[t] = make([]int32, slots+64)
		}
	}
	if wk.grouping && len(wk.runs) < slots {
		wk.runs = make([][numLevels]int32, slots+64)
	}
	for t := range wk.lv {
		wk.lv[t], wk.hb[t] = wk.lv[t][:words], wk.hb[t][:words]
	}
	wk.h0, wk.pend = wk.h0[:words], wk.pend[:words]
}

// OverlapWith is OverlapInto with the caller's scratch wk, which must not be used by
// two lookups at once.
func (x *Index) OverlapWith(wk *Walk, hashes []uint64, dst []Match) []Match {
	dst = dst[:0]
	if len(hashes) == 0 {
		return dst
	}
	x.wmu.RLock()
	dst = x.walk(wk, hashes, dst)
	x.wmu.RUnlock()
	return dst
}

// walk is OverlapWith with wmu held for reading. When no writer holds or wants a shard's
// lock, it holds every shard's read lock for the whole walk: two atomic operations a
// shard, where locks by probe would cost two a probe (a decision at 1,000 workers probes
// about 230 blocks). Else it takes a shard's read lock only around its reads of one
// block's holders, never two at once (no lock order), so that an event's chunk waits for
// one block's reads rather than a whole walk, and the lookup wakes no applier parked on
// its locks.
//
// A walk by probes reads each block at its own moment: events applied meanwhile may
// show in some blocks and not in others, as if they had arrived a little earlier or
// later. The runs stay runs (the walk's bitmaps only shrink, level by level), their ends
// stay within the prompt and the slots within the table (no slot is assigned or retired
// while wmu is held), and a worker's run lies between what it held of the prompt at some
// moment of the walk and what it held at another (TestIndexLookupsDuringEvents): a
// concurrent event can make a match stale, like an event still in flight, but not
// invalid.
func (x *Index) walk(wk *Walk, hashes []uint64, dst []Match) []Match {
	wk.lockedAll = x.tryRLockAll()
	dst = x.walkBlocks(wk, hashes, dst)
	if wk.lockedAll {
		for i := range x.shards {
			x.shards[i].mu.RUnlock()
		}
		wk.lockedAll = false
	}
	return dst
}

// tryRLockAll takes every shard's read lock if none is taken or wanted by a writer, and
// reports whether it did.
func (x *Index) tryRLockAll() bool {
	for i := range x.shards {
		if !x.shards[i].mu.TryRLock() {
			for j := range i {
				x.shards[j].mu.RUnlock()
			}
			return false
		}
	}
	return true
}

// runlock releases sh's read lock taken by rlookup for wk (small enough to inline: a
// walk that holds every lock calls it per block for nothing).
func (wk *Walk) runlock(sh *shard) {
	if !wk.lockedAll {
		sh.runlock()
	}
}

// runlock releases sh's read lock; out of line, so that Walk.runlock inlines.
//
//go:noinline
func (sh *shard) runlock() { sh.mu.RUnlock() }

// walkBlocks is walk's walk over the blocks.
func (x *Index) walkBlocks(wk *Walk, hashes []uint64, dst []Match) []Match {
	grouping := wk.grouping
	nw := len(x.live)
	wk.grow(nw, len(x.owner))
	wk.ngroups, wk.npend = 0, 0
	if grouping {
		clear(wk.h0)
	}
	sh0, v := x.rlookup(wk, hashes[0])
	if v == 0 {
		wk.runlock(sh0)
		return dst
	}
	alive := wk.lv[numLevels-1]
	lo, hi := x.holderWords(sh0, v, wk.hb, 0, nw)
	prev := fpOf(sh0, v)
	wk.runlock(sh0)
	if lo >= hi {
		return dst
	}
	for j := lo; j < hi; j++ {
		c := uint64(0)
		for t := range numLevels {
			c |= wk.hb[t][j]
			wk.lv[t][j] = c & x.live[j]
		}
		a := alive[j]
		for t := range numLevels - 1 {
			for b := a &^ wk.lv[t][j]; b != 0; b &= b - 1 {
				wk.ends[t][j*64+bits.TrailingZeros64(b)] = 0
			}
		}
	}
	if grouping {
		copy(wk.h0[lo:hi], alive[lo:hi])
	}
	lo, hi = trim(alive, lo, hi)
	for i := 1; i < len(hashes) && lo < hi; i++ {
		// Jump over the blocks held by the same workers as the block before (a chain on
		// the same workers, the common case): their runs all go on.
		sh, v := x.rlookup(wk, hashes[i])
		cur := fpOf(sh, v)
		if cur == prev && prev != 0 { // no change at i (else, the common case in a busy region)
			wk.runlock(sh)
			if i, sh, v = x.nextChange(wk, hashes, i+1, prev); i == len(hashes) {
				break
			}
			if !wk.lockedAll {
				// Block i is read again under its lock: the holders nextChange saw may
				// have changed since (then the step below is that of the newer holders).
				sh, v = x.rlookup(wk, hashes[i])
			}
			cur = fpOf(sh, v)
		}
		if h, ok := unFP(prev ^ cur); ok && int(holderSlot(h)) < len(x.owner) {
			wk.runlock(sh)
			slot := holderSlot(h)
			// One holder fewer than the block before, the others unchanged (a worker's
			// run of a prompt that others hold further ends here): only its run ends, so
			// only its word changes, whatever the number of workers.
			j, bit := int(slot/64), uint64(1)<<(slot%64)
			if j < len(alive) && alive[j]&bit != 0 {
				if l := &wk.lv; grouping && l[0][j]&bit != 0 {
					r, e := &wk.runs[slot], int32(i) // the common case, inline
					r[0], r[1], r[2], r[3] = e, e, e, e
					wk.sp = append(wk.sp, slot)
				} else {
					dst = x.drop(wk, dst, j, bit, l[0][j], i)
				}
				l := &wk.lv
				l[0][j] &^= bit
				l[1][j] &^= bit
				l[2][j] &^= bit
				l[3][j] &^= bit
			}
		} else {
			dst = x.stepBlock(wk, dst, sh, v, lo, hi, i)
			wk.runlock(sh)
			if grouping {
				dst = x.flush(wk, dst, i)
			}
		}
		prev = cur
		lo, hi = trim(alive, lo, hi)
	}
	for j := lo; j < hi; j++ {
		full := wk.lv[0][j]
		dst = x.drop(wk, dst, j, wk.pending(j, alive[j], full), full, len(hashes))
		for t := range numLevels {
			wk.lv[t][j] = 0
		}
	}
	if grouping {
		dst = x.flush(wk, dst, len(hashes))
	}
	return dst
}

// stepBlock narrows the runs of words [lo, hi) to block i, whose holders are v (of shard
// sh).
func (x *Index) stepBlock(wk *Walk, dst []Match, sh *shard, v uint32, lo, hi, i int) []Match {
	var h [numLevels]uint64 // the block's holders of one word, by tier
	switch {
	case v == 0 || v&multiBit == 0 && holderMask(v)&usedBits == 0:
		// Nobody (that counts): every run ends here.
		for j := lo; j < hi; j++ {
			dst = x.step(wk, dst, j, h, i)
		}
	case v&multiBit == 0:
		// One holder: every other worker's run ends here.
		s, m := holderSlot(v), holderMask(v)
		j0, bit := int(s/64), uint64(1)<<(s%64)
		for j := lo; j < hi; j++ {
			var hj [numLevels]uint64
			if j == j0 {
				for t := range numLevels {
					if m&(1<<t) != 0 {
						hj[t] = bit
					}
				}
			}
			dst = x.step(wk, dst, j, hj, i)
		}
	default:
		hs := &sh.sets[v&^multiBit]
		if b := hs.bits; b != nil && b.upper == 0 {
			// Held on the device alone, the common case: a word loses a run where an
			// unbroken run's slot does not hold the block.
			t0, alive := b.tier[0], wk.lv[numLevels-1]
			for j := lo; j < hi; j++ {
				var h0 uint64
				if j < len(t0) {
					h0 = t0[j]
				}
				if alive[j]&^h0 != 0 {
					dst = x.stepDevice(wk, dst, j, h0, i)
				}
			}
			return dst
		} else if b != nil {
			// Most words lose no run at a block where a few workers' runs end: test that
			// here, without step's call and copies.
			t0, t1, t2, t3 := b.tier[0], b.tier[1], b.tier[2], b.tier[3]
			l0, l1, l2, l3 := wk.lv[0], wk.lv[1], wk.lv[2], wk.lv[3]
			for j := lo; j < hi; j++ {
				var hj [numLevels]uint64
				if j < len(t0) && j < len(t1) && j < len(t2) && j < len(t3) {
					hj = [numLevels]uint64{t0[j], t1[j], t2[j], t3[j]}
					if keeps(l0[j], l1[j], l2[j], l3[j], hj) {
						continue
					}
				}
				dst = x.step(wk, dst, j, hj, i)
			}
			return dst
		}
		// On the device alone (the common case): one bitmap of holders, as for a bitmap
		// set above; a holder in another tier sends the block to the general case below.
		present, alive := wk.hb[0], wk.lv[numLevels-1]
		clear(present[lo:hi])
		deviceOnly := true
		for _, hd := range hs.list {
			if hd&uint32(usedBits&^devBit) != 0 {
				deviceOnly = false
				break
			}
			if s := holderSlot(hd); hd&uint32(devBit) != 0 && int(s/64) >= lo && int(s/64) < hi {
				present[s/64] |= 1 << (s % 64)
			}
		}
		if deviceOnly {
			for j := lo; j < hi; j++ {
				if alive[j]&^present[j] != 0 {
					dst = x.stepDevice(wk, dst, j, present[j], i)
				}
			}
			return dst
		}
		for t := range numLevels {
			clear(wk.hb[t][lo:hi])
		}
		for _, hd := range hs.list {
			s := holderSlot(hd)
			j, bit := int(s/64), uint64(1)<<(s%64)
			if j < lo || j >= hi {
				continue
			}
			for t := range numLevels {
				if hd&(1<<t) != 0 {
					wk.hb[t][j] |= bit
				}
			}
		}
		hb, lv := &wk.hb, &wk.lv
		for j := lo; j < hi; j++ {
			hj := [numLevels]uint64{hb[0][j], hb[1][j], hb[2][j], hb[3][j]}
			if !keeps(lv[0][j], lv[1][j], lv[2][j], lv[3][j], hj) {
				dst = x.step(wk, dst, j, hj, i)
			}
		}
	}
	return dst
}

// unFP inverts holderFP: the holder whose share of a fingerprint is d, if d is one. The
// walk uses it on the XOR of two consecutive blocks' fingerprints: the fingerprint is a
// bijective mix of a holder, so a difference of one holder names it. If that holder's run
// is still unbroken it ends there: an unbroken run's slot holds the block before (the
// runs only shrink), so d is its leaving, not another worker arriving. That no other
// holder changed rests on the fingerprints, as nextChange's jumps do.
func unFP(d uint64) (uint32, bool) {
	x := d ^ d>>31 ^ d>>62
	x *= 0x319642b2d24d8ec3 // 0x94d049bb133111eb⁻¹ mod 2⁶⁴
	x ^= x>>27 ^ x>>54
	x *= 0x96de1b173f119089 // 0xbf58476d1ce4e5b9⁻¹
	x ^= x>>30 ^ x>>60
	h := x - 0x9e3779b97f4a7c15
	if m := uint8(h); h>>32 != 0 || m == 0 || m&^usedBits != 0 {
		return 0, false
	}
	return uint32(h), true
}

// flush ends the device runs pend holds at end: as a group when there are enough of them
// (and room for one more), else stamped one by one.
func (x *Index) flush(wk *Walk, dst []Match, end int) []Match {
	if wk.npend == 0 {
		return dst
	}
	if wk.npend >= walkGroupMin && wk.ngroups < maxWalkGroups {
		if wk.ngroups == len(wk.groups) {
			wk.groups = append(wk.groups, walkGroup{})
		}
		g := &wk.groups[wk.ngroups]
		wk.ngroups++
		g.run = end
		g.bits = append(g.bits[:0], wk.pend...)
		clear(wk.pend)
	} else {
		e := int32(end)
		for j, b := range wk.pend {
			if b == 0 {
				continue
			}
			wk.pend[j] = 0
			for ; b != 0; b &= b - 1 { // listRuns of full runs, inline
				slot := j*64 + bits.TrailingZeros64(b)
				r := &wk.runs[slot]
				r[0], r[1], r[2], r[3] = e, e, e, e
				wk.sp = append(wk.sp, uint32(slot))
			}
		}
	}
	wk.npend = 0
	return dst
}

// keeps reports whether no run of a word whose runs by level are l0 … l3 breaks at a block
// whose holders of that word by tier are h: step would change nothing.
func keeps(l0, l1, l2, l3 uint64, h [numLevels]uint64) bool {
	c0 := h[0]
	c1 := c0 | h[1]
	c2 := c1 | h[2]
	return l0&^c0|l1&^c1|l2&^c2|l3&^(c2|h[3]) == 0
}

// pending returns the slots of word j whose runs end (gone) that drop must match: in a
// grouping walk, those whose device runs end whole (full) are left in pend instead.
func (wk *Walk) pending(j int, gone, full uint64) uint64 {
	if !wk.grouping {
		return gone
	}
	wk.pend[j] |= gone & full
	wk.npend += bits.OnesCount64(gone & full)
	return gone &^ full
}

// stepDevice is step for a block held on the device alone, by the slots h of word j: a
// slot that holds it keeps every level it had, so no level's run breaks but with the
// slot's whole run.
func (x *Index) stepDevice(wk *Walk, dst []Match, j int, h uint64, i int) []Match {
	gone, full := wk.lv[numLevels-1][j]&^h, wk.lv[0][j]
	dst = x.drop(wk, dst, j, wk.pending(j, gone, full), full, i)
	l := &wk.lv
	l[0][j] &= h
	l[1][j] &= h
	l[2][j] &= h
	l[3][j] &= h
	return dst
}

// step narrows word j of the runs to block i, whose holders of that word by tier are h:
// a slot whose run of level t breaks has it end at i, and one held in no tier any more is
// matched (or, in a grouped walk, its full device run is left in pend).
func (x *Index) step(wk *Walk, dst []Match, j int, h [numLevels]uint64, i int) []Match {
	if wk.lv[numLevels-1][j] == 0 {
		return dst
	}
	var nl [numLevels]uint64
	c, same := uint64(0), true
	for t := range numLevels {
		c |= h[t]
		nl[t] = wk.lv[t][j] & c
		same = same && nl[t] == wk.lv[t][j]
	}
	if same {
		return dst // nobody's run ends at this word
	}
	top := nl[numLevels-1]
	gone, full := wk.lv[numLevels-1][j]&^top, wk.lv[0][j]
	dst = x.drop(wk, dst, j, wk.pending(j, gone, full), full, i)
	for t := range numLevels - 1 {
		for lost := wk.lv[t][j] &^ nl[t] & top; lost != 0; lost &= lost - 1 {
			wk.ends[t][j*64+bits.TrailingZeros64(lost)] = int32(i)
		}
	}
	for t := range numLevels {
		wk.lv[t][j] = nl[t]
	}
	return dst
}

// nextChange returns the first block from i on whose holders' fingerprint is not fp (the
// holders of block i-1), or len(hashes). What a worker caches of a chain is a prefix of it
// (a pool evicts leaves first, a sequence holds its whole prefix, and the index applies a
// worker's events in order), so along a prompt the holders only shrink: once they differ
// from fp they stay different, and a galloping search finds the change in 2·log₂ of the
// distance lookups instead of one per block. A worker whose cache had a hole would be
// credited the blocks past it; the fingerprint is 64 bits, and a collision would lengthen
// the runs in the same way.
//
// In a walk by probes (walk) each probe takes its block's shard lock alone, so that
// blocks probed at different moments may disagree (an event applied between them); the
// search still ends within the prompt, at a block found different from fp when it was
// read.
func (x *Index) nextChange(wk *Walk, hashes []uint64, i int, fp uint64) (int, *shard, uint32) {
	n := len(hashes)
	if i == n {
		return n, nil, 0
	}
	if sh, v, f := x.probe(wk, hashes[i]); fp == 0 || f != fp {
		return i, sh, v
	}
	var jsh *shard // the shard and value of block j, the first found different
	var jv uint32
	good, step := i, 1 // blocks i … good hold the same
	j := n
	for {
		k := good + step
		if k >= n {
			k = n - 1
		}
		if k == good {
			return n, nil, 0 // the same to the end
		}
		if sh, v, f := x.probe(wk, hashes[k]); f != fp {
			j, jsh, jv = k, sh, v
			break
		}
		good, step = k, 2*step
	}
	// good is the same, j is not: the change is in (good, j].
	for j-good > 1 {
		m := good + (j-good)/2
		if sh, v, f := x.probe(wk, hashes[m]); f == fp {
			good = m
		} else {
			j, jsh, jv = m, sh, v
		}
	}
	return j, jsh, jv
}

// probe returns h's shard and value and the fingerprint of its holders, read under the
// shard's lock; in a walk by probes the value is not to be read after (its holder set
// may have changed or been freed since).
func (x *Index) probe(wk *Walk, h uint64) (*shard, uint32, uint64) {
	sh, v := x.rlookup(wk, h)
	f := fpOf(sh, v)
	wk.runlock(sh)
	return sh, v, f
}

// drop appends the Matches of the slots of word j in gone, whose runs (those still
// unbroken) end at end; full are the slots whose device run is unbroken (lv[0] ⊆ lv[1] ⊆
// …: every level of theirs is), which end every level here with no ends to read: the
// common case, a block that a worker holds only on the device. Slots stay in order, which
// the peer choice's ties follow.
func (x *Index) drop(wk *Walk, dst []Match, j int, gone, full uint64, end int) []Match {
	if gone == 0 {
		return dst
	}
	if wk.grouping {
		x.listRuns(wk, j, gone, full, end)
		return dst
	}
	if sk := wk.stamp; sk != nil {
		return x.stampRuns(wk, sk, dst, j, gone, full, end)
	}
	dst = slices.Grow(dst, bits.OnesCount64(gone))
	base := x.owner[j*64:]
	for ; gone != 0; gone &= gone - 1 {
		b := bits.TrailingZeros64(gone)
		if full&(1<<b) != 0 {
			dst = append(dst, Match{Worker: base[b], Device: end, Host: end, Disk: end, Remote: end})
		} else {
			dst = append(dst, x.match(wk, j, b, end))
		}
	}
	return dst
}

// stampRuns is drop with wk.stamp set.
func (x *Index) stampRuns(wk *Walk, sk *runStamp, dst []Match, j int, gone, full uint64, end int) []Match {
	base := x.owner[j*64:]
	for ; gone != 0; gone &= gone - 1 {
		b := bits.TrailingZeros64(gone)
		m := Match{Worker: base[b], Device: end, Host: end, Disk: end, Remote: end}
		if full&(1<<b) == 0 {
			m = x.match(wk, j, b, end)
		}
		if int(m.Worker) >= len(sk.dense) {
			dst = append(dst, m)
			continue
		}
		w := sk.dense[m.Worker]
		if w == nil {
			continue
		}
		w.stamp, w.ov = sk.seq, [numLevels]int{m.Device, m.Host, m.Disk, m.Remote}
	}
	return dst
}

// listRuns is drop in a grouping walk: the runs go to wk.runs by slot.
func (x *Index) listRuns(wk *Walk, j int, gone, full uint64, end int) {
	for ; gone != 0; gone &= gone - 1 {
		b := bits.TrailingZeros64(gone)
		slot := j*64 + b
		r := &wk.runs[slot] // written in place: a copy from the stack stalls its load
		if full&(1<<b) != 0 {
			e := int32(end)
			r[0], r[1], r[2], r[3] = e, e, e, e
		} else {
			m := x.match(wk, j, b, end)
			r[0], r[1], r[2], r[3] = int32(m.Device), int32(m.Host), int32(m.Disk), int32(m.Remote)
		}
		wk.sp = append(wk.sp, uint32(slot))
	}
}

// match is the Match of the slot at word j, bit b, whose run in any tier ends at end: a
// level still unbroken ends there too, the others where they broke.
func (x *Index) match(wk *Walk, j, b int, end int) Match {
	slot := j*64 + b
	m := Match{Worker: x.owner[slot], Remote: end}
	for t := range numLevels - 1 {
		if wk.lv[t][j]&(1<<b) != 0 {
			m.setRun(t, end)
		} else {
			m.setRun(t, int(wk.ends[t][slot]))
		}
	}
	return m
}

// trim narrows [lo, hi) to the words of al with bits set.
func trim(al []uint64, lo, hi int) (int, int) {
	for lo < hi && al[lo] == 0 {
		lo++
	}
	for hi > lo && al[hi-1] == 0 {
		hi--
	}
	return lo, hi
}

// holderWords writes the holders v of a block of sh as bitmaps by tier into words
// [lo, hi) of hb, and returns the range of words with holders.
func (x *Index) holderWords(sh *shard, v uint32, hb [numLevels][]uint64, lo, hi int) (int, int) {
	if v&multiBit != 0 {
		if b := sh.sets[v&^multiBit].bits; b != nil {
			for j := lo; j < hi; j++ {
				for t := range numLevels {
					hb[t][j] = 0
					if j < len(b.tier[t]) {
						hb[t][j] = b.tier[t][j]
					}
				}
			}
			return lo, min(hi, len(b.tier[0]))
		}
	}
	for t := range numLevels {
		clear(hb[t][lo:hi])
	}
	first, last := hi, lo
	if v&multiBit != 0 {
		for _, h := range sh.sets[v&^multiBit].list {
			first, last = setHolder(h, hb, lo, hi, first, last)
		}
	} else {
		first, last = setHolder(v, hb, lo, hi, first, last)
	}
	return first, last
}

// setHolder sets holder h's bits in hb (words [lo, hi) only) and widens [first, last) to
// its word.
func setHolder(h uint32, hb [numLevels][]uint64, lo, hi, first, last int) (int, int) {
	m := holderMask(h)
	if m&usedBits == 0 {
		return first, last
	}
	s := holderSlot(h)
	j := int(s / 64)
	if j < lo || j >= hi {
		return first, last
	}
	bit := uint64(1) << (s % 64)
	for t := range numLevels {
		if m&(1<<t) != 0 {
			hb[t][j] |= bit
		}
	}
	return min(first, j), max(last, j+1)
}
