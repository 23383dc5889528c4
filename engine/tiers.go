package engine

// The KV cache's lower tiers on the engine's side (docs/kv-tiers.md): the Saver that copies
// device blocks into host memory as they leave the device (or are committed), the loaders
// that onboard the blocks a sequence's prompt finds in lower tiers (off the scheduler's
// goroutine, while the batch runs on), and the measured costs the load report carries.
//
// Safety against the forward pass: a block being saved is one the pool has just evicted
// into a reservation (or committed, under write-through) and nothing writes before the
// reservation returns; a block being loaded into is reserved by an onboarding sequence,
// which is in no plan until its loads are reported. So neither races with a step.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tandem/hal"
	"tandem/kvcache"
	"tandem/kvtier"
	"tandem/metrics"
)

// tierSaver copies device blocks into the host tier's arena.
type tierSaver struct {
	st   hal.KVStore
	host *kvtier.Host
}

func (s tierSaver) Save(block int32, to kvcache.Loc, hash uint64) error {
	if err := s.st.ReadBlock(int(block), s.host.Slot(to.Slot)); err != nil {
		return fmt.Errorf("engine: saving KV block %d to host slot %d: %w", block, to.Slot, err)
	}
	s.host.Seal(to.Slot, hash)
	return nil
}

// newTieredPool opens cfg's lower tiers for blocks of the store st and returns the pool
// over them (with the blocks the disk tier found at start entered and announced).
func newTieredPool(cfg Config, st hal.KVStore) (*kvcache.Pool, *kvtier.Tiers, error) {
	io, err := newBlockIO(st)
	if err != nil {
		return nil, nil, fmt.Errorf("engine: KV tiers: %w", err)
	}
	id := kvtier.Identity{Salt: cfg.Salt, Model: cfg.ModelID, Format: io.f}
	tiers, err := kvtier.Open(cfg.Tiers, id, cfg.Logger)
	if err != nil {
		return nil, nil, err
	}
	pool, err := kvcache.NewPoolWith(cfg.KVBlocks, cfg.BlockSize, tiers.Options(tierSaver{st, tiers.Host}))
	if err != nil {
		tiers.Close()
		return nil, nil, err
	}
	tiers.Attach(pool)
	return pool, tiers, nil
}

// Tiers is the engine's lower tiers' stores (nil without lower tiers).
func (e *Engine) Tiers() *kvtier.Tiers { return e.tiers }

// onboard is the engine's onboarding machinery: a queue of sequences whose loads to run,
// the loaders' results for Run, and the measured costs.
type onboard struct {
	queue chan *sequence
	wg    sync.WaitGroup

	mu   sync.Mutex
	done []loadResult

	inflight int // owned by Run: sequences handed to loaders, not yet reported

	costs costMeter
	// Owned by Run (refreshLoadable): tiers kept out of onboarding, since when, and when
	// the costs were last looked at.
	skip      [4]bool
	skipSince [4]time.Time
	checked   time.Time
}

type loadResult struct {
	s       *sequence
	ok      int
	bad     bool
	elapsed time.Duration
}

// startLoaders starts n loaders; they end when ctx does (after the load in hand).
func (e *Engine) startLoaders(ctx context.Context, n int) {
	o := &e.onboard
	for range n {
		o.wg.Go(func() {
			bufs := make([][]byte, loadStripes)
			for i := range bufs {
				bufs[i] = e.tiers.NewBuffer()
			}
			for {
				select {
				case s := <-o.queue:
					t0 := time.Now()
					ok, bad := e.load(ctx, s, bufs)
					elapsed := time.Since(t0)
					if ok > 0 {
						e.onboard.costs.observeLoad(slowestTier(s.Loads()[:ok]), elapsed/time.Duration(ok))
					}
					o.mu.Lock()
					o.done = append(o.done, loadResult{s: s, ok: ok, bad: bad, elapsed: elapsed})
					o.mu.Unlock()
					e.signal()
				case <-ctx.Done():
					return
				}
			}
		})
	}
}

// loadStripes is how many reads one sequence's onboarding keeps in flight: a disk's
// throughput needs several (one block file is one read), and a sequence of a few hundred
// blocks loaded one after another would wait for each read in turn.
const loadStripes = 4

// minStripe is the fewest blocks worth a stripe of their own (a goroutine costs far less
// than reading one block, even from host memory).
const minStripe = 2

// slowestTier is the lowest tier that loads read from: what a sequence's load time per
// block is counted against (the router credits each tier by its measured cost).
func slowestTier(loads []kvcache.Load) kvcache.Tier {
	t := kvcache.TierHost
	for _, l := range loads {
		t = max(t, l.From.Tier)
	}
	return t
}

