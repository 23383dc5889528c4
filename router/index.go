package router

import (
	"slices"

	"tandem/kvcache"
)

// WorkerID names a worker inside the router. The registry assigns it when the
// worker registers; the core only compares and orders ids (ties go to the
// lowest).
type WorkerID uint32

// Tier bits of the index. A block's tier mask has bit t set when the worker
// holds it in tier t; tiers ≥ maxTiers are not tracked.
const (
	maxTiers = 8
	devBit   = uint8(1) << kvcache.TierDevice
	hostBit  = uint8(1) << kvcache.TierHost
	usedBits = devBit | hostBit // tiers that count as cached for routing
)

// holder is one worker holding one block, in the tiers of mask.
type holder struct {
	w    WorkerID
	mask uint8
}

// workerBlocks is what the index knows of one worker.
type workerBlocks struct {
	last   uint64           // id of the last event applied (or of the snapshot)
	blocks map[uint64]uint8 // sequence hash → tier mask
}

// A Match is one worker's share of a prompt's leading blocks.
type Match struct {
	Worker WorkerID
	Device int // leading blocks held in the device tier
	Host   int // leading blocks held in the device or the host tier (≥ Device)
}

// alive is a worker whose run of leading blocks is still unbroken while
// Overlap walks a prompt; dev is where its device run ended, -1 if it has not.
type alive struct {
	w   WorkerID
	dev int
}

// An Index is the router's global view of the workers' prefix caches: for every
// block sequence hash, the workers that hold it and in which tiers. It follows
// each worker's KV event stream (docs/kv-events.md) and answers, for a prompt's
// block hashes, how many leading blocks each worker holds.
//
// An Index is not safe for concurrent use; the router serialises access to its
// State, which owns one.
type Index struct {
	holders map[uint64][]holder // hash → holders sorted by worker
	workers map[WorkerID]*workerBlocks
	scratch []alive
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{
		holders: make(map[uint64][]holder),
		workers: make(map[WorkerID]*workerBlocks),
	}
}

func (x *Index) worker(w WorkerID) *workerBlocks {
	wb := x.workers[w]
	if wb == nil {
		wb = &workerBlocks{blocks: make(map[uint64]uint8)}
		x.workers[w] = wb
	}
	return wb
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
	wb := x.worker(w)
	if ev.ID <= wb.last {
		return false
	}
	if ev.ID != wb.last+1 {
		return true
	}
	wb.last = ev.ID
	if ev.Tier >= maxTiers {
		return false
	}
	bit := uint8(1) << ev.Tier
	switch ev.Kind {
	case kvcache.EventStored:
		for _, h := range ev.Hashes {
			x.add(w, wb, h, bit)
		}
	case kvcache.EventRemoved:
		for _, h := range ev.Hashes {
			x.remove(w, wb, h, bit)
		}
	case kvcache.EventCleared:
		for h, m := range wb.blocks {
			if m&bit != 0 {
				x.setMask(w, wb, h, m&^bit)
			}
		}
	}
	return false
}

// Reset replaces everything the index holds for worker w by the snapshot
// (whose blocks are all in snap.Tier) and continues from its LastID: the next
// event applied is LastID+1.
func (x *Index) Reset(w WorkerID, snap kvcache.Snapshot) {
	wb := x.worker(w)
	x.drop(w, wb)
	wb.last = snap.LastID
	if snap.Tier >= maxTiers {
		return
	}
	bit := uint8(1) << snap.Tier
	for _, b := range snap.Blocks {
		x.add(w, wb, b.Hash, bit)
	}
}

// RemoveWorker forgets worker w: its blocks and its last event ID.
func (x *Index) RemoveWorker(w WorkerID) {
	if wb := x.workers[w]; wb != nil {
		x.drop(w, wb)
		delete(x.workers, w)
	}
}

// LastID returns the ID of the last event applied for worker w (or of the
// snapshot it was reset from), and whether the index knows w.
func (x *Index) LastID(w WorkerID) (uint64, bool) {
	wb := x.workers[w]
	if wb == nil {
		return 0, false
	}
	return wb.last, true
}

