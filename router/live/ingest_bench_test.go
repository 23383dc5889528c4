package live

import (
	"io"
	"log/slog"
	"testing"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/orpc"
	"tandem/router"
)

// The index BenchmarkEventIngest runs against: 1,000 workers of 1,000 blocks, ~1M in all.
const (
	benchWorkers = 1000
	benchBlocks  = 1000
	benchBlock   = 16
)

var benchSalt = kvcache.Salt("bench", "", "")

func seqTokens(base, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(base + i)
	}
	return t
}

// fillIndex registers benchWorkers workers on s, each holding benchBlocks blocks of its own.
func fillIndex(b *testing.B, s *router.State) {
	b.Helper()
	card := router.Card{Model: "m", HashVersion: kvcache.HashVersion, BlockSize: benchBlock, Salt: benchSalt}
	for w := range router.WorkerID(benchWorkers) {
		if err := s.AddWorker(w, card); err != nil {
			b.Fatal(err)
		}
		hs := kvcache.HashBlocks(benchSalt, seqTokens(int(w+1)*1_000_000, benchBlocks*benchBlock), benchBlock, nil)
		if gap, err := s.ApplyEvent(w, kvcache.Event{ID: 1, Kind: kvcache.EventStored, Tier: kvcache.TierDevice, Hashes: hs}); gap || err != nil {
			b.Fatalf("apply: gap %v err %v", gap, err)
		}
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
	l, err := New(Config{Identity: id, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	st, err := router.NewState(router.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	m := &liveModel{name: "m", state: st}
	l.models["m"] = m
	fillIndex(b, st)
	for w := range router.WorkerID(benchWorkers) {
		lw := &liveWorker{id: w, node: "w", model: m, kick: make(chan struct{})}
		l.workers[w] = lw
		l.byID.Store(w, lw)
	}
	const batch, blocks = 32, 16
	chains := make([][]uint64, 64)
	for i := range chains {
		chains[i] = kvcache.HashBlocks(benchSalt, seqTokens(900_000_000+i*10_000, blocks*benchBlock), benchBlock, nil)
	}
	next := make([]uint64, benchWorkers)
	for w := range next {
		next[w], _ = st.Index().LastID(router.WorkerID(w))
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
		w := i % benchWorkers
		msg.WorkerID = uint64(w)
		msg.Events = msg.Events[:0]
		for e := range batch {
			c := chains[(i+e/2)%len(chains)]
			next[w]++
			if e%2 == 0 {
				msg.Events = append(msg.Events, kvcache.Event{ID: next[w], Kind: kvcache.EventStored, Tier: kvcache.TierDevice, Hashes: c})
			} else {
				msg.Events = append(msg.Events, kvcache.Event{ID: next[w], Kind: kvcache.EventRemoved, Tier: kvcache.TierDevice, Hashes: c})
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
