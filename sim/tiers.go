package sim

// Lower KV tiers in the simulator (docs/kv-tiers.md): each simulated worker's pool has the
// engine's own lower tiers (kvcache's books, bytes modelled), so blocks go down to host
// memory and disk, and prompts onboard them, exactly as in the engine; what moving a
// block takes comes from the measured costs in TierModel. A shared directory is modelled
// as one store all workers see. With the router's PeerPulls, a worker told to pull a
// prefix from a peer waits the modelled transfer of the blocks it lacks, then holds them.

import (
	"time"

	"tandem/kvcache"
	"tandem/router"
)

// TierModel is the simulated workers' lower KV tiers: their sizes per worker, and the
// measured cost of moving a block.
type TierModel struct {
	HostBlocks, DiskBlocks int // per worker; 0: none
	// SharedBlocks sizes a directory that every worker reads and writes (what each
	// worker's books keep of it); 0: none.
	SharedBlocks int
	Offload      kvcache.OffloadPolicy
	DiskMinUses  int // frequency filter of the disk and shared tiers; 0: 2
	// BlockBytes is the bytes of one KV block of the modelled model (0: 2 MiB, an 8B
	// model's 16 tokens at 128 KiB a token, as GPUTiming models).
	BlockBytes int
	// LoadMsPerMiB is the time to load a MiB of KV from each tier into the device, indexed
	// by kvcache.Tier (host, disk, remote; 0 takes DefaultLoadMsPerMiB's).
	LoadMsPerMiB [4]float64
}

// DefaultLoadMsPerMiB are the load costs of a GPU server's tiers: host memory over PCIe
// 4 (≈ 25 GB/s), a local NVMe drive (≈ 5 GB/s, reads checked as the engine checks them)
// and a network filesystem (≈ 1 GB/s).
var DefaultLoadMsPerMiB = [4]float64{0, 0.04, 0.2, 1}

func (m TierModel) enabled() bool { return m.HostBlocks > 0 || m.DiskBlocks > 0 || m.SharedBlocks > 0 }

func (m *TierModel) defaults() {
	if m.BlockBytes <= 0 {
		m.BlockBytes = 2 << 20
	}
	if m.DiskMinUses <= 0 {
		m.DiskMinUses = 2
	}
	for t := kvcache.TierHost; t <= kvcache.TierRemote; t++ {
		if m.LoadMsPerMiB[t] <= 0 {
			m.LoadMsPerMiB[t] = DefaultLoadMsPerMiB[t]
		}
	}
}

// options is the pool options of a worker's tiers.
func (m TierModel) options() kvcache.Options {
	var o kvcache.Options
	o.Offload = m.Offload
	host := m.HostBlocks
	if host == 0 {
		host = 64 // disk and shared blocks come down through host memory, as in the engine
	}
	o.Tiers = append(o.Tiers, kvcache.TierConfig{Tier: kvcache.TierHost, Blocks: host})
	if m.DiskBlocks > 0 {
		o.Tiers = append(o.Tiers, kvcache.TierConfig{Tier: kvcache.TierDisk, Blocks: m.DiskBlocks, MinUses: m.DiskMinUses})
	}
	if m.SharedBlocks > 0 {
		o.Tiers = append(o.Tiers, kvcache.TierConfig{Tier: kvcache.TierRemote, Blocks: m.SharedBlocks, MinUses: m.DiskMinUses})
	}
	return o
}

// loadTime is the modelled time to load one block from tier t.
func (m TierModel) loadTime(t kvcache.Tier) time.Duration {
	return msDur(m.LoadMsPerMiB[t] * float64(m.BlockBytes) / (1 << 20))
}

// tierWorker is a worker's tier state in the simulation.
type tierWorker struct {
	free      [4]time.Duration // when each tier's reads are done with the loads queued so far
	link      time.Duration    // when the worker's network link is done with its pulls
	xfers     []kvcache.Transfer
	onboarded [4]int // blocks loaded from each tier
	pulled    int    // blocks pulled from peers
}

// newPool returns a worker's pool: with the model's tiers if it has any.
func (s *sim) newPool() *kvcache.Pool {
	if !s.cfg.Tiers.enabled() {
		return kvcache.NewPool(s.cfg.KVBlocks, s.cfg.BlockSize)
	}
	p, err := kvcache.NewPoolWith(s.cfg.KVBlocks, s.cfg.BlockSize, s.cfg.Tiers.options())
	if err != nil {
		panic("sim: " + err.Error()) // defaults made the sizes valid
	}
	m := s.cfg.Tiers
	pre := s.cfg.Timing.PrefillPerToken * float64(s.cfg.BlockSize)
	for t := kvcache.TierHost; t <= kvcache.TierRemote; t++ {
		// As the engine does with measured costs: never load from a tier slower than computing.
		p.SetLoadable(t, m.LoadMsPerMiB[t]*float64(m.BlockBytes)/(1<<20) < pre)
	}
	return p
}