// load copies s's loads into the device, checking each block (kvtier.Tiers.Read checks
// hash, model, format and CRC), on up to len(bufs) goroutines, each taking every k-th
// block so that the leading blocks arrive first. It reports how many leading blocks are
// in (ok) and whether the block after them failed its checks (bad: it is dropped from its
// tier, and the sequence computes from there); a block the device refuses, or ctx ending,
// ends the run there too. Blocks past the first failure that were copied anyway are in
// the sequence's own reserved blocks and are computed over.
func (e *Engine) load(ctx context.Context, s *sequence, bufs [][]byte) (ok int, bad bool) {
	loads := s.Loads()
	k := max(1, min(len(bufs), len(loads)/minStripe))
	if k == 1 {
		return e.loadStripe(ctx, loads, 0, 1, bufs[0], nil)
	}
	var limit atomic.Int64 // the first failure so far: no stripe reads past it
	limit.Store(int64(len(loads)))
	fails := make([]struct {
		at  int
		bad bool
	}, k)
	var wg sync.WaitGroup
	for j := range k {
		wg.Go(func() {
			fails[j].at, fails[j].bad = e.loadStripe(ctx, loads, j, k, bufs[j], &limit)
		})
	}
	wg.Wait()
	ok = len(loads)
	for _, f := range fails {
		if f.at < ok {
			ok, bad = f.at, f.bad
		}
	}
	return ok, bad
}

// loadStripe loads blocks first, first+step, … of loads and returns the index of the
// first that failed (len(loads) if none) and whether it failed its checks. With limit, it
// stops at the lowest failure of any stripe and lowers limit at its own.
func (e *Engine) loadStripe(ctx context.Context, loads []kvcache.Load, first, step int, buf []byte, limit *atomic.Int64) (int, bool) {
	fail := func(i int, bad bool) (int, bool) {
		if limit != nil {
			for {
				cur := limit.Load()
				if int64(i) >= cur || limit.CompareAndSwap(cur, int64(i)) {
					break
				}
			}
		}
		return i, bad
	}
	for i := first; i < len(loads); i += step {
		if limit != nil && int64(i) >= limit.Load() {
			return len(loads), false // another stripe failed before i: its failure counts
		}
		if ctx.Err() != nil {
			return fail(i, false)
		}
		l := loads[i]
		b, err := e.tiers.Read(l, buf)
		if err != nil {
			return fail(i, true) // counted and logged by the tiers
		}
		if err := e.kv.WriteBlock(int(l.Block), b); err != nil {
			e.tiers.Refused(l.From.Tier, fmt.Errorf("onboarding into device block %d: %w", l.Block, err))
			return fail(i, false)
		}
	}
	return len(loads), false
}

// startOnboard hands the step's onboarding sequences to the loaders. Called by Run's
// goroutine.
func (e *Engine) startOnboard(plan []*sequence) {
	for _, s := range plan {
		e.onboard.inflight++
		e.onboard.queue <- s // its capacity is the sequence cap: never full
	}
}

// onboarded reports the finished loads to the scheduler: their sequences run (or, if they
// were finished meanwhile, release their blocks). Called by Run's goroutine.
func (e *Engine) onboarded() {
	o := &e.onboard
	if o.inflight == 0 {
		return
	}
	o.mu.Lock()
	done := o.done
	o.done = o.done[len(o.done):]
	o.mu.Unlock()
	bs := e.cfg.BlockSize
	for _, r := range done {
		o.inflight--
		e.sched.Onboarded(r.s, r.ok, r.bad)
		if met := e.cfg.TierMetrics; met != nil {
			met.OnboardSeconds.Observe(r.elapsed.Seconds())
		}
		e.log.Debug("onboarded", "seq", r.s.ID, "blocks", r.ok, "of", len(r.s.Loads()), "bad", r.bad, "tokens", r.ok*bs, "in", r.elapsed)
	}
	clear(done)
}

// stopLoaders waits for the loaders (ctx is done) and reports what they finished.
func (e *Engine) stopLoaders() {
	e.onboard.wg.Wait()
	e.onboarded()
}

// loadableEvery is how long a tier found slower than computing stays out of onboarding
// before one onboarding measures it again.
const loadableEvery = time.Minute

// refreshLoadable keeps onboarding away from tiers whose measured load cost exceeds the
// measured cost of computing a block (with those, offload would make requests slower),
// and lets each back in after loadableEvery to measure it again. Called by Run's goroutine.
func (e *Engine) refreshLoadable(now time.Time) {
	o := &e.onboard
	if e.tiers == nil || now.Sub(o.checked) < time.Second {
		return
	}
	o.checked = now
	pre := o.costs.prefill.Load()
	for t := kvcache.TierHost; t <= kvcache.TierRemote; t++ {
		l := o.costs.load[t].Load()
		slow := pre > 0 && l > pre
		switch {
		case slow && !o.skip[t]:
			o.skip[t], o.skipSince[t] = true, now
			e.pool.SetLoadable(t, false)
			e.log.Info("KV tier slower than computing: blocks are recomputed rather than loaded from it", "tier", t, "load_us", l, "prefill_us", pre)
		case o.skip[t] && (!slow || now.Sub(o.skipSince[t]) > loadableEvery):
			o.skip[t] = false
			o.costs.load[t].Store(0) // measure it afresh
			e.pool.SetLoadable(t, true)
		}
	}
}

