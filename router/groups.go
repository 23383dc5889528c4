package router

import (
	"math"
	"math/bits"
	"slices"
)

// The grouped decision (pickGrouped): a kv decision that does not cost every worker that
// shares a prefix. docs/routing.md ("Decisions by groups") explains it; in short:
//
//   - The State keeps its candidates (healthy, not busy) in ord, sorted by their load key
//     OverlapWeight·prefill + decode, moved as reports and dispatches change it (track).
//   - The walk reports only the workers whose runs of the prompt differ from their
//     neighbours' (the specials); the slots whose device runs end at the same block, when
//     at least walkGroupMin of them do, it records as one group (a bitmap over slots), and
//     the workers that do not hold the prompt's first block are one more group, of run 0.
//   - Within a group every member's cost is OverlapWeight·(uncached + prefill) + decode
//     with the same uncached blocks, so the group's cheapest and dearest members are at the
//     ends of ord, and its idle members (key 0) all cost the same: the least and the
//     greatest cost come from the specials, a few entries of ord and one cost per group.
//   - The floating-point cost is not exactly the key plus a constant, so entries are
//     bounded with a margin (costMargin) and every candidate that can matter is costed with
//     the reference's expression; the weights are summed and drawn in worker order, as the
//     exhaustive decision does, so the draw still adds one weight per candidate within the
//     softmax's reach (a few instructions for an idle one). The pick is the same worker
//     (TestDecideMatchesExhaustive).

// noSlot marks a worker without an index slot (its index record was removed).
const noSlot = ^uint32(0)

// An ordEntry is one candidate in State.ord: a healthy worker that is not busy.
type ordEntry struct {
	key  float64 // OverlapWeight·pre + dec, as track computed it
	w    *WorkerState
	id   WorkerID
	slot uint32 // w's index slot as of State.slotEpoch
}

func (e *ordEntry) less(key float64, id WorkerID) bool {
	return e.key < key || e.key == key && e.id < id
}

// Thresholds of the grouped decision: it is taken from groupFrom workers on (a pass over a
// few dozen workers costs less than its bookkeeping), and a group of at most smallGroup
// candidates is costed member by member.
const (
	groupFrom  = 64
	smallGroup = 32
)

// costMargin bounds, relative to the cost, how far a group member's cost
// OverlapWeight·(A + pre) + dec, rounded at each step, can be from A·OverlapWeight + key
// (key = OverlapWeight·pre + dec, rounded): six roundings of 2⁻⁵³ each, with room to spare.
const costMargin = 1e-12

// A costGroup is a group of the current decision: candidates whose costs differ only by
// their load terms.
type costGroup struct {
	// OverlapWeight·max(0, blocks − run): what the group's runs leave to prefill; at a
	// positive weight, an idle member's cost exactly (the reference's
	// OverlapWeight·(a + 0) + 0, with a ≥ 0).
	wa   float64
	a    float64  // max(0, blocks − run)
	bits []uint64 // members' slots; nil: the workers that do not hold the first block
}

// groupable reports whether req can take the grouped decision.
func (s *State) groupable(req Request) bool {
	return len(s.workers) >= s.groupFrom && s.cfg.Mode == ModeKV && !s.cfg.PeerPulls &&
		req.Adapter == "" && req.KVFormat == "" && s.nStaleCands == 0 &&
		(req.Pool == PoolAny || req.Pool == PoolDecode && s.prefillers == 0)
}

