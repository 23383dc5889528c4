package router

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"tandem/kvcache"
)

// warmState returns a state of 64 workers whose caches hold a realistic mix:
// every worker the system prompt (32 blocks), a few workers longer prefixes of
// the benchmark prompt, and each worker 40 conversations of its own.
func warmState(b *testing.B, cfg Config) (*State, Request) {
	const workers = 64
	s := newTestState(b, cfg)
	sys := toks(1, 32*testBlock)
	prompt := cat(sys, toks(50000, 4096-len(sys))) // 4096 tokens: 256 blocks
	hp := hashes(prompt)
	rng := rand.New(rand.NewPCG(1, 1))
	for w := range WorkerID(workers) {
		if err := s.AddWorker(w, testCard); err != nil {
			b.Fatal(err)
		}
		setLoad(b, s, w, load{decode: rng.IntN(500), prefillTokens: rng.IntN(4096), usage: 0.5})
		for c := range 40 {
			conv := cat(sys, toks(int(w)*100000+c*1000, (8+rng.IntN(56))*testBlock))
			cache(b, s, w, kvcache.TierDevice, hashes(conv))
		}
		if w%8 == 0 { // an eighth of the workers hold part of the prompt
			cache(b, s, w, kvcache.TierDevice, hp[:32+rng.IntN(200)])
		}
	}
	return s, Request{Hashes: hp, PromptTokens: len(prompt), Now: t0}
}

func BenchmarkDecide(b *testing.B) {
	for _, mode := range []Mode{ModeKV, ModeLeastLoaded} {
		b.Run(string(mode), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Mode = mode
			cfg.BusyWaiting = 0
			s, r := warmState(b, cfg)
			b.ReportAllocs()
			for b.Loop() {
				d, err := s.Decide(r)
				if err != nil {
					b.Fatal(err)
				}
				s.RemoveInflight(d.Inflight)
			}
		})
	}
	b.Run("kv-softmax", func(b *testing.B) {
		cfg := DefaultConfig()
		cfg.Temperature = 0.5
		s, r := warmState(b, cfg)
		b.ReportAllocs()
		for b.Loop() {
			d, _ := s.Decide(r)
			s.RemoveInflight(d.Inflight)
		}
	})
	b.Run("kv+hash", func(b *testing.B) { // the caller's hashing included
		s, r := warmState(b, DefaultConfig())
		prompt := cat(toks(1, 32*testBlock), toks(50000, 4096-32*testBlock))
		b.ReportAllocs()
		for b.Loop() {
			r.Hashes = kvcache.HashBlocks(testSalt, prompt, testBlock, r.Hashes[:0])
			d, _ := s.Decide(r)
			s.RemoveInflight(d.Inflight)
		}
	})
}

// BenchmarkInflightBookkeeping: one request's records on a worker that reports every
// fourth request: AddInflight, PrefillDone(At), RemoveInflight(At), and the report; without
// steps, and with them (each report a step after the last dispatch's first token).
func BenchmarkInflightBookkeeping(b *testing.B) {
	for _, stepped := range []bool{false, true} {
		b.Run(fmt.Sprintf("steps=%v", stepped), func(b *testing.B) {
			s := newTestState(b, testConfig(), 1)
			var ins [8]Inflight
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				k := n % len(ins)
				var step uint64
				if stepped {
					step = uint64(n + 1)
				}
				if n >= len(ins) {
					s.RemoveInflightAt(ins[k], step)
				}
				ins[k] = s.AddInflight(1, 20, 5)
				s.PrefillDoneAt(&ins[(k+4)%len(ins)], step)
				if n%4 == 0 {
					r := load{waiting: 3, decode: 40}.report()
					r.Tracked, r.Received = true, ins[k].Seq()
					r.Step = step
					s.Report(1, r, t0)
				}
				n++
			}
		})
	}
}

// BenchmarkIndexApply measures a worker's steady state: each iteration
// applies one Stored event of 16 blocks and one Removed event of 16 blocks,
// over 64 workers sharing a system prompt.
func BenchmarkIndexApply(b *testing.B) {
	const workers, batch = 64, 16
	x := NewIndex()
	sys := hashes(toks(1, 32*testBlock))
	ids := make([]uint64, workers)
	for w := range workers {
		ids[w]++
		x.Apply(WorkerID(w), stored(ids[w], kvcache.TierDevice, 0, sys...))
	}
	// a pool of chains per worker, stored and removed in turn
	const chains = 64
	pool := make([][]uint64, chains)
	for i := range pool {
		pool[i] = hashes(cat(toks(1, 32*testBlock), toks(1000*i, batch*testBlock)))[32:]
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		w := i % workers
		c := pool[(i/workers)%chains]
		ids[w]++
		x.Apply(WorkerID(w), stored(ids[w], kvcache.TierDevice, sys[len(sys)-1], c...))
		ids[w]++
		x.Apply(WorkerID(w), removed(ids[w], kvcache.TierDevice, c...))
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*batch*b.N), "ns/block")
}
