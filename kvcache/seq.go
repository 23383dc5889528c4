package kvcache

// A Seq is one sequence's block table: the physical blocks holding its positions,
// in order; position pos lies at offset pos%BlockSize of entry pos/BlockSize (see
// [Seq.Slot]). A Seq is used by one goroutine at a time; it takes the pool's
// lock only when it acquires, commits or releases blocks.
//
// A sequence's life:
//
//	s := pool.NewSeq(salt)
//	cached := s.Match(prompt, 1)           // reuse cached blocks; leave ≥ 1 token to compute
//	err := s.Reserve(len(prompt) - cached) // slots for the rest, or ErrNoBlocks
//	// forward pass: KV of positions cached … len(prompt)-1 goes to s.Slot(pos)
//	s.Commit(prompt)                       // written; full blocks enter the cache
//	// each decode step: s.Reserve(1), forward pass, s.Commit(tokens)
//	s.Release()                            // finished, aborted or preempted
//
// Chunked prefill reserves and commits one chunk at a time.
type Seq struct {
	pool   *Pool
	salt   uint64
	blocks []int32   // block table
	hashes []uint64  // sequence hashes of known full blocks: ≥ the committed ones
	n      int       // tokens whose KV is written
	saves  []saveJob // copies down chosen by this sequence's last operation (tier.go)
}

// NewSeq returns an empty sequence on p whose blocks hash with salt (see [Salt]).
func (p *Pool) NewSeq(salt uint64) *Seq {
	return &Seq{pool: p, salt: salt}
}

// Len returns the number of tokens whose KV is written (matched or committed).
func (s *Seq) Len() int { return s.n }

// Cap returns the number of positions the sequence's blocks hold.
func (s *Seq) Cap() int { return len(s.blocks) * s.pool.blockSize }

// Blocks returns the block table. It is valid until the next Reserve or Release
// and must not be modified.
func (s *Seq) Blocks() []int32 { return s.blocks }

// Hashes returns the sequence hashes of the sequence's committed full blocks, in
// order. It is valid until the next Commit or Release and must not be modified.
func (s *Seq) Hashes() []uint64 { return s.hashes[:s.n/s.pool.blockSize] }

// Slot returns the block and the offset in it of position pos. It panics if pos
// is outside [0, Cap()).
func (s *Seq) Slot(pos int) (block int32, offset int) {
	bs := s.pool.blockSize
	return s.blocks[pos/bs], pos % bs
}

// Match looks up the full blocks of prompt in the prefix cache and takes a
// reference on the longest cached leading run of them, leaving at least keep
// tokens of the prompt uncovered: the engine passes keep = 1 so that the last
// prompt token is computed and yields logits. It returns the number of prompt
// tokens covered (a multiple of the block size), which becomes Len; the caller
// computes the rest. It counts len(prompt) queried and the result as hit tokens
// in [Stats].
//
// Match is called once, on an empty sequence; it panics otherwise. The tokens
// later passed to Commit must begin with prompt.
func (s *Seq) Match(prompt []int32, keep int) int {
	if len(s.blocks) != 0 || s.n != 0 {
		panic("kvcache: Match on a non-empty sequence")
	}
	p := s.pool
	bs := p.blockSize
	s.hashes = HashBlocks(s.salt, prompt, bs, s.hashes[:0])
	limit := 0
	if len(prompt) > keep {
		limit = min((len(prompt)-keep)/bs, len(s.hashes))
	}
	p.mu.Lock()
	s.blocks = p.acquireRun(s.hashes[:limit], s.blocks)
	for _, id := range s.blocks {
		p.blocks[id].uses++ // a hit: the lower tiers' frequency filter counts it
	}
	s.n = len(s.blocks) * bs
	p.queries += uint64(len(prompt))
	p.hits += uint64(s.n)
	p.mu.Unlock()
	return s.n
}

// acquireRun takes a reference on the blocks of the longest cached leading run of hashes
// and appends their ids to dst. Called with p.mu held.
func (p *Pool) acquireRun(hashes []uint64, dst []int32) []int32 {
	for _, h := range hashes {
		id, ok := p.index[h]
		if !ok {
			break
		}
		p.acquire(id)
		dst = append(dst, id)
	}
	return dst
}