// track brings the State's candidate bookkeeping up to date with w: called whenever w's
// health, staleness, busyness or load terms may have changed, and with gone when w leaves.
func (s *State) track(w *WorkerState, gone bool) {
	healthy := !gone && w.Healthy && !(w.Stale && s.cfg.RequireKVEvents)
	if healthy != w.counted {
		w.counted = healthy
		if healthy {
			s.nHealthy++
		} else {
			s.nHealthy--
		}
	}
	elig := healthy && !w.isBusy
	key := s.cfg.OverlapWeight*w.pre + w.dec
	switch {
	case elig && !w.inOrd:
		s.ordInsert(w, key)
	case !elig && w.inOrd:
		s.ordRemove(w)
	case elig && key != w.okey:
		s.ordMove(w, key)
	}
	if w.slot != noSlot && int(w.slot) < len(s.slotPre) {
		s.slotPre[w.slot], s.slotDec[w.slot] = w.pre, w.dec
		setBit(&s.idleSlots, int(w.slot), w.inOrd && w.pre == 0 && w.dec == 0)
	}
	if sc := elig && w.Stale; sc != w.staleCand {
		w.staleCand = sc
		if sc {
			s.nStaleCands++
		} else {
			s.nStaleCands--
		}
	}
}

// ordIndex is where (key, id) is in ord, or would be inserted.
func (s *State) ordIndex(key float64, id WorkerID) int { return s.ordIndexIn(s.ord, key, id) }

func (s *State) ordInsert(w *WorkerState, key float64) {
	i := s.ordIndex(key, w.ID)
	s.ord = slices.Insert(s.ord, i, ordEntry{key: key, w: w, id: w.ID, slot: w.slot})
	w.inOrd, w.okey = true, key
	s.setElig(w, true)
}

func (s *State) ordRemove(w *WorkerState) {
	i := s.ordIndex(w.okey, w.ID)
	s.ord = slices.Delete(s.ord, i, i+1)
	w.inOrd = false
	s.setElig(w, false)
}

// ordMove moves w's entry to its new key, shifting the entries in between.
func (s *State) ordMove(w *WorkerState, key float64) {
	i := s.ordIndex(w.okey, w.ID)
	e := s.ord[i]
	e.key, w.okey = key, key
	if i > 0 && !s.ord[i-1].less(key, w.ID) { // down: the entries from j to i move up one
		j := s.ordIndexIn(s.ord[:i], key, w.ID)
		copy(s.ord[j+1:i+1], s.ord[j:i])
		s.ord[j] = e
		return
	}
	j := i + 1 + s.ordIndexIn(s.ord[i+1:], key, w.ID) // up: those after i before j move down one
	copy(s.ord[i:j-1], s.ord[i+1:j])
	s.ord[j-1] = e
}

// ordIndexIn is ordIndex within part of ord.
func (s *State) ordIndexIn(part []ordEntry, key float64, id WorkerID) int {
	i, _ := slices.BinarySearchFunc(part, 0, func(e ordEntry, _ int) int {
		if e.less(key, id) {
			return -1
		}
		return 1
	})
	return i
}

// setElig records w's candidacy in the bitmaps by slot and by position.
func (s *State) setElig(w *WorkerState, on bool) {
	if w.slot == noSlot {
		if on {
			s.nSlotless++
		} else {
			s.nSlotless--
		}
	} else {
		setBit(&s.eligSlots, int(w.slot), on)
	}
	setBit(&s.eligPos, int(w.pos), on)
}

func setBit(b *[]uint64, i int, on bool) {
	for i/64 >= len(*b) {
		*b = append(*b, 0)
	}
	if on {
		(*b)[i/64] |= 1 << (i % 64)
	} else {
		(*b)[i/64] &^= 1 << (i % 64)
	}
}

// renumber sets the workers' positions in s.workers after one joined or left, and the
// candidates' bitmap by position.
func (s *State) renumber() {
	for i, w := range s.workers {
		w.pos = int32(i)
	}
	clear(s.eligPos)
	for _, e := range s.ord {
		setBit(&s.eligPos, int(e.w.pos), true)
	}
	clear(s.ownPos)
	for i, w := range s.workers {
		setBit(&s.ownPos, i, w.own)
	}
	words := (len(s.workers) + 63) / 64
	if cap(s.pickBits) < words {
		s.pickBits, s.cls0, s.cls1 = make([]uint64, words), make([]uint64, words), make([]uint64, words)
	}
	s.pickBits, s.cls0, s.cls1 = s.pickBits[:words], s.cls0[:words], s.cls1[:words]
	if cap(s.wtPos) < len(s.workers) {
		s.wtPos = make([]float64, len(s.workers)+64)
	}
	s.wtPos = s.wtPos[:len(s.workers)]
}

