package router

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"tandem/kvcache"
)

// The scale the router issue sets: 1,000 workers, 1M blocks in the index.
const (
	scaleWorkers      = 1000
	scaleBlocksPerW   = 1000 // 32 shared system-prompt blocks and 968 of the worker's own
	scaleSystemBlocks = 32
)

// scaleStateN fills s with scaleWorkers workers of perWorker blocks each and returns a
// 4096-token request whose first 32 blocks every worker holds and whose next blocks one
// worker in eight holds in part.
func scaleStateN(b testing.TB, s *State, perWorker int) Request {
	b.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	sys := toks(1, scaleSystemBlocks*testBlock)
	prompt := cat(sys, toks(50000, 4096-len(sys)))
	hp := hashes(prompt)
	own := perWorker - scaleSystemBlocks
	for w := range WorkerID(scaleWorkers) {
		addNamed(b, s, w, "node-"+strconv.Itoa(int(w))) // named, for a State with shares
		setLoad(b, s, w, load{decode: rng.IntN(500), prefillTokens: rng.IntN(4096), usage: 0.5})
		var id uint64
		apply := func(ev kvcache.Event) {
			id++
			ev.ID = id
			if gap, err := s.ApplyEvent(w, ev); gap || err != nil {
				b.Fatalf("apply: gap %v err %v", gap, err)
			}
		}
		hs := hashes(cat(sys, toks(int(w+1)*1_000_000, own*testBlock)))
		apply(stored(0, kvcache.TierDevice, 0, hs...))
		if w%8 == 0 {
			n := 32 + rng.IntN(200)
			apply(stored(0, kvcache.TierDevice, hp[scaleSystemBlocks-1], hp[scaleSystemBlocks:n]...))
		}
	}
	if n := s.Index().Len(); n < scaleWorkers*(perWorker-scaleSystemBlocks) {
		b.Fatalf("index holds %d blocks", n)
	}
	return Request{Hashes: hp, PromptTokens: len(prompt), Now: t0}
}

// BenchmarkDecideScale: one routing decision over 1,000 workers with ~1M indexed blocks,
// for a 4096-token (256-block) prompt; kv-28k with 28,000 blocks per worker (28M entries,
// a full 80 GB GPU's cache each); kv-idle with every worker idle but one in fifty (with a
// long prompt to prefill), as on the replay's cluster, so that the softmax gives most of
// the workers a weight; kv-shares as kv for the first of two routers' shares (SetShare),
// which decides by visiting every worker. Besides the mean it reports the decisions' latency
// percentiles (each timed alone) and the index's bytes per (worker, block) entry.
func BenchmarkDecideScale(b *testing.B) {
	for _, bc := range []struct {
		name      string
		mode      Mode
		perWorker int
		argmin    bool // temperature 0 and weight 1: the defaults before 2026-12
		idle      bool
		shares    int
	}{{"kv", ModeKV, scaleBlocksPerW, false, false, 0}, {"kv-argmin", ModeKV, scaleBlocksPerW, true, false, 0},
		{"least-loaded", ModeLeastLoaded, scaleBlocksPerW, false, false, 0}, {"kv-28k", ModeKV, 28000, false, false, 0},
		{"kv-idle", ModeKV, scaleBlocksPerW, false, true, 0}, {"kv-shares", ModeKV, scaleBlocksPerW, false, false, 2}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Mode = bc.mode
			if bc.argmin {
				cfg.Temperature, cfg.OverlapWeight = 0, 1
			}
			cfg.BusyWaiting = 0
			s := newTestState(b, cfg)
			if err := s.SetShare(0, bc.shares); err != nil {
				b.Fatal(err)
			}
			r := scaleStateN(b, s, bc.perWorker)
			if bc.idle {
				for w := range WorkerID(scaleWorkers) {
					l := load{}
					if w%50 == 0 {
						l = load{decode: 750, prefillTokens: 750 * testBlock, waiting: 1, usage: 0.3}
					}
					setLoad(b, s, w, l)
				}
			}
			x := s.Index()
			lat := make([]time.Duration, 0, 1<<16)
			cpu := make([]time.Duration, 0, 1<<16)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t, c := time.Now(), threadCPU()
				d, err := s.Decide(r)
				if len(lat) < cap(lat) {
					cpu = append(cpu, threadCPU()-c)
					lat = append(lat, time.Since(t))
				}
				if err != nil {
					b.Fatal(err)
				}
				s.RemoveInflight(d.Inflight)
			}
			b.StopTimer()
			reportLatencies(b, "", lat)
			reportLatencies(b, "cpu-", cpu)
			b.ReportMetric(float64(x.Len()), "index-blocks")
			b.ReportMetric(float64(x.Bytes())/float64(x.Entries()), "B/entry")
		})
	}
}

// reportLatencies reports the 50th, 99th and 99.9th percentiles of ds, in µs.
func reportLatencies(b *testing.B, prefix string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50-µs", 0.5}, {"p99-µs", 0.99}, {"p99.9-µs", 0.999}} {
		b.ReportMetric(float64(ds[min(len(ds)-1, int(p.q*float64(len(ds))))].Nanoseconds())/1e3, prefix+p.name)
	}
}