// startOnboards queues the loads of the plan's onboarding sequences on their tiers: each
// tier reads one block after another, and a sequence runs when its last block is in.
func (s *sim) startOnboards(w *worker, onboard []*sreq) {
	for _, r := range onboard {
		done := s.now
		for _, l := range r.Loads() {
			t := l.From.Tier
			start := max(s.now, w.tiers.free[t])
			w.tiers.free[t] = start + s.cfg.Tiers.loadTime(t)
			done = max(done, w.tiers.free[t])
			w.tiers.onboarded[t]++
		}
		s.push(event{t: done, kind: evOnboarded, w: w.id, r: r.index()})
	}
}

// onboarded ends r's loads: it runs.
func (s *sim) onboarded(w *worker, r *sreq) {
	w.sched.Onboarded(r, len(r.Loads()), false)
	s.kick(w)
}

// runTransfers completes the pool's copies down at once (they overlap everything; their
// cost is not on any request's path), and shows blocks written to the shared directory
// to every other worker.
func (s *sim) runTransfers(w *worker) {
	if !s.cfg.Tiers.enabled() {
		return
	}
	w.tiers.xfers = w.pool.TakeTransfers(w.tiers.xfers[:0])
	for _, x := range w.tiers.xfers {
		w.pool.TransferDone(x, nil)
		if x.To.Tier == kvcache.TierRemote {
			for _, o := range s.workers {
				if o != w {
					o.pool.Restore(kvcache.TierRemote, []kvcache.Restored{{Slot: -1, Hash: x.Hash, Parent: x.Parent, Uses: x.Uses}})
				}
			}
		}
	}
}

// startPull models a peer pull the router asked for: the blocks the worker lacks of the
// peer's run cross the worker's link, then enter its cache, and the request is queued.
// It reports false when there is nothing to pull.
func (s *sim) startPull(w *worker, r *sreq, d router.Decision) bool {
	bs := s.cfg.BlockSize
	n := min(d.PeerBlocks, (len(r.Tokens)-1)/bs)
	peer := s.workers[d.Peer]
	s.hashes = kvcache.HashBlocks(s.salt, r.Tokens[:n*bs], bs, s.hashes[:0])
	n = peer.pool.HeldRun(s.hashes) // what the peer holds now
	have := w.pool.CachedRun(s.hashes[:n])
	if n-have <= 0 {
		return false
	}
	start := max(s.now, w.tiers.link)
	w.tiers.link = start + s.cfg.Timing.Transfer(int64(n-have)*int64(s.cfg.Tiers.BlockBytes))
	w.pulling = append(w.pulling, pull{r: r, blocks: n})
	s.push(event{t: w.tiers.link, kind: evPulled, w: w.id, r: r.index()})
	return true
}

// pull is a peer pull in flight.
type pull struct {
	r      *sreq
	blocks int
}

// pulled ends r's pull: the blocks enter the worker's cache (as an import does), and r
// is queued.
func (s *sim) pulled(w *worker, r *sreq) {
	bs := s.cfg.BlockSize
	n := 0
	for i, p := range w.pulling {
		if p.r == r {
			n = p.blocks
			w.pulling = append(w.pulling[:i], w.pulling[i+1:]...)
			break
		}
	}
	im := w.pool.NewSeq(s.salt)
	have := im.Match(r.Tokens[:n*bs], 0) / bs
	if im.Reserve((n-have)*bs) == nil {
		im.Commit(r.Tokens[:n*bs])
		w.tiers.pulled += n - have
	}
	im.Release()
	s.account(w)
	w.sched.Add(r)
	s.kick(w)
}

// tierLoad is what a simulated worker's load report says of its tiers' costs, as the
// engine measures them: µs to load a block from each tier, to compute one, to pull one.
func (s *sim) tierLoad(lr *router.LoadReport) {
	if !s.cfg.Tiers.enabled() && !s.cfg.Router.PeerPulls {
		return
	}
	m := s.cfg.Tiers
	for t := kvcache.TierHost; t <= kvcache.TierRemote; t++ {
		lr.TierLoadMicros[t] = int(m.loadTime(t).Microseconds())
	}
	lr.BlockPrefillMicros = int(s.cfg.Timing.PrefillPerToken * float64(s.cfg.BlockSize) * 1000)
	lr.PullMicros = int((s.cfg.Timing.Transfer(int64(m.BlockBytes)*64) / 64).Microseconds())
}

// TierStats is what one simulated worker's tiers did.
type TierStats struct {
	Onboarded [4]int // blocks loaded from each tier (host, disk, remote)
	Pulled    int    // blocks pulled from peers
}
