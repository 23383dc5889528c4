package kvcache

// Lower tiers (docs/kv-tiers.md): the books of the blocks a pool keeps below its device
// tier, in host memory, on local disk and in a shared directory. The pool holds them under
// its own lock, so that one event stream (one id sequence) and one snapshot cover every
// tier. The bytes live elsewhere (package kvtier, or nowhere in the simulator): the pool
// names slots and says what to copy where; a Saver copies device blocks down as they leave
// the device, the caller runs the asynchronous Transfers between lower tiers and the Loads
// of an onboarding, and reports back.

import (
	"errors"
	"fmt"
)

// OffloadPolicy says when a device block is copied to the first lower tier.
type OffloadPolicy uint8

const (
	// WriteBack copies a block down when it is evicted from the device: nothing is copied
	// for blocks that stay, and eviction pays the copy.
	WriteBack OffloadPolicy = iota
	// WriteThrough copies a block down when it is first committed: eviction is free, and
	// every committed block costs a copy.
	WriteThrough
)

func (o OffloadPolicy) String() string {
	if o == WriteThrough {
		return "write-through"
	}
	return "write-back"
}

// ParseOffload returns the policy named s ("" is WriteBack).
func ParseOffload(s string) (OffloadPolicy, error) {
	switch s {
	case "", "write-back":
		return WriteBack, nil
	case "write-through":
		return WriteThrough, nil
	}
	return 0, fmt.Errorf("kvcache: unknown offload policy %q (want write-back or write-through)", s)
}

// TierConfig sizes one lower tier.
type TierConfig struct {
	Tier Tier // TierHost, TierDisk or TierRemote
	// Blocks is the tier's capacity in blocks. 0 is unbounded, for a tier whose store sizes
	// itself (a shared directory); a host or disk tier needs a capacity.
	Blocks int
	// MinUses is the frequency filter: a block enters the tier only once it has been used
	// this many times (its commit is one use, each prefix-cache hit or onboarding another);
	// 0 and 1 admit every block. Dynamo's disk filter is 2.
	MinUses int
}

// Options configures a pool's lower tiers.
type Options struct {
	// Tiers are the lower tiers, fastest first. The first must be TierHost: it is fed from
	// the device, synchronously, by Saver. The others (TierDisk, TierRemote) are fed from
	// the first, asynchronously, by Transfers that the caller runs.
	Tiers   []TierConfig
	Offload OffloadPolicy
	// Saver copies device blocks into the first lower tier; nil moves no bytes (a modelled
	// pool: the simulator's, or an engine without KV data).
	Saver Saver
	// MaxTransfers bounds the asynchronous transfers queued or running at once (0: 64):
	// each pins a host slot, so a stalled disk cannot pin the whole host tier.
	MaxTransfers int
}

// Loc names a block's place in a lower tier: the tier and the slot the tier's store keeps
// it in (0 … capacity-1).
type Loc struct {
	Tier Tier
	Slot int32
}

// A Saver copies the bytes of device block block, whose sequence hash is hash, into slot
// to of the first lower tier. It is called without the pool's lock, by the goroutine whose
// reservation evicted the block (write-back) or whose commit filled it (write-through),
// before the block can be written again; the slot is reserved for it until Save returns.
type Saver interface {
	Save(block int32, to Loc, hash uint64) error
}

// A Transfer is an asynchronous copy between lower tiers that the pool asks its caller to
// run (TakeTransfers) and to report (TransferDone): the block with sequence hash Hash (and
// parent Parent) from From to To. From stays pinned, To reserved, until it is reported.
type Transfer struct {
	From, To     Loc
	Hash, Parent uint64
	Uses         uint32 // the block's uses when queued (a disk file records it)
}

// A Load is one block of an onboarding: copy the block with sequence hash Hash from From
// into device block Block. From stays pinned and Block reserved until the sequence's
// OnboardDone.
type Load struct {
	Block int32
	From  Loc
	Hash  uint64
}

