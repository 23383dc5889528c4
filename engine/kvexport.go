package engine

// KV export and import, for disaggregated prefill and decode (docs/disaggregation.md).
//
// A prefill worker runs a request in prefill-only mode (Prefill): the scheduler computes the
// prompt's KV and the first token as usual, and at finish pins the sequence's blocks under a
// handle instead of releasing them. A decode worker later reads those blocks (ExportBlocks,
// on the prefill side) and writes them into blocks of its own pool (Import), which then enter
// its prefix cache as if computed there: its next request with that prompt finds them as
// cached tokens.
//
// None of this runs on the scheduler goroutine, and it need not: the pool is locked, a held
// or imported block is referenced by a sequence the scheduler does not know (so it is never
// evicted, reused or written by a forward pass), and a full committed block is never written
// again. Reads of a held block may overlap with the forward pass reading the same block for
// another sequence that shares the prefix; reads do not race.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"tandem/hal"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/sched"
)

// KVFormat is the engine's KV block format, as transfers describe it (kvcache.BlockFormat).
type KVFormat = kvcache.BlockFormat

// SimStore names the KV "store" of an engine whose forward pass is modelled
// (NewWithForwarder, the sim backend): it keeps no KV data.
const SimStore = kvcache.SimFormat

// ErrKVFormat is wrapped by the error of KVFormat.Check.
var ErrKVFormat = kvcache.ErrBlockFormat

// kvDTypeName is the KVFormat name of a KV store's element type, "" for one a transfer
// cannot carry.
func kvDTypeName(t hal.DType) string {
	switch t {
	case hal.F32:
		return "f32"
	case hal.F16:
		return "f16"
	}
	return ""
}

// A BlockStore is KV that a forwarder keeps outside the engine, read and written a run of
// whole blocks at a time: a pipeline replica's (package pipeline's Head), whose stages each
// hold their layers' part of every block, gathered on a read and scattered on a write. Its
// blocks' bytes are the whole model's in the store format KVFormat names.
type BlockStore interface {
	KVLayout() hal.KVLayout
	KVFormat() string
	ReadBlocks(ctx context.Context, blocks []int32, dst []byte) error
	WriteBlocks(ctx context.Context, blocks []int32, src []byte) error
}

// blockIO reads and writes whole blocks of the engine's KV, in format f: through its KV
// store's block I/O (hal.KVStore.ReadBlock, WriteBlock), or a forwarder's BlockStore; with
// neither (a modelled forward pass) it moves nothing.
type blockIO struct {
	st    hal.KVStore
	bs    BlockStore
	f     KVFormat
	batch int // blocks a read or write moves at once: 1 from a store, more from a BlockStore (each call a round trip)
}

// blockStoreBatch bounds the bytes of one BlockStore call: enough to amortise a round
// trip through the stages, little enough to stream (a transfer sends a batch's blocks
// once they are all read).
const blockStoreBatch = 4 << 20

func newBlockIO(st hal.KVStore) (*blockIO, error) {
	if st == nil {
		return nil, errors.New("engine: this engine keeps no KV data (a modelled forward pass); KV transfer needs a KV store")
	}
	f, err := kvFormatOf(st.Layout(), st.Format())
	if err != nil {
		return nil, err
	}
	return &blockIO{st: st, f: f, batch: 1}, nil
}

func newBlockStoreIO(bs BlockStore) (*blockIO, error) {
	f, err := kvFormatOf(bs.KVLayout(), bs.KVFormat())
	if err != nil {
		return nil, err
	}
	return &blockIO{bs: bs, f: f, batch: min(max(blockStoreBatch/max(f.BlockBytes(), 1), 1), 64)}, nil
}

// kvFormatOf is the transfer format of blocks of layout l in the store format name.
func kvFormatOf(l hal.KVLayout, name string) (KVFormat, error) {
	dt := kvDTypeName(l.DType)
	if dt == "" {
		return KVFormat{}, fmt.Errorf("engine: KV transfer carries f32 or f16 blocks, not the KV store's %v", l.DType)
	}
	if name == "" {
		return KVFormat{}, errors.New("engine: the KV store cannot read and write its blocks; KV transfer needs block I/O")
	}
	f := KVFormat{Store: name, DType: dt, BlockSize: l.BlockSize, Layers: l.Layers, KVHeads: l.KVHeads, HeadDim: l.HeadDim}
	if f.BlockBytes() != l.BlockBytes() {
		return KVFormat{}, fmt.Errorf("engine: the KV store's blocks are %d bytes, the format %v says %d", l.BlockBytes(), f, f.BlockBytes())
	}
	return f, nil
}

