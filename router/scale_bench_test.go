package router

import (
	"math/rand/v2"
	"testing"

	"tandem/kvcache"
)

// The scale the router issue sets: 1,000 workers, 1M blocks in the index.
const (
	scaleWorkers      = 1000
	scaleBlocksPerW   = 1000 // 32 shared system-prompt blocks and 968 of the worker's own
	scaleSystemBlocks = 32
)

// scaleState fills s with scaleWorkers workers of scaleBlocksPerW blocks each and returns
// a 4096-token request whose first 32 blocks every worker holds and whose next blocks one
// worker in eight holds in part.
func scaleState(b *testing.B, s *State) Request {
	b.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	sys := toks(1, scaleSystemBlocks*testBlock)
	prompt := cat(sys, toks(50000, 4096-len(sys)))
	hp := hashes(prompt)
	own := scaleBlocksPerW - scaleSystemBlocks
	for w := range WorkerID(scaleWorkers) {
		if err := s.AddWorker(w, testCard); err != nil {
			b.Fatal(err)
		}
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
	if n := s.Index().Len(); n < scaleWorkers*(scaleBlocksPerW-scaleSystemBlocks) {
		b.Fatalf("index holds %d blocks", n)
	}
	return Request{Hashes: hp, PromptTokens: len(prompt), Now: t0}
}

// BenchmarkDecideScale: one routing decision over 1,000 workers with ~1M indexed blocks,
// for a 4096-token (256-block) prompt.
func BenchmarkDecideScale(b *testing.B) {
	for _, mode := range []Mode{ModeKV, ModeLeastLoaded} {
		b.Run(string(mode), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Mode = mode
			cfg.BusyWaiting = 0
			s := newTestState(b, cfg)
			r := scaleState(b, s)
			b.ReportMetric(float64(s.Index().Len()), "index-blocks")
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				d, err := s.Decide(r)
				if err != nil {
					b.Fatal(err)
				}
				s.RemoveInflight(d.Inflight)
			}
		})
	}
}