// TierStats is one lower tier's occupancy and counters.
type TierStats struct {
	Tier      Tier
	Capacity  int    // blocks; 0 unbounded
	Ready     int    // blocks held and announced
	Filling   int    // slots reserved for a copy in progress
	Pinned    int    // ready blocks read by a load or a transfer now
	Stored    uint64 // blocks that entered the tier
	Evicted   uint64 // blocks evicted to make room
	Onboarded uint64 // blocks loaded from the tier into the device
	Failed    uint64 // copies into the tier that failed (the block was not stored)
	Bad       uint64 // blocks dropped because a load found them unreadable or wrong
	Skipped   uint64 // blocks not stored: the tier full of pinned blocks, or transfers at their bound
	// Loadable is false while onboarding does not load from the tier (SetLoadable: it
	// measured slower than computing); Bypassed counts the matches whose run of blocks
	// stopped at a block the tier held, computed instead.
	Loadable bool
	Bypassed uint64
}

// Entry states of a lower tier.
const (
	entFree uint8 = iota
	entFilling
	entReady
)

// lent is one slot of a lower tier.
type lent struct {
	hash, parent uint64
	uses         uint32
	ref          int32 // loads and transfers reading it, or the copy filling it
	state        uint8
	down         uint8 // bits of the tiers below it has been queued for
	prev, next   int32 // LRU links, while ready and unreferenced
	inLRU        bool
	doomed       bool // its store lost it (ClearTier) while a reader held it: dropped when unpinned
}

// lowerTier is the books of one lower tier.
type lowerTier struct {
	p        *Pool
	cfg      TierConfig
	async    bool // fed by Transfers, not by the Saver
	writable bool // new blocks may enter (the caller turns it off while the store fails)
	skipLoad bool // onboarding does not load from it (SetLoadable: slower than computing)
	bypassed uint64
	ents     []lent
	free     []int32
	index    map[uint64]int32 // hash → slot, filling or ready
	head     int32            // LRU: oldest first
	tail     int32
	lruN     int

	ready, filling, pinned                        int
	stored, evicted, onboarded, failed, bad, skip uint64

	stored1 []int32  // slots that became ready, for the next Stored events
	removed []uint64 // hashes evicted or dropped, for the next Removed event
}

// saveJob is a device block to copy into a host slot, chosen under the lock and run by the
// reservation or commit that chose it.
type saveJob struct {
	block int32
	to    Loc
	hash  uint64
	err   error
}

// ErrTierConfig is wrapped by NewPoolWith's errors.
var ErrTierConfig = errors.New("kvcache: invalid tier configuration")

// NewPoolWith returns a pool of numBlocks device blocks of blockSize positions with the
// lower tiers of o. It panics as NewPool does on invalid sizes.
func NewPoolWith(numBlocks, blockSize int, o Options) (*Pool, error) {
	p := NewPool(numBlocks, blockSize)
	if len(o.Tiers) == 0 {
		return p, nil
	}
	if o.MaxTransfers <= 0 {
		o.MaxTransfers = 64
	}
	seen := uint8(0)
	for i, c := range o.Tiers {
		switch {
		case i == 0 && c.Tier != TierHost:
			return nil, fmt.Errorf("%w: the first lower tier must be host, not %v (disk and remote tiers are fed from host memory)", ErrTierConfig, c.Tier)
		case i > 0 && c.Tier != TierDisk && c.Tier != TierRemote:
			return nil, fmt.Errorf("%w: tier %v below host", ErrTierConfig, c.Tier)
		case seen&(1<<c.Tier) != 0:
			return nil, fmt.Errorf("%w: tier %v twice", ErrTierConfig, c.Tier)
		case c.Blocks < 0 || c.Blocks > 1<<31-1 || c.Blocks == 0 && c.Tier != TierRemote:
			return nil, fmt.Errorf("%w: tier %v of %d blocks", ErrTierConfig, c.Tier, c.Blocks)
		case c.MinUses < 0:
			return nil, fmt.Errorf("%w: tier %v: min uses %d", ErrTierConfig, c.Tier, c.MinUses)
		}
		seen |= 1 << c.Tier
		t := &lowerTier{p: p, cfg: c, async: i > 0, writable: true, index: make(map[uint64]int32), head: none, tail: none}
		p.lower = append(p.lower, t)
		p.byTier[c.Tier] = t
	}
	p.opts = o
	p.work = make(chan struct{}, 1)
	return p, nil
}