// readBlocks copies blocks' bytes, f.WireBytes() each, into dst.
func (b *blockIO) readBlocks(ctx context.Context, blocks []int32, dst []byte) error {
	switch {
	case b.bs != nil:
		if err := b.bs.ReadBlocks(ctx, blocks, dst); err != nil {
			return fmt.Errorf("engine: reading %d KV blocks: %w", len(blocks), err)
		}
	case b.st != nil:
		n := b.f.WireBytes()
		for i, blk := range blocks {
			if err := b.st.ReadBlock(int(blk), dst[i*n:(i+1)*n]); err != nil {
				return fmt.Errorf("engine: reading KV block %d: %w", blk, err)
			}
		}
	}
	return nil // modelled: no payload
}

// writeBlocks stores src, f.WireBytes() a block, as blocks.
func (b *blockIO) writeBlocks(ctx context.Context, blocks []int32, src []byte) error {
	switch {
	case b.bs != nil:
		if err := b.bs.WriteBlocks(ctx, blocks, src); err != nil {
			return fmt.Errorf("engine: writing %d KV blocks: %w", len(blocks), err)
		}
	case b.st != nil:
		n := b.f.WireBytes()
		for i, blk := range blocks {
			if err := b.st.WriteBlock(int(blk), src[i*n:(i+1)*n]); err != nil {
				return fmt.Errorf("engine: writing KV block %d: %w", blk, err)
			}
		}
	}
	return nil
}

// ErrKVLost is wrapped by the error of a transfer that read or wrote blocks across a Reset:
// the KV it moved is gone with a restarted pipeline stage.
var ErrKVLost = errors.New("engine: the replica's KV was reset (a pipeline stage restarted) during the transfer")

// lostKV drops every block whose KV a restarted stage lost: the prefix cache, and the
// holds of prefill-only sequences (their exports fail). Transfers begun before it fail
// their next check (kvValid). Called by Run's goroutine (Reset).
func (e *Engine) lostKV() {
	e.lost.Lock()
	defer e.lost.Unlock()
	e.epoch++
	e.pool.Clear()
	t := &e.held
	t.mu.Lock()
	var hs []uint64
	for h := range t.m {
		hs = append(hs, h)
	}
	t.mu.Unlock()
	for _, h := range hs {
		e.ReleaseHeld(h)
	}
}

// kvValid fails with ErrKVLost if the KV was reset since epoch.
func (e *Engine) kvValid(epoch uint64) error {
	e.lost.RLock()
	defer e.lost.RUnlock()
	if e.epoch != epoch {
		return ErrKVLost
	}
	return nil
}

// readEach reads blocks, a batch at a time into *buf (grown as needed), and calls fn with
// each one's index in blocks and its bytes (valid during the call). It fails, before fn
// sees them, if the KV was reset since epoch.
func (e *Engine) readEach(ctx context.Context, io *blockIO, epoch uint64, blocks []int32, buf *[]byte, fn func(k int, data []byte) error) error {
	wb := io.f.WireBytes()
	for k := 0; k < len(blocks); k += io.batch {
		n := min(io.batch, len(blocks)-k)
		if cap(*buf) < n*wb {
			*buf = make([]byte, io.batch*wb)
		}
		b := (*buf)[:n*wb]
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := io.readBlocks(ctx, blocks[k:k+n], b); err != nil {
			return err
		}
		if err := e.kvValid(epoch); err != nil {
			return err
		}
		for j := range n {
			if err := fn(k+j, b[j*wb:(j+1)*wb]); err != nil {
				return err
			}
		}
	}
	return nil
}

// heldTable holds the blocks of finished prefill-only sequences, by handle.
type heldTable struct {
	mu      sync.Mutex
	next    uint64
	m       map[uint64]*heldKV
	expired atomic.Int64

	ioOnce sync.Once
	io     *blockIO
	ioErr  error

	// changed wakes the exports waiting for blocks: when a step commits full blocks,
	// an import commits some, or a hold is pinned, released or ended.
	changed broadcast
}

type heldKV struct {
	ttl      time.Duration
	prompt   []uint64     // sequence hashes of every full prompt block, known from the start
	seq      *kvcache.Seq // nil until the sequence finished
	hashes   []uint64     // sequence hashes of the prompt's full blocks
	blocks   []int32      // their blocks
	users    int          // exports in progress
	released bool
	ended    bool // the sequence ended without pinning its blocks: no more will come
	timer    *time.Timer
}