// syncSlots reads the workers' index slots again (they change when the index resets,
// clears or removes a worker: Index.slotEpoch) and rebuilds what depends on them. Called
// with the index's wmu held for reading.
func (s *State) syncSlots() {
	x := s.index
	s.slotEpoch, s.slotsSynced = x.slotEpoch, true
	n := len(x.owner)
	s.slotW = slices.Grow(s.slotW[:0], n)[:n]
	s.slotPre = slices.Grow(s.slotPre[:0], n)[:n]
	s.slotDec = slices.Grow(s.slotDec[:0], n)[:n]
	s.slotPos = slices.Grow(s.slotPos[:0], n)[:n]
	clear(s.slotW)
	clear(s.ownSlots)
	for _, w := range s.workers {
		w.slot = noSlot
		if r := w.ix; r != nil && !r.removed {
			w.slot = r.slot
			s.slotW[w.slot], s.slotPre[w.slot], s.slotDec[w.slot], s.slotPos[w.slot] = w, w.pre, w.dec, w.pos
			setBit(&s.ownSlots, int(w.slot), w.own)
		}
	}
	clear(s.eligSlots)
	clear(s.idleSlots)
	s.nSlotless = 0
	for i := range s.ord {
		e := &s.ord[i]
		e.slot = e.w.slot
		if e.slot == noSlot {
			s.nSlotless++
		} else {
			setBit(&s.eligSlots, int(e.slot), true)
			setBit(&s.idleSlots, int(e.slot), e.w.pre == 0 && e.w.dec == 0)
		}
	}
}

// pickGrouped is the kv decision by groups (see the top of this file). done is false when
// it cannot decide exactly by groups (a candidate without an index slot) and Decide must
// take pickAll.
func (s *State) pickGrouped(req Request, blocks float64, key uint64) (pick *WorkerState, reason string, ncands int, err error, done bool) {
	if s.nHealthy == 0 {
		return nil, "", 0, ErrNoWorkers, true
	}
	if len(s.ord) == 0 {
		return nil, "", 0, ErrAllBusy, true
	}
	x := s.index
	x.wmu.RLock()
	if !s.slotsSynced || s.slotEpoch != x.slotEpoch {
		s.syncSlots()
	}
	if s.nSlotless > 0 {
		x.wmu.RUnlock()
		return nil, "", 0, nil, false
	}
	s.walkGroups(req.Hashes, blocks)
	x.wmu.RUnlock()
	s.byGroups++

	ncands = len(s.ord)
	if w := s.affinity(req); w != nil {
		return s.settle(w), ReasonAffinity, ncands, nil, true
	}
	if ncands == 1 {
		return s.settle(s.ord[0].w), ReasonOnlyWorker, ncands, nil, true
	}

	// The least and the greatest cost: the specials', then each end of ord until no
	// group's member further in can beat them.
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range s.sp {
		c := s.sp[i].c
		if c < lo {
			lo = c
		}
		if c > hi {
			hi = c
		}
	}
	amin, amax := math.Inf(1), math.Inf(-1)
	for _, g := range s.grp {
		amin, amax = min(amin, g.wa), max(amax, g.wa)
	}
	// The idle candidates of a group all cost the same (no load: key 0): one cost per
	// group, from the bitmaps, and the scans below start past ord's idle prefix.
	idle := 0
	if s.cfg.OverlapWeight >= minIdleWeight {
		idle = s.idlePrefix()
		for g := range s.grp {
			if s.hasIdle(g) {
				lo, hi = min(lo, s.grp[g].wa), max(hi, s.grp[g].wa)
			}
		}
	}
	if len(s.grp) > 0 {
		for i := idle; i < len(s.ord); i++ {
			e := &s.ord[i]
			if (amin+e.key)*(1-costMargin) >= lo {
				break // no member further on costs less (an equal cost is the same lo)
			}
			if g := s.classify(e.slot); g >= 0 {
				if c := s.groupCost(e.slot, g); c < lo {
					lo = c
				}
			}
		}
		for i := len(s.ord) - 1; i >= idle; i-- {
			e := &s.ord[i]
			if (amax+e.key)*(1+costMargin) <= hi {
				break
			}
			if g := s.classify(e.slot); g >= 0 {
				if c := s.groupCost(e.slot, g); c > hi {
					hi = c
				}
			}
		}
	}

	if s.cfg.Temperature == 0 {
		return s.settle(s.argmin(lo, amin, key)), ReasonKV, ncands, nil, true
	}
	// With shares, the cheapest of other shares left to their routers and their weight to
	// the share's cheapest (State.draw).
	var share shareDraw
	if s.shares > 1 {
		n, own := s.countAt(lo, amin, idle)
		if own > 0 {
			share = shareDraw{own: s.ownSlots, boost: float64(n) / float64(own)}
		}
	}
	if hi <= lo {
		// Every candidate costs the same: every weight is 1 and their sum the number of
		// candidates, so the draw takes the candidate at the drawn index in worker order.
		if share.own != nil {
			return s.settle(s.drawEqualShare(share.boost)), ReasonKV, ncands, nil, true
		}
		k := int(s.rng.Float64() * float64(ncands))
		return s.settle(s.workers[nthBit(s.eligPos, min(k, ncands-1))]), ReasonKV, ncands, nil, true
	}
	return s.settle(s.drawGrouped(lo, s.span(lo, hi, blocks), amin, idle, share)), ReasonKV, ncands, nil, true
}