// Behind reports whether worker w has emitted events beyond those applied:
// its load report's last event ID is greater than the index's. Once the event
// stream is idle, that means an event at the end of a burst was lost and the
// caller should fetch a snapshot (docs/kv-events.md).
func (x *Index) Behind(w WorkerID, reportedLastID uint64) bool {
	last, _ := x.LastID(w)
	return reportedLastID > last
}

// Len returns the number of distinct block hashes held by any worker.
func (x *Index) Len() int { return len(x.holders) }

// Blocks returns the number of blocks worker w holds, in any tier.
func (x *Index) Blocks(w WorkerID) int {
	if wb := x.workers[w]; wb != nil {
		return len(wb.blocks)
	}
	return 0
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

// OverlapInto appends to dst[:0] one Match for every worker that holds the
// prompt's first block in the device or host tier, in no particular order, and
// returns it. Sequence hashes chain, so a worker holds a prompt's leading block
// i only if it holds hash i: the walk stops at each worker's first miss and
// ends when no worker is left, in O(blocks × workers still matching). It does
// not allocate once dst and the index's scratch have grown.
func (x *Index) OverlapInto(hashes []uint64, dst []Match) []Match {
	dst = dst[:0]
	if len(hashes) == 0 {
		return dst
	}
	al := x.scratch[:0]
	for _, h := range x.holders[hashes[0]] {
		if h.mask&usedBits == 0 {
			continue
		}
		a := alive{w: h.w, dev: -1}
		if h.mask&devBit == 0 {
			a.dev = 0
		}
		al = append(al, a)
	}
	for i := 1; i < len(hashes) && len(al) > 0; i++ {
		hs := x.holders[hashes[i]]
		n, j := 0, 0
		for _, a := range al { // both sorted by worker: one merge pass
			for j < len(hs) && hs[j].w < a.w {
				j++
			}
			var m uint8
			if j < len(hs) && hs[j].w == a.w {
				m = hs[j].mask
			}
			if m&usedBits == 0 {
				dst = append(dst, a.match(i))
				continue
			}
			if a.dev < 0 && m&devBit == 0 {
				a.dev = i
			}
			al[n] = a
			n++
		}
		al = al[:n]
	}
	for _, a := range al {
		dst = append(dst, a.match(len(hashes)))
	}
	x.scratch = al[:0]
	return dst
}

// match is the Match of a worker whose run ended before block end.
func (a alive) match(end int) Match {
	m := Match{Worker: a.w, Device: a.dev, Host: end}
	if a.dev < 0 {
		m.Device = end
	}
	return m
}

// add records that w holds h in the tier of bit.
func (x *Index) add(w WorkerID, wb *workerBlocks, h uint64, bit uint8) {
	m := wb.blocks[h]
	if m&bit == 0 {
		x.setMask(w, wb, h, m|bit)
	}
}

// remove records that w no longer holds h in the tier of bit.
func (x *Index) remove(w WorkerID, wb *workerBlocks, h uint64, bit uint8) {
	m, ok := wb.blocks[h]
	if ok && m&bit != 0 {
		x.setMask(w, wb, h, m&^bit)
	}
}

// setMask sets w's tier mask of h in both maps; mask 0 removes the entry.
func (x *Index) setMask(w WorkerID, wb *workerBlocks, h uint64, mask uint8) {
	hs := x.holders[h]
	i, found := slices.BinarySearchFunc(hs, w, func(e holder, w WorkerID) int {
		switch {
		case e.w < w:
			return -1
		case e.w > w:
			return 1
		}
		return 0
	})
	switch {
	case mask == 0:
		delete(wb.blocks, h)
		if !found {
			return
		}
		if len(hs) == 1 {
			delete(x.holders, h)
			return
		}
		x.holders[h] = slices.Delete(hs, i, i+1)
	case found:
		wb.blocks[h] = mask
		hs[i].mask = mask
	default:
		wb.blocks[h] = mask
		x.holders[h] = slices.Insert(hs, i, holder{w: w, mask: mask})
	}
}

// drop removes all of w's blocks from the holders map and empties wb.
func (x *Index) drop(w WorkerID, wb *workerBlocks) {
	for h := range wb.blocks {
		x.setMask(w, wb, h, 0)
	}
	clear(wb.blocks)
}