// broadcast wakes every goroutine waiting for a change. A waiter takes wait's channel
// before it looks at the state, and waits on it if it must: notify closes the channel, so
// a change made after the look wakes it and none is missed. The channel is made only when
// someone waits, so notify on the scheduler's path costs a lock and a nil check.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel that the next notify closes.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
	b.mu.Unlock()
}

// committed wakes the exports waiting for blocks if the step's commits completed any.
// Called by Run's goroutine.
func (e *Engine) committed() { e.committedChunks(e.plan.Chunks) }

// committedChunks is committed for a step of chunks.
func (e *Engine) committedChunks(chunks []sched.Chunk[*sequence]) {
	bs := e.cfg.BlockSize
	for _, c := range chunks {
		if (c.From+c.N)/bs > c.From/bs {
			e.held.changed.notify()
			return
		}
	}
}

// holdEnded tells the exports of the prefill-only sequence under handle h that it ended
// (aborted, dropped, or closed at its finish) without pinning its blocks: the blocks not
// computed yet will not be. If its caller is gone (abandoned), the handle is forgotten
// here: nothing is held under it, and a caller that never calls StartPrefill's wait would
// otherwise leave it in the table for good. Called by Run's goroutine.
func (e *Engine) holdEnded(h uint64, abandoned bool) {
	t := &e.held
	t.mu.Lock()
	x := t.m[h]
	ended := x != nil && x.seq == nil && !x.ended
	if ended {
		x.ended = true
		if abandoned {
			delete(t.m, h)
		}
	}
	t.mu.Unlock()
	if ended {
		t.changed.notify()
	}
}

func (e *Engine) blockIO() (*blockIO, error) {
	t := &e.held
	t.ioOnce.Do(func() {
		if e.kv == nil { // NewWithForwarder: no KV memory (see simBlockIO)
			t.io = e.simBlockIO()
			return
		}
		t.io, t.ioErr = newBlockIO(e.kv)
	})
	return t.io, t.ioErr
}

// KVFormat returns the format of the engine's KV blocks, or an error if its KV store cannot
// be read and written block by block.
func (e *Engine) KVFormat() (KVFormat, error) {
	b, err := e.blockIO()
	if err != nil {
		return KVFormat{}, err
	}
	return b.f, nil
}

// ErrNotHeld: no held blocks under that handle (never held, released, or expired).
var ErrNotHeld = errors.New("engine: no KV blocks held under that handle (released or expired)")

// PrefillResult is the outcome of a prefill-only request.
type PrefillResult struct {
	// Handle names the held blocks until ReleaseHeld or the hold's expiry.
	Handle uint64
	// First is the first generated token, as a Generate stream would have sent it; its
	// Finish is "length" (the prefill-only cap) unless a stop rule ended the request first.
	First llm.Event
	// Hashes are the sequence hashes of the prompt's full blocks, all held; nil when nothing
	// is held any more (released before the prefill finished).
	Hashes []uint64
}

// Prefill runs req in prefill-only mode: the prompt's KV is computed (reusing the prefix
// cache), the first token sampled, and the prompt's blocks kept (pinned) under the returned
// handle for a KV transfer, until ReleaseHeld or ttl passes. If ctx ends first, the
// sequence is freed and nothing is held.
func (e *Engine) Prefill(ctx context.Context, req *llm.Request, ttl time.Duration) (*PrefillResult, error) {
	_, wait, err := e.StartPrefill(ctx, req, ttl)
	if err != nil {
		return nil, err
	}
	return wait()
}

// StartPrefill queues req as Prefill does and returns its handle at once, before the
// prefill runs: ExportBlocks under it streams the prompt's blocks as they are computed.
// wait returns Prefill's result; a caller whose ctx is cancelled may skip it (the handle
// is forgotten when the sequence ends).
func (e *Engine) StartPrefill(ctx context.Context, req *llm.Request, ttl time.Duration) (h uint64, wait func() (*PrefillResult, error), err error) {
	if ttl <= 0 {
		return 0, nil, fmt.Errorf("%w: a prefill hold needs a positive timeout", llm.ErrInvalid)
	}
	r := *req
	r.MaxTokens = 1
	t := &e.held
	t.mu.Lock()
	if t.m == nil {
		t.m = map[uint64]*heldKV{}
	}
	t.next++
	h = t.next
	t.m[h] = &heldKV{ttl: ttl, prompt: kvcache.HashBlocks(e.cfg.Salt, req.Prompt, e.cfg.BlockSize, nil)}
	t.mu.Unlock()
	st, err := e.submit(ctx, &r, h)
	if err != nil {
		e.ReleaseHeld(h)
		return 0, nil, err
	}
	return h, func() (*PrefillResult, error) { return e.finishPrefill(ctx, h, st) }, nil
}

