package kvtier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"tandem/kvcache"
)

// Config sizes an engine's lower tiers (docs/kv-tiers.md, "Flags").
type Config struct {
	HostBytes int64  // --kv-host-memory: 0, no host tier (unless a disk or shared tier needs one)
	DiskDir   string // --kv-disk-dir: "" no disk tier
	DiskBytes int64  // --kv-disk-size
	SharedDir string // --kv-shared-dir: "" no shared tier
	Offload   kvcache.OffloadPolicy
	// DiskMinUses is the frequency filter of the disk and shared tiers: a block goes down
	// only once used this many times (0: 2, Dynamo's; 1: every block).
	DiskMinUses int
	// Writers is the number of goroutines writing blocks to disk and the shared directory
	// (0: 4): pwrite on a pool of threads, each a request in the disk's queue.
	Writers int
	// ScanEvery is how often the shared directory is listed for blocks other engines wrote
	// (0: 10 s).
	ScanEvery time.Duration
}

// Enabled reports whether c asks for any lower tier.
func (c Config) Enabled() bool { return c.HostBytes > 0 || c.DiskDir != "" || c.SharedDir != "" }

// MinStagingBlocks is the host tier's size in blocks when a disk or shared tier is asked
// for without host memory: their blocks come down through host memory.
const MinStagingBlocks = 64

// Tiers is an engine's lower-tier stores and the goroutines that move blocks down between
// them. Open them, give the pool Options (with the engine's Saver), Attach the pool, Run.
type Tiers struct {
	cfg    Config
	id     Identity
	Host   *Host
	Disk   *Disk
	Shared *Shared
	pool   *kvcache.Pool
	log    *slog.Logger

	restored []kvcache.Restored
	Scan     ScanReport // what the disk tier's directory held at start

	faults faultBook
	down   [4]atomic.Bool // tiers refused writes after a full disk or a missing directory
	downAt [4]time.Time   // when each tier last went down, under downMu: its log line once a minute
	downMu sync.Mutex

	Transfers, TransferFailures atomic.Uint64
}

// Open opens the stores that cfg asks for, for blocks of identity id.
func Open(cfg Config, id Identity, log *slog.Logger) (*Tiers, error) {
	if log == nil {
		log = slog.Default()
	}
	bb := id.Format.BlockBytes()
	if bb <= 0 {
		return nil, fmt.Errorf("kvtier: blocks of format %v have no bytes", id.Format)
	}
	if cfg.DiskMinUses <= 0 {
		cfg.DiskMinUses = 2
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 4
	}
	if cfg.ScanEvery <= 0 {
		cfg.ScanEvery = 10 * time.Second
	}
	t := &Tiers{cfg: cfg, id: id, log: log}
	slots := int(cfg.HostBytes / int64(stride(bb)))
	if cfg.HostBytes > 0 && slots < 1 {
		return nil, fmt.Errorf("kvtier: --kv-host-memory %d bytes holds no block of %d bytes", cfg.HostBytes, bb)
	}
	if slots == 0 && (cfg.DiskDir != "" || cfg.SharedDir != "") {
		slots = MinStagingBlocks
		log.Info("KV disk or shared tier without host memory: a small host tier stages their blocks", "blocks", slots)
	}
	var err error
	if slots > 0 {
		if t.Host, err = NewHost(slots, bb); err != nil {
			return nil, err
		}
	}
	if cfg.DiskDir != "" {
		n := int(cfg.DiskBytes / int64(headerSize+stride(bb)))
		if n < 1 {
			return nil, fmt.Errorf("kvtier: --kv-disk-size %d bytes holds no block file of %d bytes", cfg.DiskBytes, headerSize+stride(bb))
		}
		if t.Disk, t.restored, t.Scan, err = OpenDisk(cfg.DiskDir, n, id); err != nil {
			return nil, err
		}
		s := t.Scan
		log.Info("KV disk tier", "dir", cfg.DiskDir, "blocks", n, "direct_io", t.Disk.Direct(), "restored", s.Restored,
			"foreign", s.Foreign, "corrupt_removed", s.Corrupt, "beyond_size_removed", s.Beyond, "temp_removed", s.Temp)
		if s.Foreign > 0 {
			log.Warn("KV disk tier holds block files of another model, weights or format: they are not used", "dir", cfg.DiskDir, "files", s.Foreign)
		}
	}
	if cfg.SharedDir != "" {
		if t.Shared, err = OpenShared(cfg.SharedDir, id); err != nil {
			t.Close()
			return nil, err
		}
		log.Info("KV shared tier", "dir", t.Shared.Dir())
	}
	return t, nil
}

// Close releases the stores (the disk directory's lock).
func (t *Tiers) Close() error {
	if t.Disk != nil {
		return t.Disk.Close()
	}
	return nil
}