// A shareDraw is how a draw with shares weighs the cheapest candidates (State.draw): those
// of other shares not at all, the share's own (by slot in own) boost each. The zero value
// is a draw without shares.
type shareDraw struct {
	own   []uint64
	boost float64
}

// countAt counts the candidates that cost exactly lo, the least cost, and those of them in
// the router's share: the specials, the idle members of the groups (which cost their
// group's wa), and the loaded members from the cheap end of ord.
func (s *State) countAt(lo, amin float64, idle int) (n, own int) {
	for _, p := range s.sp {
		if p.c == lo {
			n++
			if hasBit(s.ownSlots, p.slot) {
				own++
			}
		}
	}
	if idle > 0 { // pickGrouped took the idle members by group
		for g := range s.grp {
			if s.grp[g].wa == lo {
				a, b := s.countIdle(g)
				n, own = n+a, own+b
			}
		}
	}
	if len(s.grp) > 0 {
		for i := idle; i < len(s.ord); i++ {
			e := &s.ord[i]
			if (amin+e.key)*(1-costMargin) > lo {
				break
			}
			if g := s.classify(e.slot); g >= 0 && s.groupCost(e.slot, g) == lo {
				n++
				if hasBit(s.ownSlots, e.slot) {
					own++
				}
			}
		}
	}
	return n, own
}

// countIdle counts group g's idle candidates, and those of them in the router's share.
func (s *State) countIdle(g int) (n, own int) {
	for j, idle := range s.idleSlots {
		m := s.idleIn(g, j, idle)
		n += bits.OnesCount64(m)
		own += bits.OnesCount64(m & wordAt(s.ownSlots, j))
	}
	return n, own
}

// drawEqualShare is State.draw over candidates that all cost the same, with shares: the
// share's candidates weigh boost each (the others 0), summed and drawn in worker order.
func (s *State) drawEqualShare(boost float64) *WorkerState {
	n := andCount(s.eligPos, s.ownPos, false)
	sum := 0.0
	for range n {
		sum += boost
	}
	u := s.rng.Float64() * sum
	k := 0
	for k < n-1 && !(u < boost) {
		u -= boost
		k++
	}
	return s.workers[nthBitAnd(s.eligPos, s.ownPos, k)]
}

