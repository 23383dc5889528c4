package kvcache

// Onboarding: a sequence whose prompt continues, past what the device holds, into blocks
// that lower tiers hold loads them instead of computing them (docs/kv-tiers.md).
//
//	cached := s.Match(prompt, 1)
//	loads := s.MatchLower(prompt, 1, 1, loads[:0]) // pins them, reserves device blocks
//	// copy each load's block into the device, checking it, off the scheduler's goroutine
//	s.OnboardDone(loads, ok, bad)                  // the first ok are written: Len grows

// MatchLower continues Match into the lower tiers: it finds the longest run of the
// prompt's next full blocks that lower tiers hold, ready (each from the fastest tier that
// has it), leaving keep tokens of the prompt uncovered as Match does; if the run has at
// least minBlocks blocks it pins them in their tiers, reserves a device block for each,
// and appends their Loads to dst. Len stays Match's until OnboardDone. It returns dst
// unchanged when there is no such run, or no room on the device for it.
//
// It is called once, after Match and before any Reserve.
func (s *Seq) MatchLower(prompt []int32, keep, minBlocks int, dst []Load) []Load {
	p := s.pool
	if len(p.lower) == 0 {
		return dst
	}
	bs := p.blockSize
	m := len(s.blocks)
	if m*bs != s.n {
		panic("kvcache: MatchLower after a reservation")
	}
	limit := 0
	if len(prompt) > keep {
		limit = min((len(prompt)-keep)/bs, len(s.hashes))
	}
	if limit-m < max(minBlocks, 1) {
		return dst
	}
	start := len(dst)
	p.mu.Lock()
	for i := m; i < limit; i++ {
		h := s.hashes[i]
		found := false
		var bypassed *lowerTier
		for _, t := range p.lower {
			if t.skipLoad {
				if _, ok := t.lookup(h); ok && bypassed == nil {
					bypassed = t
				}
				continue
			}
			if slot, ok := t.lookup(h); ok {
				dst = append(dst, Load{From: Loc{t.cfg.Tier, slot}, Hash: h})
				found = true
				break
			}
		}
		if !found {
			if bypassed != nil {
				bypassed.bypassed++ // counted once per match: the run stops here
			}
			break
		}
	}
	k := len(dst) - start
	if k < max(minBlocks, 1) || p.available() < k {
		p.mu.Unlock()
		return dst[:start]
	}
	for i := start; i < len(dst); i++ {
		p.byTier[dst[i].From.Tier].pin(dst[i].From.Slot)
	}
	for i := start; i < len(dst); i++ {
		id := p.take()
		s.blocks = append(s.blocks, id)
		dst[i].Block = id
	}
	if len(p.pending) > 0 {
		p.emit(EventRemoved, 0)
	}
	s.endLocked()
	return dst
}

// OnboardDone reports the loads of MatchLower: the first ok were copied and checked, and
// enter the prefix cache as if computed here (Len grows by them; they are announced on the
// device tier). If bad, load ok failed because its lower-tier block is unreadable or
// wrong, and that block is dropped from its tier (counted in TierStats.Bad); the loads
// after it were not tried. The blocks reserved for the loads not done stay reserved, for
// the sequence to compute. Every load's lower-tier block is unpinned.
func (s *Seq) OnboardDone(loads []Load, ok int, bad bool) {
	p := s.pool
	bs := p.blockSize
	first := s.n / bs
	if ok < 0 || ok > len(loads) || first+len(loads) > len(s.blocks) {
		panic("kvcache: OnboardDone of loads this sequence did not make")
	}
	p.mu.Lock()
	for i, l := range loads {
		t := p.byTier[l.From.Tier]
		e := &t.ents[l.From.Slot]
		if e.hash != l.Hash || e.state != entReady {
			panic("kvcache: OnboardDone of a block that is not pinned")
		}
		switch {
		case i < ok:
			e.uses++
			t.onboarded++
			p.blocks[l.Block].uses = e.uses // carried into the device copy, committed below
			if !t.async {
				p.queueDown(t, l.From.Slot) // used once more: perhaps enough for disk now
			}
			t.unpin(l.From.Slot)
		case i == ok && bad:
			t.unpin(l.From.Slot)
			if e.state == entReady && e.ref == 0 {
				t.drop(l.From.Slot)
			}
			t.bad++
		default:
			t.unpin(l.From.Slot)
		}
	}
	if ok > 0 {
		full := first + ok
		p.commitRun(s, first, full)
		s.n = full * bs
		p.loaded += uint64(ok * bs)
	}
	s.endLocked()
}

// PinLower pins the leading run of hashes that the lower tiers hold, ready (each from
// the fastest tier that has it), and appends their Loads (Block -1: no device block) to
// dst: a KV export reads them for a peer. Release them with UnpinLower.
func (p *Pool) PinLower(hashes []uint64, dst []Load) []Load {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range hashes {
		found := false
		for _, t := range p.lower {
			if slot, ok := t.lookup(h); ok {
				t.pin(slot)
				dst = append(dst, Load{Block: -1, From: Loc{t.cfg.Tier, slot}, Hash: h})
				found = true
				break
			}
		}
		if !found {
			break
		}
	}
	return dst
}

// UnpinLower releases what PinLower pinned. If bad, loads[bad] was found unreadable or
// wrong and is dropped from its tier (a negative bad drops nothing).
func (p *Pool) UnpinLower(loads []Load, bad int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range loads {
		t := p.byTier[l.From.Tier]
		e := &t.ents[l.From.Slot]
		t.unpin(l.From.Slot)
		if i == bad && e.state == entReady && e.ref == 0 {
			t.drop(l.From.Slot)
			t.bad++
		}
	}
	p.flushLower()
}