// Options returns the pool options of these tiers, with saver copying device blocks into
// the host tier.
func (t *Tiers) Options(saver kvcache.Saver) kvcache.Options {
	var o kvcache.Options
	o.Offload, o.Saver = t.cfg.Offload, saver
	if t.Host != nil {
		o.Tiers = append(o.Tiers, kvcache.TierConfig{Tier: kvcache.TierHost, Blocks: t.Host.Slots()})
	}
	if t.Disk != nil {
		o.Tiers = append(o.Tiers, kvcache.TierConfig{Tier: kvcache.TierDisk, Blocks: t.Disk.slots, MinUses: t.cfg.DiskMinUses})
	}
	if t.Shared != nil {
		o.Tiers = append(o.Tiers, kvcache.TierConfig{Tier: kvcache.TierRemote, MinUses: t.cfg.DiskMinUses})
	}
	return o
}

// Attach gives the tiers the pool whose books they keep the bytes of, and enters the
// blocks found at start (the disk tier's files, the shared directory's) into it, which
// announces them.
func (t *Tiers) Attach(p *kvcache.Pool) {
	t.pool = p
	if len(t.restored) > 0 {
		n := p.Restore(kvcache.TierDisk, t.restored)
		t.log.Info("KV disk tier re-indexed", "blocks", n)
		t.restored = nil
	}
	t.scanShared()
}

// Read returns the bytes of load l's block after checking them: the arena's slot for the
// host tier, else read into buf (NewBuffer's). An error is counted and logged (once per
// kind and tier, then at most once a minute).
func (t *Tiers) Read(l kvcache.Load, buf []byte) ([]byte, error) {
	var b []byte
	var err error
	switch l.From.Tier {
	case kvcache.TierHost:
		b, err = t.Host.Read(l.From.Slot, l.Hash)
	case kvcache.TierDisk:
		b, err = t.Disk.Read(l.From.Slot, l.Hash, buf)
	case kvcache.TierRemote:
		b, err = t.Shared.Read(l.Hash, buf)
	default:
		err = fmt.Errorf("kvtier: no tier %v", l.From.Tier)
	}
	if err != nil {
		t.failed(l.From.Tier, "read", err)
	}
	return b, err
}

// NewBuffer returns a buffer for Read of the disk and shared tiers (nil if neither).
func (t *Tiers) NewBuffer() []byte {
	if t.Disk == nil && t.Shared == nil {
		return nil
	}
	return alignedBuf(headerSize + stride(t.id.Format.BlockBytes()))
}

// Run moves blocks down (the pool's Transfers) on Writers goroutines, probes a failed
// store until it works again, and lists the shared directory, until ctx ends.
func (t *Tiers) Run(ctx context.Context) {
	jobs := make(chan kvcache.Transfer, 256)
	var wg sync.WaitGroup
	for range t.cfg.Writers {
		wg.Go(func() {
			hdr := alignedBuf(headerSize)
			for x := range jobs {
				t.transfer(x, hdr)
			}
		})
	}
	probe := time.NewTicker(time.Second)
	defer probe.Stop()
	scan := time.NewTicker(t.cfg.ScanEvery)
	defer scan.Stop()
	var batch []kvcache.Transfer
	for {
		select {
		case <-ctx.Done():
			close(jobs)
			wg.Wait()
			// Report what was never taken, so that nothing stays pinned.
			for _, x := range t.pool.TakeTransfers(batch[:0]) {
				t.pool.TransferDone(x, context.Canceled)
			}
			return
		case <-t.pool.Work():
			batch = t.pool.TakeTransfers(batch[:0])
			for _, x := range batch {
				select {
				case jobs <- x:
				case <-ctx.Done():
					t.pool.TransferDone(x, context.Canceled)
				}
			}
		case <-probe.C:
			t.probe()
		case <-scan.C:
			t.scanShared()
		}
	}
}

// transfer writes one block down and reports it to the pool.
func (t *Tiers) transfer(x kvcache.Transfer, hdr []byte) {
	var err error
	switch x.To.Tier {
	case kvcache.TierDisk:
		err = t.Disk.Write(x.To.Slot, x.Hash, x.Parent, x.Uses, t.Host, x.From.Slot, hdr)
	case kvcache.TierRemote:
		_, err = t.Shared.Write(x.Hash, x.Parent, x.Uses, t.Host, x.From.Slot, hdr)
	default:
		err = fmt.Errorf("kvtier: no transfers to tier %v", x.To.Tier)
	}
	t.Transfers.Add(1)
	if err != nil {
		t.TransferFailures.Add(1)
		t.failed(x.To.Tier, "write", err)
	}
	t.pool.TransferDone(x, err)
}

// failed counts and logs a store's error, and takes the tier out of the way of new blocks
// when its store cannot take them (a full disk, a directory gone), until probe finds it
// working; a directory gone also empties the tier's books.
// Refused counts a block read from tier that the device's KV store would not take (the
// onboarding ends there and the rest is computed), logged as the stores' own errors are.
func (t *Tiers) Refused(tier kvcache.Tier, err error) {
	t.faults.add(t.log, tier, "onboard", "device_refused", err)
}