// wordAt is word j of b, 0 past its end.
func wordAt(b []uint64, j int) uint64 {
	if j < len(b) {
		return b[j]
	}
	return 0
}

// hasBit reports whether bit i of b is set.
func hasBit(b []uint64, i uint32) bool {
	j := int(i / 64)
	return j < len(b) && b[j]&(1<<(i%64)) != 0
}

// A special is a candidate of the current decision costed on its own: one whose runs the
// walk reported, or a member of a group too small to be worth its bookkeeping.
type special struct {
	slot uint32
	c    float64
}

// walkGroups walks the prompt in groups (Walk.grouping) and sets the decision's specials
// (s.sp, costed) and groups (s.grp). Called with the index's wmu held for reading.
func (s *State) walkGroups(hashes []uint64, blocks float64) {
	x := s.index
	wk := &s.walk
	wk.sp, wk.ngroups, wk.h0 = wk.sp[:0], 0, wk.h0[:0]
	if len(hashes) > 0 {
		wk.grouping = true
		s.matches = x.walk(wk, hashes, s.matches[:0])
		wk.grouping = false
	}
	s.sp = s.sp[:0]
	for _, slot := range wk.sp {
		if s.isElig(slot) {
			s.sp = append(s.sp, special{slot, s.slotCost(slot, wk.runs[slot], blocks)})
		}
	}
	s.grp = s.grp[:0]
	for _, g := range wk.groups[:wk.ngroups] {
		n := andCount(s.eligSlots, g.bits, false)
		switch {
		case n == 0:
		case n <= smallGroup:
			s.enumerate(g.bits, false, g.run, blocks)
		default:
			a := max(0, blocks-float64(g.run))
			s.grp = append(s.grp, costGroup{wa: s.cfg.OverlapWeight * a, a: a, bits: g.bits})
		}
	}
	s.group0, s.nbits = -1, len(s.grp)
	switch n := andCount(s.eligSlots, wk.h0, true); {
	case n == 0:
	case n <= smallGroup:
		s.enumerate(wk.h0, true, 0, blocks)
	default:
		a := max(0, blocks-0)
		s.group0 = len(s.grp)
		s.grp = append(s.grp, costGroup{wa: s.cfg.OverlapWeight * a, a: a})
	}
}

// isElig reports whether slot is a candidate's.
func (s *State) isElig(slot uint32) bool {
	j := int(slot / 64)
	return j < len(s.eligSlots) && s.eligSlots[j]&(1<<(slot%64)) != 0
}

// enumerate makes the candidates among slots (or, with not, among the slots not in slots)
// specials of run run.
func (s *State) enumerate(slots []uint64, not bool, run int, blocks float64) {
	r := int32(run)
	for j, e := range s.eligSlots {
		var b uint64
		if j < len(slots) {
			b = slots[j]
		}
		if not {
			b = ^b
		}
		for b &= e; b != 0; b &= b - 1 {
			slot := uint32(j*64 + bits.TrailingZeros64(b))
			s.sp = append(s.sp, special{slot, s.slotCost(slot, [numLevels]int32{r, r, r, r}, blocks)})
		}
	}
}

// slotCost is cost(w).Total, for a request without an adapter and without peer pulls, of
// the candidate at slot whose runs are ov.
func (s *State) slotCost(slot uint32, ov [numLevels]int32, blocks float64) float64 {
	var cached float64
	if ov[0] == ov[numLevels-1] {
		cached = float64(ov[0]) // as State.cached: the device's credit is 1, the others' times 0
	} else {
		w, own := s.slotW[slot], int32(0)
		for t, r := range ov {
			cached += w.credit[t] * float64(r-own)
			own = r
		}
	}
	return s.cfg.OverlapWeight*(max(0, blocks-cached)+s.slotPre[slot]) + s.slotDec[slot]
}

