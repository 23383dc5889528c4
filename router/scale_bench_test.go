package router

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/orpc"
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

// BenchmarkEventIngest: the live router's KV event path at scale, from the wire bytes of a
// Router.Events batch (decode, lock, index update) with 1,000 registered workers and ~1M
// indexed blocks. Each batch holds 32 events of 16 blocks: stored, then removed again, so
// the index stays the same size.
func BenchmarkEventIngest(b *testing.B) {
	ca, err := orpc.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	id, err := ca.NewIdentity("tandem-router", []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	l, err := NewLive(LiveConfig{Identity: id, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	st, err := NewState(DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	m := &liveModel{name: "m", state: st}
	l.models["m"] = m
	scaleState(b, st)
	for w := range WorkerID(scaleWorkers) {
		l.workers[w] = &liveWorker{id: w, node: "w", model: m, kick: make(chan struct{})}
	}
	const batch, blocks = 32, 16
	chains := make([][]uint64, 64)
	for i := range chains {
		chains[i] = hashes(toks(900_000_000+i*10_000, blocks*testBlock))
	}
	next := make([]uint64, scaleWorkers)
	for w := range next {
		next[w], _ = st.Index().LastID(WorkerID(w))
	}
	// Pre-encode one batch per worker for a round of batches; ids keep increasing, so
	// the wire bytes are built per iteration into a reused buffer.
	enc := orpc.NewEncoder(nil)
	msg := &cluster.KVEvents{Events: make([]kvcache.Event, 0, batch)}
	var in cluster.KVEvents
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		b.StopTimer()
		w := i % scaleWorkers
		msg.WorkerID = uint64(w)
		msg.Events = msg.Events[:0]
		for e := range batch {
			c := chains[(i+e/2)%len(chains)]
			next[w]++
			if e%2 == 0 {
				msg.Events = append(msg.Events, stored(next[w], kvcache.TierDevice, 0, c...))
			} else {
				msg.Events = append(msg.Events, removed(next[w], kvcache.TierDevice, c...))
			}
		}
		enc.Reset()
		msg.MarshalORPC(enc)
		wire := enc.Bytes()
		b.StartTimer()
		if err := in.UnmarshalORPC(orpc.NewDecoder(wire)); err != nil {
			b.Fatal(err)
		}
		if _, err := l.events(b.Context(), &in); err != nil {
			b.Fatal(err)
		}
		i++
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(batch*b.N)/sec, "events/s")
	b.ReportMetric(float64(batch*blocks*b.N)/sec, "blocks/s")
}