// costMeter keeps moving averages of what loading a block from each tier and computing a
// block of prompt take, for the load report (the router charges a lower-tier block their
// ratio of a block's prefill).
type costMeter struct {
	load    [4]atomic.Int64 // µs per block, by tier; 0 until measured
	prefill atomic.Int64    // µs per block of prompt
}

// ewma folds x into the average held in v (weight 1/8), or starts it.
func ewma(v *atomic.Int64, x int64) {
	x = max(x, 1)
	for {
		old := v.Load()
		nv := x
		if old > 0 {
			nv = old + (x-old)/8
		}
		if v.CompareAndSwap(old, nv) {
			return
		}
	}
}

func (c *costMeter) observeLoad(t kvcache.Tier, d time.Duration) {
	if int(t) < len(c.load) {
		ewma(&c.load[t], d.Microseconds())
	}
}

// observeStep folds a step that computed prefill prompt tokens in d into the prefill cost,
// when the step was mostly prompt (at least a block of it).
func (c *costMeter) observeStep(d time.Duration, prefill, blockSize int) {
	if prefill < blockSize {
		return
	}
	ewma(&c.prefill, d.Microseconds()*int64(blockSize)/int64(prefill))
}

// LoadCosts returns the measured cost of loading a block from each tier (indexed by
// kvcache.Tier, µs, 0 until measured) and of computing a block of prompt (µs, 0 until
// measured).
func (e *Engine) LoadCosts() (tiers [4]int, prefillBlock int) {
	c := &e.onboard.costs
	for i := range tiers {
		tiers[i] = int(c.load[i].Load())
	}
	return tiers, int(c.prefill.Load())
}

// TierSnapshot returns the figures of every tier, the device first, for /metrics.
func (e *Engine) TierSnapshot() metrics.TierSnapshot {
	st := e.pool.Stats()
	bs := e.cfg.BlockSize
	loads, _ := e.LoadCosts()
	snap := metrics.TierSnapshot{Tiers: []metrics.TierFigures{{Tier: kvcache.TierDevice.String(), Blocks: st.Used + st.Cached,
		Capacity: st.Blocks, Hits: st.Hits / uint64(bs), Evictions: st.Evictions, Loadable: true}}}
	var bb uint64
	if f, err := e.KVFormat(); err == nil {
		bb = uint64(f.BlockBytes())
	}
	for _, t := range e.pool.TierStats() {
		snap.Tiers = append(snap.Tiers, metrics.TierFigures{Tier: t.Tier.String(), Blocks: t.Ready, Capacity: t.Capacity,
			Hits: t.Onboarded, Offloaded: t.Stored, OffloadedBytes: t.Stored * bb, Onboarded: t.Onboarded, OnboardedBytes: t.Onboarded * bb,
			Evictions: t.Evicted, Skipped: t.Skipped, Failed: t.Failed, LoadMicros: loads[t.Tier],
			Bypassed: t.Bypassed, Loadable: t.Loadable})
	}
	if e.tiers != nil {
		for _, f := range e.tiers.Faults() {
			snap.Faults = append(snap.Faults, metrics.TierFault{Tier: f.Tier.String(), Op: f.Op, Kind: f.Kind, Count: f.Count})
		}
	}
	return snap
}

// ExportCached calls fn, in order, with the leading run of want (sequence hashes of a
// prompt's consecutive blocks) that this engine's cache holds: those on the device, then
// those its host memory and disk hold (read and checked); data is in the engine's
// KVFormat and valid only during the call. It returns the number of blocks sent, which is
// fewer than len(want) where the cache's run ends. Blocks are pinned while they are read,
// so nothing evicts them meanwhile. It serves a peer pull (docs/kv-tiers.md).
func (e *Engine) ExportCached(ctx context.Context, want []uint64, fn func(hash uint64, data []byte) error) (int, error) {
	io, err := e.blockIO()
	if err != nil {
		return 0, err
	}
	pin := e.pool.NewSeq(e.cfg.Salt)
	e.lost.RLock() // the blocks matched are the epoch's: a Reset after it fails the reads
	epoch := e.epoch
	n := pin.MatchHashes(want) / e.cfg.BlockSize
	e.lost.RUnlock()
	defer pin.Release()
	var buf []byte
	sent := 0
	if err := e.readEach(ctx, io, epoch, pin.Blocks()[:n], &buf, func(i int, data []byte) error {
		if err := fn(want[i], data); err != nil {
			return err
		}
		sent++
		return nil
	}); err != nil {
		return sent, err
	}
	if e.tiers == nil || n == len(want) {
		return n, nil
	}
	loads := e.pool.PinLower(want[n:], nil)
	bad := -1
	defer func() { e.pool.UnpinLower(loads, bad) }()
	tbuf := e.tiers.NewBuffer()
	for i, l := range loads {
		if err := ctx.Err(); err != nil {
			return n + i, err
		}
		b, err := e.tiers.Read(l, tbuf)
		if err != nil {
			bad = i // counted by the tiers; the peer computes from here
			return n + i, nil
		}
		if err := fn(l.Hash, b); err != nil {
			return n + i, err
		}
	}
	return n + len(loads), nil
}