// Tiered reports whether the pool has lower tiers.
func (p *Pool) Tiered() bool { return len(p.lower) > 0 }

// Work returns a channel that receives when Transfers are queued (nil for a pool without
// lower tiers). A caller running them waits on it, then calls TakeTransfers.
func (p *Pool) Work() <-chan struct{} { return p.work }

// TakeTransfers appends the queued transfers to dst and returns it; the caller runs each
// and reports it with TransferDone.
func (p *Pool) TakeTransfers(dst []Transfer) []Transfer {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst = append(dst, p.xfers...)
	clear(p.xfers)
	p.xfers = p.xfers[:0]
	return dst
}

// TransferDone reports a transfer: on success its block enters To's tier (and is
// announced); on failure the slot is freed and counted. From is unpinned either way.
func (p *Pool) TransferDone(tr Transfer, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.xferN--
	p.finishFill(tr.To, err)
	if t := p.byTier[tr.From.Tier]; t != nil {
		if err != nil && t.ents[tr.From.Slot].hash == tr.Hash {
			t.ents[tr.From.Slot].down &^= 1 << tr.To.Tier // may be queued again at a later use
		}
		t.unpin(tr.From.Slot)
	}
	p.flushLower()
}

// SetWritable lets new blocks into tier t, or stops them (while its store fails: a full
// disk, a directory gone), so that copies are not started only to fail. It reports
// whether the pool has tier t.
func (p *Pool) SetWritable(t Tier, writable bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	lt := p.tierOf(t)
	if lt == nil {
		return false
	}
	lt.writable = writable
	return true
}

// SetLoadable lets onboarding load blocks from tier t, or not (a tier whose measured load
// cost exceeds the cost of computing a block: loading would make the request slower).
func (p *Pool) SetLoadable(t Tier, loadable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if lt := p.tierOf(t); lt != nil {
		lt.skipLoad = !loadable
	}
}

// ClearTier forgets every block of lower tier t that no load or transfer is reading, and
// emits an EventCleared of that tier if any was forgotten (the store lost them: a
// directory gone). Blocks being read stay, announced again after the Cleared event, until
// their reader reports; then they are dropped.
func (p *Pool) ClearTier(t Tier) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	lt := p.tierOf(t)
	if lt == nil {
		return 0
	}
	n := 0
	for s := range lt.ents {
		if lt.dropIdle(int32(s)) {
			n++
		}
	}
	lt.removed = lt.removed[:0] // one Cleared says it all
	if n == 0 {
		return 0
	}
	p.emitHashes(EventCleared, t, 0, nil)
	// Blocks a reader holds stay in the books until it is done (then they are dropped):
	// announce them again, so that a router's view equals a snapshot meanwhile.
	for s := range lt.ents {
		if e := &lt.ents[s]; e.state == entReady {
			e.doomed = true
			lt.stored1 = append(lt.stored1, int32(s))
		}
	}
	p.flushLower()
	return n
}

// A Restored block is one a tier's store found at start (a disk tier's block files):
// Slot where it lies, its hashes, and the uses recorded with it.
type Restored struct {
	Slot         int32 // -1: any free slot (a store that names blocks by hash)
	Hash, Parent uint64
	Uses         uint32
}