// andCount counts the bits of e that are in slots (not: that are not in slots).
func andCount(e, slots []uint64, not bool) int {
	n := 0
	for j, w := range e {
		var b uint64
		if j < len(slots) {
			b = slots[j]
		}
		if not {
			b = ^b
		}
		n += bits.OnesCount64(w & b)
	}
	return n
}

// classify returns the group of the current decision that the candidate at slot belongs
// to, or -1 for a special.
func (s *State) classify(slot uint32) int {
	j, bit := int(slot/64), uint64(1)<<(slot%64)
	if h0 := s.walk.h0; j >= len(h0) || h0[j]&bit == 0 {
		return s.group0
	}
	for g := range s.grp[:s.nbits] {
		if b := s.grp[g].bits; j < len(b) && b[j]&bit != 0 {
			return g
		}
	}
	return -1
}

// groupCost is cost(w).Total for the candidate at slot, of group g: the reference's
// expression, with the group's uncached blocks.
func (s *State) groupCost(slot uint32, g int) float64 {
	return s.cfg.OverlapWeight*(s.grp[g].a+s.slotPre[slot]) + s.slotDec[slot]
}

// settle makes w's runs of the prompt readable by Decide (s.overlap): the runs of its
// group of the walk, or its own, or none when it does not hold the first block.
func (s *State) settle(w *WorkerState) *WorkerState {
	w.lacks = false
	wk := &s.walk
	j, bit := int(w.slot/64), uint64(1)<<(w.slot%64)
	if j >= len(wk.h0) || wk.h0[j]&bit == 0 {
		return w
	}
	r := wk.runs[w.slot]
	for _, g := range wk.groups[:wk.ngroups] {
		if j < len(g.bits) && g.bits[j]&bit != 0 {
			r = [numLevels]int32{int32(g.run), int32(g.run), int32(g.run), int32(g.run)}
			break
		}
	}
	w.stamp, w.ov = s.seq, [numLevels]int{int(r[0]), int(r[1]), int(r[2]), int(r[3])}
	return w
}

// argmin is the cheapest candidate at temperature 0, ties broken as tie does: every
// candidate costing exactly lo, offered in worker order.
func (s *State) argmin(lo, amin float64, key uint64) *WorkerState {
	for _, p := range s.sp {
		if p.c == lo {
			s.mark(p.slot)
		}
	}
	if len(s.grp) > 0 {
		for i := range s.ord {
			e := &s.ord[i]
			if (amin+e.key)*(1-costMargin) > lo {
				break
			}
			if g := s.classify(e.slot); g >= 0 && s.groupCost(e.slot, g) == lo {
				s.mark(e.slot)
			}
		}
	}
	var t tie
	for j, b := range s.pickBits {
		for ; b != 0; b &= b - 1 {
			w := s.workers[j*64+bits.TrailingZeros64(b)]
			t.offerLoad(s, w, lo, w.pre+w.dec, key)
		}
		s.pickBits[j] = 0
	}
	return t.best
}

// mark puts the candidate at slot in pickBits, by its position.
func (s *State) mark(slot uint32) {
	p := s.slotPos[slot]
	s.pickBits[p/64] |= 1 << (p % 64)
}