func (t *Tiers) failed(tier kvcache.Tier, op string, err error) {
	kind := Kind(err)
	t.faults.add(t.log, tier, op, kind, err)
	if kind != "full" && kind != "gone" {
		return
	}
	if !t.down[tier].Swap(true) {
		t.pool.SetWritable(tier, false)
		t.downMu.Lock()
		logIt := time.Since(t.downAt[tier]) > time.Minute
		if logIt {
			t.downAt[tier] = time.Now()
		}
		t.downMu.Unlock()
		if logIt { // a store that fails again after each probe is not logged each time
			t.log.Warn("KV tier refuses new blocks until its store works again (probed every second)", "tier", tier, "err", err)
		}
	}
	if kind == "gone" {
		if n := t.pool.ClearTier(tier); n > 0 {
			t.log.Warn("KV tier's directory is gone: its blocks are forgotten", "tier", tier, "blocks", n)
		}
	}
}

// probe tries the failed stores and lets blocks into those that work again.
func (t *Tiers) probe() {
	for _, tier := range []kvcache.Tier{kvcache.TierDisk, kvcache.TierRemote} {
		if !t.down[tier].Load() {
			continue
		}
		var err error
		switch {
		case tier == kvcache.TierDisk && t.Disk != nil:
			err = t.Disk.Healthy()
		case tier == kvcache.TierRemote && t.Shared != nil:
			_, _, err = t.Shared.Scan()
		}
		if err == nil {
			t.down[tier].Store(false)
			t.pool.SetWritable(tier, true)
			t.log.Debug("KV tier's store answers its probe: blocks go down to it again", "tier", tier)
		}
	}
}

// scanShared enters the blocks other engines wrote into the shared directory and forgets
// those removed from it.
func (t *Tiers) scanShared() {
	if t.Shared == nil || t.pool == nil {
		return
	}
	added, gone, err := t.Shared.Scan()
	if err != nil {
		t.failed(kvcache.TierRemote, "scan", err)
		return
	}
	if len(added) > 0 {
		t.pool.Restore(kvcache.TierRemote, added)
	}
	if len(gone) > 0 {
		t.pool.Forget(kvcache.TierRemote, gone)
	}
}

// Faults returns the errors counted, by tier, operation and kind; files that refused
// O_DIRECT are kind direct_refused.
func (t *Tiers) Faults() []Fault {
	fs := t.faults.list()
	if t.Disk != nil {
		if n := t.Disk.DirectRefused.Load(); n > 0 {
			fs = append(fs, Fault{Tier: kvcache.TierDisk, Op: "open", Kind: "direct_refused", Count: n})
		}
		// What the start-up scan found and did not use (logged once by Open).
		for _, f := range []struct {
			kind string
			n    int
		}{{"corrupt", t.Scan.Corrupt}, {"foreign", t.Scan.Foreign}, {"beyond_size", t.Scan.Beyond}, {"temp", t.Scan.Temp}} {
			if f.n > 0 {
				fs = append(fs, Fault{Tier: kvcache.TierDisk, Op: "scan", Kind: f.kind, Count: uint64(f.n)})
			}
		}
	}
	return fs
}

// Down reports whether tier refuses new blocks now (its store failed).
func (t *Tiers) Down(tier kvcache.Tier) bool { return int(tier) < len(t.down) && t.down[tier].Load() }

// A Fault is a count of one kind of store error.
type Fault struct {
	Tier  kvcache.Tier
	Op    string // read, write, scan
	Kind  string // Kind's names
	Count uint64
}

// faultBook counts store errors and logs each kind once, then at most once a minute.
type faultBook struct {
	mu sync.Mutex
	m  map[faultKey]*faultRec
}

type faultKey struct {
	tier     kvcache.Tier
	op, kind string
}

type faultRec struct {
	n, logged uint64
	at        time.Time
}

func (b *faultBook) add(log *slog.Logger, tier kvcache.Tier, op, kind string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	b.mu.Lock()
	if b.m == nil {
		b.m = map[faultKey]*faultRec{}
	}
	k := faultKey{tier, op, kind}
	r := b.m[k]
	if r == nil {
		r = &faultRec{}
		b.m[k] = r
	}
	r.n++
	logNow := r.logged == 0 || time.Since(r.at) > time.Minute
	var since uint64
	if logNow {
		since = r.n - r.logged
		r.logged, r.at = r.n, time.Now()
	}
	b.mu.Unlock()
	if logNow {
		log.Warn("KV tier error; the block is recomputed", "tier", tier, "op", op, "kind", kind, "count", since, "err", err)
	}
}

func (b *faultBook) list() []Fault {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Fault, 0, len(b.m))
	for k, r := range b.m {
		out = append(out, Fault{Tier: k.tier, Op: k.op, Kind: k.kind, Count: r.n})
	}
	return out
}