// Restore enters blocks that tier t's store holds already (found at start, or by a scan of
// a shared directory) and announces them; a hash held already, or a slot that is taken or
// beyond the capacity, is skipped. It returns how many entered.
func (p *Pool) Restore(t Tier, blocks []Restored) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	lt := p.tierOf(t)
	if lt == nil {
		return 0
	}
	n := 0
	for _, b := range blocks {
		if _, dup := lt.index[b.Hash]; dup {
			continue
		}
		slot := b.Slot
		if slot < 0 {
			var ok bool
			if slot, ok = lt.alloc(); !ok {
				break
			}
		} else if !lt.claim(slot) {
			continue
		}
		e := &lt.ents[slot]
		*e = lent{hash: b.Hash, parent: b.Parent, uses: b.Uses, state: entReady, prev: none, next: none}
		if !p.heldElsewhere(b.Hash, t) {
			p.held++
		}
		lt.index[b.Hash] = slot
		lt.ready++
		lt.stored++
		lt.pushLRU(slot)
		lt.stored1 = append(lt.stored1, slot)
		n++
	}
	p.flushLower()
	return n
}

// Forget drops the given hashes from lower tier t (its store no longer holds them: files
// removed from a shared directory by others) unless a reader holds them, and announces it.
func (p *Pool) Forget(t Tier, hashes []uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	lt := p.tierOf(t)
	if lt == nil {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if s, ok := lt.index[h]; ok && lt.dropIdle(s) {
			n++
		}
	}
	p.flushLower()
	return n
}

// Holds reports whether lower tier t holds a block of sequence hash h, ready to load.
func (p *Pool) Holds(t Tier, h uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	lt := p.tierOf(t)
	if lt == nil {
		return false
	}
	s, ok := lt.index[h]
	return ok && lt.ents[s].state == entReady
}

// TierStats returns the lower tiers' figures, fastest first (nil without lower tiers).
func (p *Pool) TierStats() []TierStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []TierStats
	for _, t := range p.lower {
		out = append(out, TierStats{Tier: t.cfg.Tier, Capacity: t.cfg.Blocks, Ready: t.ready, Filling: t.filling, Pinned: t.pinned,
			Stored: t.stored, Evicted: t.evicted, Onboarded: t.onboarded, Failed: t.failed, Bad: t.bad, Skipped: t.skip,
			Loadable: !t.skipLoad, Bypassed: t.bypassed})
	}
	return out
}

func (p *Pool) tierOf(t Tier) *lowerTier {
	if int(t) >= len(p.byTier) {
		return nil
	}
	return p.byTier[t]
}

// ---- what the device tier does with the lower ones (called with p.mu held) ----

// offloadEvicted is called as device block id (cached, with its hash and parent still
// set) is evicted: under write-back it goes down to host unless host has it (and
// write-through has copied it at commit already, unless host evicted it since).
func (p *Pool) offloadEvicted(id int32) {
	if len(p.lower) == 0 {
		return
	}
	b := &p.blocks[id]
	p.offload(id, b.hash, b.parent, b.uses)
}

// offload chooses a host slot for device block id and queues its save, unless host holds
// the hash already (whose uses it then raises) or the block has not been used enough.
func (p *Pool) offload(id int32, hash, parent uint64, uses uint32) {
	host := p.lower[0]
	if s, ok := host.index[hash]; ok {
		e := &host.ents[s]
		if uses > e.uses {
			e.uses = uses
			if e.state == entReady {
				p.queueDown(host, s)
			}
		}
		return
	}
	if !host.writable || int(uses) < host.cfg.MinUses {
		return
	}
	slot, ok := host.fill(hash, parent, uses)
	if !ok {
		host.skip++
		return
	}
	p.saves = append(p.saves, saveJob{block: id, to: Loc{TierHost, slot}, hash: hash})
}

// takeSaves moves the saves chosen under the lock into dst (the caller's scratch).
func (p *Pool) takeSaves(dst []saveJob) []saveJob {
	dst = append(dst[:0], p.saves...)
	clear(p.saves)
	p.saves = p.saves[:0]
	return dst
}

// runSaves copies the chosen blocks down (without the lock) and records the outcome.
// Called without p.mu.
func (p *Pool) runSaves(jobs []saveJob) {
	if len(jobs) == 0 {
		return
	}
	if sv := p.opts.Saver; sv != nil {
		for i := range jobs {
			jobs[i].err = sv.Save(jobs[i].block, jobs[i].to, jobs[i].hash)
		}
	}
	p.mu.Lock()
	for _, j := range jobs {
		p.finishFill(j.to, j.err)
	}
	p.flushLower()
	p.mu.Unlock()
}