func (e *Engine) finishPrefill(ctx context.Context, h uint64, st *stream) (*PrefillResult, error) {
	t := &e.held
	ev, err := st.Next(ctx)
	if err != nil {
		// Closing first makes a finish racing with this release free the blocks itself.
		st.Close()
		e.ReleaseHeld(h)
		return nil, err
	}
	st.Close()
	t.mu.Lock()
	x := t.m[h]
	ok := x != nil && x.seq != nil
	var hashes []uint64
	if ok {
		hashes = x.hashes
	}
	t.mu.Unlock()
	if !ok {
		// Released already (a consumer that got every block early), or closed at the finish:
		// the first token stands; nothing is held.
		e.ReleaseHeld(h)
		return &PrefillResult{Handle: h, First: ev}, nil
	}
	return &PrefillResult{Handle: h, First: ev, Hashes: hashes}, nil
}

// finishKV frees a finished sequence's blocks, or pins them if it is a prefill-only one
// whose caller still waits. Called by Run's goroutine.
func (e *Engine) finishKV(s *sequence) {
	if s.hold == 0 {
		s.KV.Release()
		return
	}
	t := &e.held
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.m[s.hold]
	if x == nil || x.seq != nil || s.stream.abandoned() {
		s.KV.Release()
		return
	}
	x.seq = s.KV
	x.hashes = slices.Clone(s.KV.Hashes())
	x.blocks = slices.Clone(s.KV.Blocks()[:len(x.hashes)])
	h := s.hold
	x.timer = time.AfterFunc(x.ttl, func() {
		if e.ReleaseHeld(h) {
			t.expired.Add(1)
			e.log.Warn("held KV blocks expired unclaimed", "handle", h, "blocks", len(x.hashes))
		}
	})
	s.KV = e.pool.NewSeq(e.cfg.Salt) // the sequence is done; it must not release the held blocks
	t.changed.notify()
}

// ReleaseHeld frees the blocks held under handle h (at once, or when the exports in
// progress end). It reports whether h was held.
func (e *Engine) ReleaseHeld(h uint64) bool {
	t := &e.held
	t.mu.Lock()
	x := t.m[h]
	if x == nil {
		t.mu.Unlock()
		return false
	}
	delete(t.m, h)
	x.released = true
	if x.timer != nil {
		x.timer.Stop()
	}
	var seq *kvcache.Seq
	if x.users == 0 { // else the last export releases it
		seq, x.seq = x.seq, nil
	}
	t.mu.Unlock()
	t.changed.notify()
	if seq != nil {
		seq.Release()
		e.signal() // freed blocks may let a waiting sequence in
	}
	return true
}

// HeldStats returns the number of handles holding blocks now and the number that expired
// unclaimed since start.
func (e *Engine) HeldStats() (held int, expired int64) {
	t := &e.held
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m), t.expired.Load()
}