// drawGrouped is draw over the candidates whose weight is not 0 (normalised cost within
// 20·T of the cheapest): the specials, the loaded members of the groups from the cheap end
// of ord, and, with at most one bitmap group, each group's idle members (no load: key 0) at
// their group's weight, marked by position from the idle, group and candidate bitmaps
// instead of one by one. The sum and the draw add and subtract every weight in worker
// order, as draw does over every candidate: the draw's sum depends on each weight, in order.
// idle is ord's idle prefix (idlePrefix) at an overlap weight of at least minIdleWeight.
// share weighs the cheapest candidates as State.draw does with shares.
func (s *State) drawGrouped(lo, span, amin float64, idle int, share shareDraw) *WorkerState {
	wg := weigher{lo: lo, span: span, cut: 20 * s.cfg.Temperature, temp: s.cfg.Temperature,
		lastC: math.NaN(), weights: s.wtPos, marks: s.pickBits, pos: s.slotPos, share: share}
	// Beyond bound a cost's weight is 0 whatever the rounding of its normalisation.
	wg.bound = lo + wg.cut*wg.span*(1+1e-9) + lo*costMargin
	for _, p := range s.sp {
		wg.weigh(p.slot, p.c)
	}
	w := s.cfg.OverlapWeight
	classes := s.nbits <= 1 && w >= minIdleWeight
	i := 0
	if classes {
		i = idle // keys are ≥ 0, and 0 only for an idle worker at this weight
	}
	pre, dec := s.slotPre, s.slotDec
	for ; i < len(s.ord); i++ {
		e := &s.ord[i]
		if (amin+e.key)*(1-costMargin) > wg.bound {
			break
		}
		if g := s.classify(e.slot); g >= 0 {
			wg.weigh(e.slot, w*(s.grp[g].a+pre[e.slot])+dec[e.slot])
		}
	}
	// The idle candidates: of the first block's non-holders (class 0) and of the bitmap
	// group (class 1), by position, with their class's weight.
	cls0, cls1 := s.cls0, s.cls1
	w0, w1 := 0.0, 0.0
	if classes {
		h0 := s.walk.h0
		var g1 []uint64
		// A class of the cheapest, with shares: its members of the share alone (State.draw).
		var own0, own1 []uint64
		if s.group0 >= 0 {
			w0 = wg.weight(s.grp[s.group0].wa)
			if s.grp[s.group0].wa == lo {
				own0 = share.own
			}
		}
		if s.nbits == 1 {
			g1, w1 = s.grp[0].bits, wg.weight(s.grp[0].wa)
			if s.grp[0].wa == lo {
				own1 = share.own
			}
		}
		for j, idle := range s.idleSlots {
			var m0, m1 uint64
			if w0 > 0 {
				m0 = idle
				if j < len(h0) {
					m0 &^= h0[j]
				}
			}
			if w1 > 0 && j < len(g1) {
				m1 = idle & g1[j]
			}
			if own0 != nil {
				m0 &= wordAt(own0, j)
			}
			if own1 != nil {
				m1 &= wordAt(own1, j)
			}
			for ; m0 != 0; m0 &= m0 - 1 {
				p := uint32(wg.pos[j*64+bits.TrailingZeros64(m0)])
				cls0[p>>6] |= 1 << (p & 63)
			}
			for ; m1 != 0; m1 &= m1 - 1 {
				p := uint32(wg.pos[j*64+bits.TrailingZeros64(m1)])
				cls1[p>>6] |= 1 << (p & 63)
			}
		}
	}
	// Sum and draw in worker order.
	weightAt := func(j, k int, c0, c1 uint64, ws []float64) float64 {
		switch bit := uint64(1) << k; {
		case c0&bit != 0:
			return w0
		case c1&bit != 0:
			return w1
		}
		return ws[k]
	}
	marks, weights := wg.marks, wg.weights
	sum := 0.0
	for j := range marks {
		c0, c1 := cls0[j], cls1[j]
		ws := weights[j*64 : min(j*64+64, len(weights))]
		for b := marks[j] | c0 | c1; b != 0; b &= b - 1 {
			sum += weightAt(j, bits.TrailingZeros64(b), c0, c1, ws)
		}
	}
	r := s.rng.Float64() * sum
	pick, last := -1, -1
	for j := range marks {
		c0, c1 := cls0[j], cls1[j]
		ws := weights[j*64 : min(j*64+64, len(weights))]
		for b := marks[j] | c0 | c1; b != 0 && pick < 0; b &= b - 1 {
			k := bits.TrailingZeros64(b)
			if wt := weightAt(j, k, c0, c1, ws); r < wt {
				pick = j*64 + k
			} else {
				r -= wt
				last = j*64 + k
			}
		}
		marks[j], cls0[j], cls1[j] = 0, 0, 0
	}
	if pick < 0 {
		pick = last // rounding: the last one with a weight
	}
	return s.workers[pick]
}