// finishFill ends the copy into loc: the block is ready (and will be announced) or, on
// err, the slot is freed (it was never announced).
func (p *Pool) finishFill(loc Loc, err error) {
	t := p.byTier[loc.Tier]
	e := &t.ents[loc.Slot]
	if e.state != entFilling {
		panic("kvcache: a copy finished into a slot not being filled")
	}
	t.filling--
	e.ref--
	if err != nil {
		t.failed++
		delete(t.index, e.hash)
		*e = lent{prev: none, next: none}
		t.free = append(t.free, loc.Slot)
		return
	}
	e.state = entReady
	if !p.heldElsewhere(e.hash, t.cfg.Tier) {
		p.held++
	}
	t.ready++
	t.stored++
	t.pushLRU(loc.Slot)
	t.stored1 = append(t.stored1, loc.Slot)
	if !t.async {
		p.queueDown(t, loc.Slot)
	}
}

// queueDown queues transfers of host slot s to the asynchronous tiers whose frequency
// filter it passes and that do not hold it.
func (p *Pool) queueDown(t *lowerTier, s int32) {
	e := &t.ents[s]
	for _, d := range p.lower[1:] {
		bit := uint8(1) << d.cfg.Tier
		if e.down&bit != 0 || int(e.uses) < d.cfg.MinUses || !d.writable {
			continue
		}
		if _, ok := d.index[e.hash]; ok {
			e.down |= bit
			continue
		}
		if p.xferN >= p.opts.MaxTransfers {
			d.skip++
			continue
		}
		ds, ok := d.fill(e.hash, e.parent, e.uses)
		if !ok {
			d.skip++
			continue
		}
		e.down |= bit
		t.pin(s)
		p.xferN++
		p.xfers = append(p.xfers, Transfer{From: Loc{t.cfg.Tier, s}, To: Loc{d.cfg.Tier, ds}, Hash: e.hash, Parent: e.parent, Uses: e.uses})
		select {
		case p.work <- struct{}{}:
		default:
		}
	}
}

// flushLower emits the lower tiers' pending Removed and Stored events.
func (p *Pool) flushLower() {
	for _, t := range p.lower {
		if len(t.removed) > 0 {
			p.emitHashes(EventRemoved, t.cfg.Tier, 0, t.removed)
			t.removed = t.removed[:0]
		}
		p.emitStored(t)
	}
}

// emitStored announces t's newly ready slots, one event per chain of them (a run whose
// blocks are each the child of the one before, in either order: write-back evicts leaves
// first, so a chain comes down child first).
func (p *Pool) emitStored(t *lowerTier) {
	ss := t.stored1
	for i := 0; i < len(ss); {
		j := i + 1
		up := true // the run so far goes parent → child
		for j < len(ss) {
			a, b := &t.ents[ss[j-1]], &t.ents[ss[j]]
			switch {
			case b.parent == a.hash && (up || j == i+1):
				up = true
			case a.parent == b.hash && (!up || j == i+1):
				up = false
			default:
				goto emit
			}
			j++
		}
	emit:
		hs := p.scratch[:0]
		if up {
			for k := i; k < j; k++ {
				hs = append(hs, t.ents[ss[k]].hash)
			}
		} else {
			for k := j - 1; k >= i; k-- {
				hs = append(hs, t.ents[ss[k]].hash)
			}
		}
		first := ss[i]
		if !up {
			first = ss[j-1]
		}
		p.emitHashes(EventStored, t.cfg.Tier, t.ents[first].parent, hs)
		p.scratch = hs[:0]
		i = j
	}
	t.stored1 = t.stored1[:0]
}

// ---- one lower tier's books ----

// fill reserves a slot for hash (evicting the least recently used unpinned block if the
// tier is full), in state filling with one reference (the copy's). It reports false when
// every block is pinned.
func (t *lowerTier) fill(hash, parent uint64, uses uint32) (int32, bool) {
	s, ok := t.alloc()
	if !ok {
		return 0, false
	}
	t.ents[s] = lent{hash: hash, parent: parent, uses: uses, ref: 1, state: entFilling, prev: none, next: none}
	t.index[hash] = s
	t.filling++
	return s, true
}