// ExportBlocks calls fn, in the order of want, with each wanted block of the prompt under
// h: its index in the prompt, its sequence hash and its bytes in the engine's KVFormat
// (valid only during the call). While the prefill runs, blocks go out as they are computed
// (entering the prefix cache, chunk by chunk) and ExportBlocks waits for the rest; after
// it, from the held blocks. It fails if a wanted hash is not the prompt's, if the prefill
// fails or the hold is released before the blocks were sent (ErrNotHeld), or when fn or ctx
// ends. The blocks being read stay referenced, even if ReleaseHeld is called meanwhile.
// Waiting, it wakes when a step commits blocks (or the hold changes), not on a timer.
func (e *Engine) ExportBlocks(ctx context.Context, h uint64, want []uint64, fn func(index int, hash uint64, data []byte) error) error {
	io, err := e.blockIO()
	if err != nil {
		return err
	}
	t := &e.held
	e.lost.RLock() // a Reset after this fails the reads (the hold is gone before it)
	epoch := e.epoch
	t.mu.Lock()
	x := t.m[h]
	var prompt []uint64
	if x != nil {
		prompt = x.prompt
	}
	t.mu.Unlock()
	e.lost.RUnlock()
	if x == nil {
		return ErrNotHeld
	}
	idx := make(map[uint64]int, len(prompt))
	for i, hh := range prompt {
		idx[hh] = i
	}
	for _, hh := range want {
		if _, ok := idx[hh]; !ok {
			return fmt.Errorf("engine: block %#016x is not among the %d of the prompt held under handle %d", hh, len(prompt), h)
		}
	}
	var (
		buf  []byte
		ids  []int32
		sent int
	)
	// send reads blocks, the next wanted ones, and sends them.
	send := func(blocks []int32) error {
		base := sent
		return e.readEach(ctx, io, epoch, blocks, &buf, func(k int, data []byte) error {
			hh := want[base+k]
			if err := fn(idx[hh], hh, data); err != nil {
				return err
			}
			sent++
			return nil
		})
	}
	// While the prefill runs: pin the computed leading blocks through the prefix cache, send
	// the wanted ones among them, and wait for more.
	pin := e.pool.NewSeq(e.cfg.Salt) // empty between rounds
	for {
		changed := t.changed.wait() // before looking: what changes after the look closes it
		t.mu.Lock()
		if t.m[h] != x || x.released {
			t.mu.Unlock()
			return ErrNotHeld
		}
		done, ended := x.seq != nil, x.ended
		t.mu.Unlock()
		if done {
			break
		}
		e.lost.RLock()
		n := 0
		if e.epoch == epoch {
			n = pin.MatchHashes(prompt) / e.cfg.BlockSize
		}
		e.lost.RUnlock()
		ids = ids[:0]
		for j := sent; j < len(want) && idx[want[j]] < n; j++ {
			ids = append(ids, pin.Blocks()[idx[want[j]]])
		}
		err := send(ids)
		pin.Release()
		if err != nil {
			return err
		}
		if sent == len(want) {
			return nil
		}
		if ended {
			return fmt.Errorf("%w: the prefill under handle %d ended before computing block %d", ErrNotHeld, h, idx[want[sent]])
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t.mu.Lock()
	if t.m[h] != x || x.seq == nil {
		t.mu.Unlock()
		return ErrNotHeld
	}
	x.users++
	hashes, blocks := x.hashes, x.blocks
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		x.users--
		var seq *kvcache.Seq
		if x.released && x.users == 0 {
			seq, x.seq = x.seq, nil
		}
		t.mu.Unlock()
		if seq != nil {
			seq.Release()
		}
	}()
	ids = ids[:0]
	for _, hh := range want[sent:] {
		i := idx[hh]
		if i >= len(hashes) || hashes[i] != hh {
			return fmt.Errorf("engine: block %#016x is not among the %d held under handle %d", hh, len(hashes), h)
		}
		ids = append(ids, blocks[i])
	}
	return send(ids)
}

// An Import writes blocks received from another engine into this engine's pool. Begin one
// with BeginImport, Write the missing blocks in order, then Commit; keep it until the
// request that needs the blocks has been admitted (its prefix match took them), then
// Release. Blocks written and committed stay in the prefix cache after Release, like
// computed ones; reserved but unwritten ones are freed. Into a BlockStore (a pipeline's
// stages) Write buffers a batch of blocks and writes it in one call; Flush (and Commit)
// write what is buffered.
type Import struct {
	e         *Engine
	io        *blockIO
	ctx       context.Context // bounds a BlockStore's writes
	epoch     uint64          // the KV's at BeginImport (kvValid)
	seq       *kvcache.Seq
	tokens    []int32  // the prompt's full blocks
	hashes    []uint64 // their sequence hashes
	have      int      // leading blocks the cache had already
	next      int      // next block to write
	written   int      // blocks before it stored (next less those buffered)
	committed int
	released  bool
	err       error   // a write failed: the import takes no more
	pend      []int32 // blocks buffered for a BlockStore's batch, and their bytes
	buf       []byte
}

// BeginImport prepares the import of the full blocks of prompt: it takes the leading blocks
// the prefix cache already holds and reserves blocks for the rest. Missing lists what to
// fetch.
func (e *Engine) BeginImport(prompt []int32) (*Import, error) {
	io, err := e.blockIO()
	if err != nil {
		return nil, err
	}
	bs := e.cfg.BlockSize
	n := len(prompt) / bs
	tokens := prompt[:n*bs]
	seq := e.pool.NewSeq(e.cfg.Salt)
	e.lost.RLock() // the blocks matched are the epoch's: a Reset after it fails the import
	epoch := e.epoch
	have := seq.Match(tokens, 0) / bs
	e.lost.RUnlock()
	if err := seq.Reserve((n - have) * bs); err != nil {
		seq.Release()
		return nil, fmt.Errorf("engine: no room for %d imported KV blocks: %w", n-have, err)
	}
	return &Import{e: e, io: io, ctx: context.Background(), epoch: epoch, seq: seq, tokens: tokens,
		hashes: kvcache.HashBlocks(e.cfg.Salt, tokens, bs, nil), have: have, next: have, written: have}, nil
}

// UseContext bounds the import's writes into a BlockStore by ctx (a pull's deadline).
func (im *Import) UseContext(ctx context.Context) { im.ctx = ctx }

// Have is the number of leading full blocks of the prompt that were cached already.
func (im *Import) Have() int { return im.have }

// Missing returns the sequence hashes of the blocks to fetch, in prompt order.
func (im *Import) Missing() []uint64 { return im.hashes[im.have:] }

// Written is the number of blocks stored so far (not those Write buffered and Flush has not
// stored yet).
func (im *Import) Written() int { return im.written - im.have }

// Write stores the next missing block: hash must be the prompt's hash at that position (the
// sender's block belongs to another prompt or salt otherwise) and data one block in the
// engine's KVFormat (empty for a modelled one: its WireBytes). Into a BlockStore it buffers
// the block (a copy) and stores a full batch.
func (im *Import) Write(hash uint64, data []byte) error {
	switch {
	case im.released:
		return errors.New("engine: write to a released import")
	case im.err != nil:
		return fmt.Errorf("engine: an earlier write of the import failed: %w", im.err)
	case im.next >= len(im.hashes):
		return fmt.Errorf("engine: import of %d blocks is complete; got another", len(im.hashes)-im.have)
	}
	if want := im.hashes[im.next]; hash != want {
		return fmt.Errorf("engine: imported block %d has hash %#016x, this prompt's is %#016x", im.next, hash, want)
	}
	if len(data) != im.io.f.WireBytes() {
		return fmt.Errorf("engine: imported block of %d bytes, the format's is %d", len(data), im.io.f.WireBytes())
	}
	blk, _ := im.seq.Slot(im.next * im.e.cfg.BlockSize)
	im.pend = append(im.pend, blk)
	if im.io.batch == 1 {
		im.next++
		return im.store(data) // data as it is: no copy
	}
	im.buf = append(im.buf, data...)
	im.next++
	if len(im.pend) < im.io.batch {
		return nil
	}
	return im.Flush()
}

// Flush stores the blocks Write buffered. On failure they are dropped, and the import
// takes no more writes.
func (im *Import) Flush() error {
	if len(im.pend) == 0 || im.released {
		return im.err
	}
	return im.store(im.buf)
}

// store writes the pending blocks from data.
func (im *Import) store(data []byte) error {
	err := im.io.writeBlocks(im.ctx, im.pend, data)
	if err == nil {
		err = im.e.kvValid(im.epoch)
	}
	im.pend, im.buf = im.pend[:0], im.buf[:0]
	if err != nil {
		im.next, im.err = im.written, err
		return err
	}
	im.written = im.next
	return nil
}

// Commit stores what Write buffered, enters the blocks stored so far into the prefix cache
// and returns how many are new since the last Commit. After a Reset of the KV (a pipeline
// stage restarted) it enters none: what they held is gone.
func (im *Import) Commit() int {
	im.Flush() // a failure is kept in im.err: the blocks stored before it still count
	n := im.written - im.have - im.committed
	if im.released || n == 0 {
		return 0
	}
	e := im.e
	e.lost.RLock()
	ok := e.epoch == im.epoch
	if ok {
		im.seq.Commit(im.tokens[:im.written*e.cfg.BlockSize])
	}
	e.lost.RUnlock()
	if !ok {
		im.err = ErrKVLost
		return 0
	}
	im.committed += n
	e.held.changed.notify() // the blocks may be what an export of the same prompt waits for
	return n
}

// Trim frees the blocks reserved for writes that will not come (a pull cut short), keeping
// the committed ones referenced until Release.
func (im *Import) Trim() {
	if !im.released {
		im.Commit()
		im.seq.Trim()
	}
}

// Release drops the import's references: committed blocks stay cached (evictable), the
// rest are freed. It is idempotent.
func (im *Import) Release() {
	if im.released {
		return
	}
	im.released = true
	im.seq.Release()
}