// Reserve makes room for n more tokens after Len, taking free blocks and, when
// there are none, evicting cached ones. Positions already reserved count, so
// Reserve is cheap when the last block has room. It returns [ErrNoBlocks],
// taking nothing, if the pool cannot provide enough blocks.
func (s *Seq) Reserve(n int) error {
	p := s.pool
	bs := p.blockSize
	need := (s.n+n+bs-1)/bs - len(s.blocks)
	if need <= 0 {
		return nil
	}
	p.mu.Lock()
	if p.available() < need {
		p.mu.Unlock()
		return ErrNoBlocks
	}
	for range need {
		s.blocks = append(s.blocks, p.take())
	}
	if len(p.pending) > 0 {
		p.emit(EventRemoved, 0)
	}
	s.endLocked()
	return nil
}

// endLocked ends an operation of s that held the pool's lock: it announces the lower
// tiers' changes, unlocks, and copies down the evicted (or committed) blocks the operation
// chose to keep in host memory, before they can be written again.
func (s *Seq) endLocked() {
	p := s.pool
	p.flushLower()
	s.saves = p.takeSaves(s.saves)
	p.mu.Unlock()
	p.runSaves(s.saves)
}

// Commit records that the KV of every token of tokens, the sequence's tokens so
// far, is written: positions Len() through len(tokens)-1 are new. Every block
// this fills enters the prefix cache under its sequence hash, unless the hash is
// cached already (another sequence computed the same prefix), in which case the
// block stays private to this sequence and is freed on release. Blocks entering
// the cache are reported in [EventStored] events.
//
// tokens must extend the tokens of earlier calls (and the prompt given to
// Match); Commit panics if len(tokens) is less than Len or more than Cap.
func (s *Seq) Commit(tokens []int32) {
	p := s.pool
	bs := p.blockSize
	if len(tokens) < s.n || len(tokens) > s.Cap() {
		panic("kvcache: Commit outside the reserved positions")
	}
	first, full := s.n/bs, len(tokens)/bs
	s.n = len(tokens)
	if first == full {
		return
	}
	for b := len(s.hashes); b < full; b++ {
		var parent uint64
		if b > 0 {
			parent = s.hashes[b-1]
		}
		s.hashes = append(s.hashes, HashBlock(s.salt, parent, tokens[b*bs:(b+1)*bs]))
	}
	p.mu.Lock()
	p.commitRun(s, first, full)
	s.endLocked()
}

// commitRun enters s's blocks first … full-1, whose hashes s knows, into the prefix cache,
// announces those that entered, and, under write-through, chooses their copies down.
// Called with p.mu held.
func (p *Pool) commitRun(s *Seq, first, full int) {
	var runParent uint64 // parent of the run of blocks being stored
	for b := first; b < full; b++ {
		var parent uint64
		up := none
		if b > 0 {
			parent, up = s.hashes[b-1], s.blocks[b-1]
		}
		if !p.commit(s.blocks[b], s.hashes[b], parent, up) {
			if len(p.pending) > 0 {
				p.emit(EventStored, runParent)
			}
			continue
		}
		if len(p.pending) == 0 {
			runParent = parent
		}
		p.pending = append(p.pending, s.hashes[b])
		if p.opts.Offload == WriteThrough && len(p.lower) > 0 {
			p.offload(s.blocks[b], s.hashes[b], parent, 1)
		}
	}
	if len(p.pending) > 0 {
		p.emit(EventStored, runParent)
	}
}

// Trim frees the blocks reserved past Len and keeps the rest: a sequence whose reservation
// turned out larger than what it will write (an import cut short) gives the excess back.
func (s *Seq) Trim() {
	keep := (s.n + s.pool.blockSize - 1) / s.pool.blockSize
	if keep >= len(s.blocks) {
		return
	}
	p := s.pool
	p.mu.Lock()
	for i := len(s.blocks) - 1; i >= keep; i-- {
		p.release(s.blocks[i])
	}
	p.mu.Unlock()
	s.blocks = s.blocks[:keep]
}

// Release drops the sequence's references to all its blocks and empties it, for
// reuse with the same salt: on completion, abort, or preemption by recompute.
// Cached blocks stay in the prefix cache until evicted (a recomputed sequence
// usually matches them again); the others become free.
func (s *Seq) Release() {
	p := s.pool
	if len(s.blocks) > 0 {
		p.mu.Lock()
		p.tick++
		for i := len(s.blocks) - 1; i >= 0; i-- {
			p.release(s.blocks[i])
		}
		p.mu.Unlock()
	}
	s.blocks = s.blocks[:0]
	s.hashes = s.hashes[:0]
	s.n = 0
}