// A weigher computes the softmax weights of one draw (as draw does: the cost above lo
// divided by span, State.span; 0 beyond cut) and marks them by position in weights and marks.
type weigher struct {
	lo, span, cut, temp, bound float64
	lastC, lastW               float64 // equal costs, equal weights: one exponential
	weights                    []float64
	marks                      []uint64
	pos                        []int32 // by slot
	share                      shareDraw
}

// weight is the weight of cost c, 0 beyond the softmax's reach; with shares, a share's
// cheapest candidate's.
func (wg *weigher) weight(c float64) float64 {
	if x := (c - wg.lo) / wg.span; x <= wg.cut {
		w := math.Exp(-x / wg.temp)
		if wg.share.own != nil && c == wg.lo {
			w *= wg.share.boost
		}
		return w
	}
	return 0
}

// weigh records the weight of the candidate at slot, whose cost is c, if it is not 0.
func (wg *weigher) weigh(slot uint32, c float64) {
	if wg.share.own != nil && c == wg.lo && !hasBit(wg.share.own, slot) {
		return // another share's cheapest: its router's
	}
	if c != wg.lastC {
		if c > wg.bound {
			return
		}
		x := (c - wg.lo) / wg.span
		if x > wg.cut {
			return
		}
		w := math.Exp(-x / wg.temp)
		if wg.share.own != nil && c == wg.lo {
			w *= wg.share.boost
		}
		wg.lastC, wg.lastW = c, w
	}
	p := uint32(wg.pos[slot])
	wg.weights[p] = wg.lastW
	wg.marks[p>>6] |= 1 << (p & 63)
}

// idlePrefix is the number of ord's first entries with key 0: the idle candidates, at an
// overlap weight of at least minIdleWeight.
func (s *State) idlePrefix() int {
	i, _ := slices.BinarySearchFunc(s.ord, 0, func(e ordEntry, _ int) int {
		if e.key <= 0 {
			return -1
		}
		return 1
	})
	return i
}

// hasIdle reports whether group g has an idle candidate.
func (s *State) hasIdle(g int) bool {
	for j, idle := range s.idleSlots {
		if s.idleIn(g, j, idle) != 0 {
			return true
		}
	}
	return false
}

// idleIn is word j of group g's idle candidates, idle being word j of idleSlots: the
// members of a bitmap group, or the workers that do not hold the first block.
func (s *State) idleIn(g, j int, idle uint64) uint64 {
	b, h0 := s.grp[g].bits, s.walk.h0
	switch {
	case b != nil && j < len(b):
		return idle & b[j]
	case b != nil:
		return 0
	case j < len(h0):
		return idle &^ h0[j]
	}
	return idle
}

// minIdleWeight: below this overlap weight a load term can round to zero, so an idle
// worker is not told by its key alone (no idle classes).
const minIdleWeight = 1e-200

// nthBitAnd is the position of the k-th (from 0) set bit of b AND c.
func nthBitAnd(b, c []uint64, k int) int {
	for j, w := range b {
		if j < len(c) {
			w &= c[j]
		} else {
			w = 0
		}
		if n := bits.OnesCount64(w); k >= n {
			k -= n
			continue
		}
		for range k {
			w &= w - 1
		}
		return j*64 + bits.TrailingZeros64(w)
	}
	return -1
}

// nthBit is the position of the k-th (from 0) set bit of b.
func nthBit(b []uint64, k int) int { return nthBitAnd(b, b, k) }