// alloc returns a free slot: a free one, a new one while under capacity, or the least
// recently used unpinned block's, evicted.
func (t *lowerTier) alloc() (int32, bool) {
	if n := len(t.free); n > 0 {
		s := t.free[n-1]
		t.free = t.free[:n-1]
		return s, true
	}
	if t.cfg.Blocks == 0 || len(t.ents) < t.cfg.Blocks {
		t.ents = append(t.ents, lent{prev: none, next: none})
		return int32(len(t.ents) - 1), true
	}
	if t.head == none {
		return 0, false
	}
	s := t.head
	t.evicted++
	t.drop(s)
	// drop freed it: take it back.
	t.free = t.free[:len(t.free)-1]
	return s, true
}

// claim takes slot s, which must be free (or beyond the slots made so far), for Restore.
func (t *lowerTier) claim(s int32) bool {
	if s < 0 || t.cfg.Blocks > 0 && int(s) >= t.cfg.Blocks {
		return false
	}
	for int(s) >= len(t.ents) {
		t.free = append(t.free, int32(len(t.ents)))
		t.ents = append(t.ents, lent{prev: none, next: none})
	}
	if t.ents[s].state != entFree {
		return false
	}
	for i, f := range t.free {
		if f == s {
			t.free[i] = t.free[len(t.free)-1]
			t.free = t.free[:len(t.free)-1]
			return true
		}
	}
	return false
}

// drop removes ready, unpinned slot s: out of the index and the LRU, onto the free list,
// its hash queued for a Removed event.
func (t *lowerTier) drop(s int32) {
	e := &t.ents[s]
	if e.inLRU {
		t.unlinkLRU(s)
	}
	delete(t.index, e.hash)
	if !t.p.heldElsewhere(e.hash, t.cfg.Tier) {
		t.p.held--
	}
	t.removed = append(t.removed, e.hash)
	t.ready--
	*e = lent{prev: none, next: none}
	t.free = append(t.free, s)
}

// dropIdle drops slot s if it is ready and no reader holds it, and reports whether it did.
func (t *lowerTier) dropIdle(s int32) bool {
	if e := &t.ents[s]; e.state != entReady || e.ref != 0 {
		return false
	}
	t.drop(s)
	return true
}

func (t *lowerTier) pin(s int32) {
	e := &t.ents[s]
	if e.ref == 0 {
		t.unlinkLRU(s)
		t.pinned++
	}
	e.ref++
}

func (t *lowerTier) unpin(s int32) {
	e := &t.ents[s]
	e.ref--
	if e.ref > 0 {
		return
	}
	if e.ref < 0 {
		panic("kvcache: lower-tier block unpinned more often than pinned")
	}
	t.pinned--
	if e.doomed {
		t.drop(s)
		return
	}
	t.pushLRU(s)
}

// pushLRU appends ready, unreferenced slot s as the most recently used.
func (t *lowerTier) pushLRU(s int32) {
	e := &t.ents[s]
	e.prev, e.next, e.inLRU = t.tail, none, true
	if t.tail == none {
		t.head = s
	} else {
		t.ents[t.tail].next = s
	}
	t.tail = s
	t.lruN++
}

func (t *lowerTier) unlinkLRU(s int32) {
	e := &t.ents[s]
	if e.prev == none {
		t.head = e.next
	} else {
		t.ents[e.prev].next = e.next
	}
	if e.next == none {
		t.tail = e.prev
	} else {
		t.ents[e.next].prev = e.prev
	}
	e.prev, e.next, e.inLRU = none, none, false
	t.lruN--
}

// lookup returns the slot of a ready block of hash h.
func (t *lowerTier) lookup(h uint64) (int32, bool) {
	s, ok := t.index[h]
	if !ok || t.ents[s].state != entReady {
		return 0, false
	}
	return s, true
}
