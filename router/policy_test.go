package router

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"tandem/kvcache"
	"tandem/llm"
)

var (
	t0       = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	testCard = Card{Model: "Qwen/Qwen3-0.6B", HashVersion: kvcache.HashVersion, BlockSize: testBlock, Salt: testSalt, KVBlocks: 1000}
)

func newTestState(t testing.TB, cfg Config, ids ...WorkerID) *State {
	t.Helper()
	s, err := NewState(cfg, rand.New(rand.NewPCG(42, 42)))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := s.AddWorker(id, testCard); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// load is a healthy worker's load report.
type load struct {
	decode, prefillTokens, waiting int
	usage                          float64
}

func (l load) report() LoadReport {
	return LoadReport{DecodeBlocks: l.decode, PrefillTokens: l.prefillTokens, Waiting: l.waiting, KVUsage: l.usage, Healthy: true}
}

func setLoad(t testing.TB, s *State, id WorkerID, l load) {
	t.Helper()
	if err := s.Report(id, l.report(), t0); err != nil {
		t.Fatal(err)
	}
}

// cache makes worker id hold hs on the given tier.
func cache(t testing.TB, s *State, id WorkerID, tier kvcache.Tier, hs []uint64) {
	t.Helper()
	last, _ := s.Index().LastID(id)
	if gap, err := s.ApplyEvent(id, stored(last+1, tier, 0, hs...)); gap || err != nil {
		t.Fatalf("apply: gap %v, err %v", gap, err)
	}
}

func req(tokens []int32) Request {
	return Request{Hashes: hashes(tokens), PromptTokens: len(tokens), Now: t0}
}

func decide(t testing.TB, s *State, r Request) Decision {
	t.Helper()
	d, err := Decide(s, r)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCostMath(t *testing.T) {
	prompt := toks(0, 20*testBlock+8) // 20 full blocks and a half: 20.5 blocks
	h := hashes(prompt)
	tests := []struct {
		name    string
		weight  float64
		hostW   float64
		devHeld int // leading blocks on the device
		hostTo  int // leading blocks on device or host
		l       load
		want    Cost
	}{
		{"cold, idle", 1, 0, 0, 0, load{}, Cost{20.5, 0, 20.5}},
		{"overlap", 1, 0, 12, 12, load{}, Cost{8.5, 0, 8.5}},
		{"overlap and load", 1, 0, 12, 12, load{decode: 30, prefillTokens: 64}, Cost{12.5, 30, 42.5}},
		{"weight 2", 2, 0, 12, 12, load{decode: 30, prefillTokens: 64}, Cost{12.5, 30, 55}},
		{"weight 0", 0, 0, 12, 12, load{decode: 30, prefillTokens: 64}, Cost{12.5, 30, 30}},
		{"host tier ignored", 1, 0, 4, 12, load{}, Cost{16.5, 0, 16.5}},
		{"host tier half", 1, 0.5, 4, 12, load{}, Cost{12.5, 0, 12.5}},
		{"fully cached", 1, 0, 20, 20, load{decode: 5}, Cost{0.5, 5, 5.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.OverlapWeight, cfg.HostWeight = tt.weight, tt.hostW
			s := newTestState(t, cfg, 1)
			setLoad(t, s, 1, tt.l)
			cache(t, s, 1, kvcache.TierDevice, h[:tt.devHeld])
			cache(t, s, 1, kvcache.TierHost, h[tt.devHeld:tt.hostTo])
			d := decide(t, s, req(prompt))
			if d.Cost != tt.want {
				t.Fatalf("cost %+v, want %+v", d.Cost, tt.want)
			}
			if d.Overlap != tt.devHeld || d.HostOverlap != tt.hostTo || d.PromptBlocks != 21 {
				t.Fatalf("overlap %d/%d of %d, want %d/%d of 21", d.Overlap, d.HostOverlap, d.PromptBlocks, tt.devHeld, tt.hostTo)
			}
		})
	}
}

func TestKVDecisions(t *testing.T) {
	sys := toks(1, 8*testBlock)
	prompt := cat(sys, toks(300, 2*testBlock)) // 10 blocks, 8 of them the shared prefix
	h := hashes(prompt)
	type worker struct {
		id     WorkerID
		cached int // leading device blocks
		l      load
	}
	tests := []struct {
		name    string
		weight  float64
		workers []worker
		want    WorkerID
	}{
		{"prefix wins at equal load", 1, []worker{{1, 0, load{}}, {2, 8, load{}}, {3, 0, load{}}}, 2},
		{"longest prefix wins", 1, []worker{{1, 4, load{}}, {2, 8, load{}}, {3, 6, load{}}}, 2},
		{"prefix wins over a little load", 1, []worker{{1, 0, load{decode: 3}}, {2, 8, load{decode: 9}}}, 2},
		{"overloaded prefix worker loses", 1, []worker{{1, 0, load{decode: 3}}, {2, 8, load{decode: 200}}}, 1},
		{"pending prefill counts", 1, []worker{{1, 0, load{}}, {2, 8, load{prefillTokens: 9 * testBlock}}}, 1},
		{"weight 0 balances decode only", 0, []worker{{1, 0, load{decode: 3}}, {2, 8, load{decode: 9}}}, 1},
		{"high weight keeps the prefix", 10, []worker{{1, 0, load{decode: 3}}, {2, 8, load{decode: 60}}}, 2},
		// cost 10 each: the lower load (2: 0 blocks) wins the tie, not the lower id
		{"tie goes to the lower load", 1, []worker{{1, 8, load{decode: 8}}, {2, 0, load{}}}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.OverlapWeight = tt.weight
			s := newTestState(t, cfg)
			for _, w := range tt.workers {
				if err := s.AddWorker(w.id, testCard); err != nil {
					t.Fatal(err)
				}
				setLoad(t, s, w.id, w.l)
				cache(t, s, w.id, kvcache.TierDevice, h[:w.cached])
			}
			d := decide(t, s, req(prompt))
			if d.Worker != tt.want || d.Reason != ReasonKV {
				t.Fatalf("picked %d (%s, cost %+v), want %d", d.Worker, d.Reason, d.Cost, tt.want)
			}
		})
	}
}

// Ties among equally good workers: the lower load, then the emptier cache, then a hash
// of the request and the worker under the State's seed, which spreads requests over idle
// workers and differs between routers.
func TestTieBreak(t *testing.T) {
	prompt := toks(0, 10*testBlock)
	t.Run("emptier cache wins", func(t *testing.T) {
		s := newTestState(t, testConfig(), 2, 3, 5)
		cache(t, s, 2, kvcache.TierDevice, hashes(toks(5000, 3*testBlock)))
		cache(t, s, 3, kvcache.TierDevice, hashes(toks(6000, 1*testBlock)))
		cache(t, s, 5, kvcache.TierDevice, hashes(toks(7000, 2*testBlock)))
		if d := decide(t, s, req(prompt)); d.Worker != 3 {
			t.Fatalf("picked %d, want 3 (1 cached block against 2 and 3)", d.Worker)
		}
	})
	for _, mode := range []Mode{ModeKV, ModeLeastLoaded} {
		t.Run("different requests spread over idle workers/"+string(mode), func(t *testing.T) {
			cfg := testConfig()
			cfg.Mode = mode
			s := newTestState(t, cfg, 1, 2, 3, 4, 5, 6, 7, 8)
			used := map[WorkerID]int{}
			for i := range 64 {
				d := decide(t, s, req(toks(1000*(i+1), 4*testBlock)))
				s.RemoveInflight(d.Inflight) // stay idle: every decision is a tie
				used[d.Worker]++
			}
			if len(used) != 8 {
				t.Fatalf("64 different requests over 8 idle workers went to %v", used)
			}
		})
	}
	t.Run("two routers break the same tie differently", func(t *testing.T) {
		a, b := newTestState(t, testConfig(), 1, 2, 3, 4, 5, 6, 7, 8), newTestState(t, testConfig(), 1, 2, 3, 4, 5, 6, 7, 8)
		b2, err := NewState(testConfig(), rand.New(rand.NewPCG(7, 7)))
		if err != nil {
			t.Fatal(err)
		}
		for id := range WorkerID(8) {
			if err := b2.AddWorker(id+1, testCard); err != nil {
				t.Fatal(err)
			}
		}
		same, differ := 0, 0
		for i := range 32 {
			r := req(toks(1000*(i+1), 4*testBlock))
			da, db, dc := decide(t, a, r), decide(t, b, r), decide(t, b2, r)
			for _, s := range []*State{a, b, b2} {
				s.RemoveInflight(map[*State]Inflight{a: da.Inflight, b: db.Inflight, b2: dc.Inflight}[s])
			}
			if da.Worker == db.Worker {
				same++
			}
			if da.Worker != dc.Worker {
				differ++
			}
		}
		if same != 32 || differ < 24 {
			t.Fatalf("same seed: %d of 32 alike (want all); other seed: %d of 32 differ (want most)", same, differ)
		}
	})
}

// The router's own dispatches move the next decision before any load report.
func TestInflightShiftsDecision(t *testing.T) {
	prompt := toks(0, 10*testBlock)
	t.Run("identical requests spread", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1, 2, 3)
		var got []WorkerID
		var ins []Inflight
		for range 4 {
			d := decide(t, s, req(prompt))
			got = append(got, d.Worker)
			ins = append(ins, d.Inflight)
		}
		// Each goes to an idle worker while there is one; the fourth to the first again
		// (equal loads then, and the first's prefill will have started first).
		if w := map[WorkerID]bool{got[0]: true, got[1]: true, got[2]: true}; len(w) != 3 || got[3] != got[0] {
			t.Fatalf("picked %v, want three different workers, then the first again", got)
		}
		first := got[0]
		w, _ := s.Worker(first)
		if w.PrefillBlocks() != 20 || w.DecodeBlocks() != 20 || w.Waiting() != 2 || w.Inflight != 2 {
			t.Fatalf("worker %d predicted prefill %v decode %v waiting %d inflight %d", first, w.PrefillBlocks(), w.DecodeBlocks(), w.Waiting(), w.Inflight)
		}
		s.PrefillDone(&ins[0])
		s.PrefillDone(&ins[0]) // idempotent
		if w, _ = s.Worker(first); w.PrefillBlocks() != 10 || w.DecodeBlocks() != 20 || w.Waiting() != 1 {
			t.Fatalf("after first token: prefill %v decode %v waiting %d", w.PrefillBlocks(), w.DecodeBlocks(), w.Waiting())
		}
		s.RemoveInflight(ins[0])
		s.RemoveInflight(ins[3])
		if w, _ = s.Worker(first); w.Load() != 0 || w.Waiting() != 0 || w.Inflight != 0 {
			t.Fatalf("after completion: load %v waiting %d inflight %d", w.Load(), w.Waiting(), w.Inflight)
		}
	})
	t.Run("prefix holder gets the second copy only while it pays", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1, 2)
		cache(t, s, 2, kvcache.TierDevice, hashes(prompt)[:9])
		// 1st: worker 2, cost 1. 2nd: worker 2 costs 1+1+10 = 12 > 10 on worker 1.
		if d := decide(t, s, req(prompt)); d.Worker != 2 || d.Cost.Total != 1 {
			t.Fatalf("first to %d cost %v", d.Worker, d.Cost)
		}
		if d := decide(t, s, req(prompt)); d.Worker != 1 {
			t.Fatalf("second to %d", d.Worker)
		}
	})
	t.Run("a load report restarts the predictions", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1, 2)
		d1 := decide(t, s, req(prompt))
		setLoad(t, s, 1, load{decode: 10}) // the report includes the dispatch
		if w, _ := s.Worker(1); w.DecodeBlocks() != 10 || w.PrefillBlocks() != 0 || w.Inflight != 1 {
			t.Fatalf("after report: decode %v prefill %v inflight %d", w.DecodeBlocks(), w.PrefillBlocks(), w.Inflight)
		}
		s.RemoveInflight(d1.Inflight) // completion after the report subtracts
		if w, _ := s.Worker(1); w.DecodeBlocks() != 0 || w.PrefillBlocks() != 0 || w.Waiting() != 0 {
			t.Fatalf("after completion: decode %v prefill %v waiting %d", w.DecodeBlocks(), w.PrefillBlocks(), w.Waiting())
		}
	})
	t.Run("a tracked report keeps the dispatches it has not seen", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1)
		d1 := decide(t, s, req(prompt)) // dispatch 1: 10 prefill, 10 decode blocks
		d2 := decide(t, s, req(prompt)) // dispatch 2
		d3 := decide(t, s, req(prompt)) // dispatch 3
		s.PrefillDone(&d3.Inflight)     // its first token came before the report
		// The worker had taken dispatch 1 (and another router's request) when it reported.
		r := load{decode: 30, prefillTokens: 20 * testBlock, waiting: 2}.report()
		r.Received, r.Tracked = 1, true
		if err := s.Report(1, r, t0); err != nil {
			t.Fatal(err)
		}
		w, _ := s.Worker(1)
		// Report + dispatch 2 (prefill, waiting, decode) + dispatch 3 (decode only).
		if w.PrefillBlocks() != 30 || w.DecodeBlocks() != 50 || w.Waiting() != 3 || w.Inflight != 3 {
			t.Fatalf("after tracked report: prefill %v decode %v waiting %d inflight %d", w.PrefillBlocks(), w.DecodeBlocks(), w.Waiting(), w.Inflight)
		}
		s.RemoveInflight(d2.Inflight)
		if w, _ = s.Worker(1); w.PrefillBlocks() != 20 || w.DecodeBlocks() != 40 || w.Waiting() != 2 {
			t.Fatalf("after dispatch 2 ended: prefill %v decode %v waiting %d", w.PrefillBlocks(), w.DecodeBlocks(), w.Waiting())
		}
		// A report that has seen everything: only its own figures remain.
		r = load{decode: 7}.report()
		r.Received, r.Tracked = 3, true
		s.Report(1, r, t0)
		if w, _ = s.Worker(1); w.PrefillBlocks() != 0 || w.DecodeBlocks() != 7 || w.Waiting() != 0 || len(w.pending) != 0 {
			t.Fatalf("after full report: prefill %v decode %v waiting %d pending %d", w.PrefillBlocks(), w.DecodeBlocks(), w.Waiting(), len(w.pending))
		}
		s.RemoveInflight(d1.Inflight)
		s.RemoveInflight(d3.Inflight)
		if w, _ = s.Worker(1); w.DecodeBlocks() != 0 || w.Inflight != 0 {
			t.Fatalf("after completions: decode %v inflight %d", w.DecodeBlocks(), w.Inflight)
		}
	})
	t.Run("records of a re-registered worker are ignored", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1)
		d := decide(t, s, req(prompt))
		if err := s.AddWorker(1, testCard); err != nil {
			t.Fatal(err)
		}
		s.RemoveInflight(d.Inflight)
		if w, _ := s.Worker(1); w.Inflight != 0 || w.dDecode != 0 {
			t.Fatalf("stale record applied: %+v", w)
		}
	})
}

func equalIDs(a, b []WorkerID) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Softmax selection follows exp(-normalised cost / T), reproducibly, the cost above the
// cheapest's normalised by the prompt's own: a far dearer fourth worker does not change the
// odds of the other three (divided by the costs' range, it made them nearly equal).
func TestSoftmaxSelection(t *testing.T) {
	prompt := toks(0, 10*testBlock)
	run := func(temp float64, seed uint64, n int) ([]int, []WorkerID) {
		cfg := testConfig()
		cfg.Temperature = temp
		s, err := NewState(cfg, rand.New(rand.NewPCG(seed, 1)))
		if err != nil {
			t.Fatal(err)
		}
		// Costs 10, 15, 20 and 110 for a prompt of 10 blocks at overlap weight 1: normalised
		// 0, 0.5, 1 and 10.
		for i, decode := range []int{0, 5, 10, 100} {
			s.AddWorker(WorkerID(i+1), testCard)
			setLoad(t, s, WorkerID(i+1), load{decode: decode})
		}
		counts := make([]int, 4)
		var seq []WorkerID
		for range n {
			d := decide(t, s, req(prompt))
			s.RemoveInflight(d.Inflight) // keep the costs fixed
			counts[d.Worker-1]++
			if len(seq) < 50 {
				seq = append(seq, d.Worker)
			}
		}
		return counts, seq
	}
	const n = 20000
	for _, temp := range []float64{0.25, 0.5, 1, 4} {
		counts, _ := run(temp, 9, n)
		var p [4]float64
		sum := 0.0
		for i, x := range []float64{0, 0.5, 1, 10} {
			if x <= 20*temp { // beyond, dropped (draw)
				p[i] = math.Exp(-x / temp)
			}
			sum += p[i]
		}
		for i := range p {
			p[i] /= sum
			// 5 standard deviations of a binomial share: deterministic with the seed, and
			// would hold for any seed with overwhelming probability.
			sd := math.Sqrt(p[i] * (1 - p[i]) / n)
			if got := float64(counts[i]) / n; math.Abs(got-p[i]) > 5*sd {
				t.Errorf("T=%v worker %d: share %.4f, want %.4f ± %.4f", temp, i+1, got, p[i], 5*sd)
			}
		}
	}
	_, a := run(1, 3, 50)
	_, b := run(1, 3, 50)
	if !equalIDs(a, b) {
		t.Fatal("same seed, different choices")
	}
	if counts, _ := run(0, 3, 100); counts[0] != 100 {
		t.Fatalf("temperature 0 not argmin: %v", counts)
	}
}

func TestModes(t *testing.T) {
	prompt := toks(0, 4*testBlock)
	t.Run("round-robin cycles over healthy workers", func(t *testing.T) {
		cfg := testConfig()
		cfg.Mode = ModeRoundRobin
		s := newTestState(t, cfg, 4, 1, 7)
		cache(t, s, 7, kvcache.TierDevice, hashes(prompt)) // ignored by the mode
		var got []WorkerID
		for i := range 8 {
			switch i {
			case 4:
				s.SetHealthy(4, false)
			case 6:
				s.AddWorker(5, testCard)
			}
			d := decide(t, s, req(prompt))
			if d.Reason != ReasonRoundRobin {
				t.Fatalf("reason %q", d.Reason)
			}
			got = append(got, d.Worker)
		}
		if want := []WorkerID{1, 4, 7, 1, 7, 1, 5, 7}; !equalIDs(got, want) {
			t.Fatalf("picked %v, want %v", got, want)
		}
	})
	t.Run("least-loaded picks the least load", func(t *testing.T) {
		cfg := testConfig()
		cfg.Mode = ModeLeastLoaded
		s := newTestState(t, cfg, 1, 2, 3)
		setLoad(t, s, 1, load{decode: 10})
		setLoad(t, s, 2, load{decode: 2, prefillTokens: 3 * testBlock})
		setLoad(t, s, 3, load{decode: 6})
		cache(t, s, 1, kvcache.TierDevice, hashes(prompt)) // ignored by the mode
		var got []WorkerID
		for range 4 {
			d := decide(t, s, req(prompt))
			if d.Reason != ReasonLeastLoaded {
				t.Fatalf("reason %q", d.Reason)
			}
			got = append(got, d.Worker)
		}
		// loads 10, 5, 6 → 2 (then 13), 3 (then 14), 1 (then 18), 2
		if want := []WorkerID{2, 3, 1, 2}; !equalIDs(got, want) {
			t.Fatalf("picked %v, want %v", got, want)
		}
	})
	t.Run("random covers every worker reproducibly", func(t *testing.T) {
		cfg := testConfig()
		cfg.Mode = ModeRandom
		pick := func() []WorkerID {
			s := newTestState(t, cfg, 1, 2, 3, 4)
			s.SetHealthy(3, false)
			var got []WorkerID
			for range 300 {
				d := decide(t, s, req(prompt))
				s.RemoveInflight(d.Inflight)
				got = append(got, d.Worker)
			}
			return got
		}
		a, b := pick(), pick()
		if !equalIDs(a, b) {
			t.Fatal("same seed, different picks")
		}
		seen := map[WorkerID]int{}
		for _, w := range a {
			seen[w]++
		}
		if len(seen) != 3 || seen[3] != 0 || seen[1] < 70 || seen[2] < 70 || seen[4] < 70 {
			t.Fatalf("picks %v", seen)
		}
	})
	t.Run("a single available worker", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1, 2)
		setLoad(t, s, 1, load{waiting: 100})
		if d := decide(t, s, req(prompt)); d.Worker != 2 || d.Reason != ReasonOnlyWorker || d.Candidates != 1 {
			t.Fatalf("%+v", d)
		}
	})
}

func TestParseModeAndConfig(t *testing.T) {
	for _, m := range []string{"", "kv", "round-robin", "random", "least-loaded"} {
		if _, err := ParseMode(m); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseMode("fastest"); err == nil || !strings.Contains(err.Error(), "fastest") {
		t.Errorf("bad mode: %v", err)
	}
	bad := []func(*Config){
		func(c *Config) { c.OverlapWeight = -1 },
		func(c *Config) { c.Temperature = math.NaN() },
		func(c *Config) { c.HostWeight = 1.5 },
		func(c *Config) { c.BusyKVUsage = math.Inf(1) },
		func(c *Config) { c.BusyWaiting = -1 },
		func(c *Config) { c.AffinityTTL = -time.Second },
		func(c *Config) { c.Mode = "x" },
		func(c *Config) { c.Card.BlockSize = -16 },
	}
	for i, f := range bad {
		cfg := testConfig()
		f(&cfg)
		if _, err := NewState(cfg, nil); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
	if s, err := NewState(Config{}, nil); err != nil || s.Config().Mode != ModeKV {
		t.Errorf("zero config: %v", err)
	}
}

func TestAffinity(t *testing.T) {
	sessReq := func(tokens []int32, sess string, at time.Duration) Request {
		r := req(tokens)
		r.SessionID, r.Now = sess, t0.Add(at)
		return r
	}
	turn1 := toks(0, 6*testBlock)
	other := toks(5000, 6*testBlock)

	t.Run("sticks against the cost", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1, 2)
		d := decide(t, s, sessReq(turn1, "s", 0))
		if d.Worker != 1 || d.Reason != ReasonKV {
			t.Fatalf("%+v", d)
		}
		cache(t, s, 2, kvcache.TierDevice, hashes(other)) // worker 2 now has the better prefix
		for i := range 3 {
			if d := decide(t, s, sessReq(other, "s", time.Duration(i)*time.Minute)); d.Worker != 1 || d.Reason != ReasonAffinity {
				t.Fatalf("turn %d: %+v", i, d)
			}
		}
		if d := decide(t, s, sessReq(other, "", 0)); d.Worker != 2 {
			t.Fatalf("session-less request went to %d", d.Worker)
		}
	})
	tests := []struct {
		name   string
		change func(*State)
		at     time.Duration
		want   WorkerID
		reason string
	}{
		{"kept within the TTL", func(*State) {}, 9 * time.Minute, 2, ReasonAffinity},
		{"rebinds when unhealthy", func(s *State) { s.SetHealthy(2, false) }, time.Minute, 1, ReasonOnlyWorker},
		{"rebinds when busy (KV)", func(s *State) { setLoad(t, s, 2, load{usage: 0.96}) }, time.Minute, 1, ReasonOnlyWorker},
		{"rebinds when busy (waiting)", func(s *State) { setLoad(t, s, 2, load{waiting: 16}) }, time.Minute, 1, ReasonOnlyWorker},
		{"rebinds after the TTL", func(*State) {}, 10 * time.Minute, 1, ReasonKV},
		{"rebinds when the worker re-registers", func(s *State) { s.AddWorker(2, testCard) }, time.Minute, 1, ReasonKV},
		{"rebinds when the worker left", func(s *State) { s.RemoveWorker(2) }, time.Minute, 1, ReasonOnlyWorker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestState(t, testConfig(), 1, 2)
			setLoad(t, s, 1, load{decode: 5})
			if d := decide(t, s, sessReq(turn1, "s", 0)); d.Worker != 2 {
				t.Fatalf("bound to %d", d.Worker)
			}
			s.RemoveInflight(decide(t, s, sessReq(turn1, "x", 0)).Inflight) // another session
			setLoad(t, s, 1, load{})                                        // 1 is now the cheaper
			setLoad(t, s, 2, load{decode: 5})
			tt.change(s)
			d := decide(t, s, sessReq(turn1, "s", tt.at))
			if d.Worker != tt.want || d.Reason != tt.reason {
				t.Fatalf("picked %d (%s), want %d (%s)", d.Worker, d.Reason, tt.want, tt.reason)
			}
			// the binding follows the rebind
			s.Report(2, load{}.report(), t0) // may have left
			setLoad(t, s, 1, load{decode: 50})
			if d := decide(t, s, sessReq(turn1, "s", tt.at+time.Second)); d.Worker != tt.want || d.Reason != ReasonAffinity {
				t.Fatalf("after: picked %d (%s), want %d (affinity)", d.Worker, d.Reason, tt.want)
			}
		})
	}
	t.Run("disabled with TTL 0", func(t *testing.T) {
		cfg := testConfig()
		cfg.AffinityTTL = 0
		s := newTestState(t, cfg, 1, 2)
		a := decide(t, s, sessReq(turn1, "s", 0))
		b := decide(t, s, sessReq(turn1, "s", 0))
		if a.Worker == b.Worker || s.Sessions() != 0 {
			t.Fatalf("affinity with TTL 0: %d %d, %d sessions", a.Worker, b.Worker, s.Sessions())
		}
	})
	t.Run("expired sessions are swept", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1)
		for i := range 3000 {
			d := decide(t, s, sessReq(turn1, "s"+string(rune('a'+i%26))+strings.Repeat("x", i/26), time.Duration(i)*time.Second))
			s.RemoveInflight(d.Inflight)
		}
		if n := s.Sessions(); n > 2*600+1024 {
			t.Fatalf("%d sessions kept", n)
		}
		s.Sweep(t0.Add(time.Hour * 2))
		if s.Sessions() != 0 {
			t.Fatalf("%d sessions after sweep", s.Sessions())
		}
	})
}

func TestBackpressure(t *testing.T) {
	prompt := toks(0, 4*testBlock)
	tests := []struct {
		name  string
		setup func(*State)
		want  error
	}{
		{"no workers", func(s *State) {}, ErrNoWorkers},
		{"all unhealthy", func(s *State) {
			s.AddWorker(1, testCard)
			s.AddWorker(2, testCard)
			s.SetHealthy(1, false)
			s.Report(2, LoadReport{Healthy: false}, t0)
		}, ErrNoWorkers},
		{"all busy", func(s *State) {
			s.AddWorker(1, testCard)
			s.AddWorker(2, testCard)
			s.AddWorker(3, testCard)
			s.Report(1, load{usage: 0.95}.report(), t0)
			s.Report(2, load{waiting: 16}.report(), t0)
			s.SetHealthy(3, false)
		}, ErrAllBusy},
		{"busy by prediction", func(s *State) {
			s.AddWorker(1, testCard)
			s.Report(1, load{usage: 0.9}.report(), t0)
			s.AddInflight(1, 60, 0) // +60 of 1000 blocks → 0.96
		}, ErrAllBusy},
		{"busy by dispatched requests", func(s *State) {
			s.AddWorker(1, testCard)
			for range 16 {
				s.AddInflight(1, 1, 0)
			}
		}, ErrAllBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestState(t, testConfig())
			tt.setup(s)
			_, err := Decide(s, req(prompt))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
		})
	}
	if !errors.Is(ErrAllBusy, llm.ErrQueueFull) || !errors.Is(ErrNoWorkers, llm.ErrUnavailable) {
		t.Fatal("errors do not map to 429/503")
	}
	t.Run("thresholds 0 disable", func(t *testing.T) {
		cfg := testConfig()
		cfg.BusyKVUsage, cfg.BusyWaiting = 0, 0
		s := newTestState(t, cfg, 1)
		setLoad(t, s, 1, load{usage: 1, waiting: 1000})
		if s.Busy(1) {
			t.Fatal("busy with checks disabled")
		}
		decide(t, s, req(prompt))
	})
	t.Run("unknown workers", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1)
		if err := s.Report(9, LoadReport{}, t0); !errors.Is(err, ErrUnknownWorker) {
			t.Fatal(err)
		}
		if err := s.SetHealthy(9, true); !errors.Is(err, ErrUnknownWorker) {
			t.Fatal(err)
		}
		if _, err := s.ApplyEvent(9, stored(1, 0, 0, 1)); !errors.Is(err, ErrUnknownWorker) {
			t.Fatal(err)
		}
		if err := s.ResetWorker(9, kvcache.Snapshot{}); !errors.Is(err, ErrUnknownWorker) {
			t.Fatal(err)
		}
		if s.Busy(9) {
			t.Fatal("unknown worker busy")
		}
		s.RemoveInflight(s.AddInflight(9, 4, 0)) // no-op
	})
}

func TestWorkersAndIndexLifecycle(t *testing.T) {
	s := newTestState(t, testConfig(), 3, 1, 2)
	if got := s.Workers(); !equalIDs(got, []WorkerID{1, 2, 3}) {
		t.Fatalf("workers %v", got)
	}
	h := hashes(toks(0, 3*testBlock))
	cache(t, s, 2, kvcache.TierDevice, h)
	snap := kvcache.Snapshot{LastID: 9, Blocks: []kvcache.CachedBlock{{Hash: h[0]}}}
	if err := s.ResetWorker(1, snap); err != nil {
		t.Fatal(err)
	}
	if got := s.Index().Overlap(h); got[1] != 1 || got[2] != 3 {
		t.Fatalf("overlap %v", got)
	}
	s.RemoveWorker(2)
	if got := s.Index().Overlap(h); len(got) != 1 || !equalIDs(s.Workers(), []WorkerID{1, 3}) {
		t.Fatalf("after removal: overlap %v, workers %v", got, s.Workers())
	}
	if _, ok := s.Worker(2); ok {
		t.Fatal("removed worker still there")
	}
}

// A stale worker's overlap is unknown: it counts as the other candidates' mean, neither a
// hit (its index may hold blocks it evicted long ago) nor a miss. With RequireKVEvents it
// gets no requests at all.
func TestStaleWorker(t *testing.T) {
	prompt := toks(0, 10*testBlock)
	h := hashes(prompt)
	t.Run("overlap unknown", func(t *testing.T) {
		s := newTestState(t, testConfig(), 1, 2, 3)
		cache(t, s, 1, kvcache.TierDevice, h[:10]) // all of it, but 1 is stale
		cache(t, s, 2, kvcache.TierDevice, h[:4])
		if err := s.SetStale(1, true); err != nil {
			t.Fatal(err)
		}
		// Mean of 2 and 3: (4+0)/2 = 2 blocks for 1; 2 has 4: 2 wins.
		d := decide(t, s, req(prompt))
		if d.Worker != 2 {
			t.Fatalf("picked %d (cost %+v), want 2", d.Worker, d.Cost)
		}
		s.RemoveInflight(d.Inflight)
		if err := s.SetStale(1, false); err != nil {
			t.Fatal(err)
		}
		if d := decide(t, s, req(prompt)); d.Worker != 1 {
			t.Fatalf("picked %d when 1 is in step again, want 1", d.Worker)
		}
	})
	t.Run("require KV events", func(t *testing.T) {
		cfg := testConfig()
		cfg.RequireKVEvents = true
		s := newTestState(t, cfg, 1, 2)
		s.SetStale(1, true)
		for range 4 {
			if d := decide(t, s, req(prompt)); d.Worker != 2 {
				t.Fatalf("picked stale worker %d", d.Worker)
			}
		}
		s.SetStale(2, true)
		if _, err := s.Decide(req(prompt)); !errors.Is(err, ErrNoWorkers) {
			t.Fatalf("every worker stale: %v, want ErrNoWorkers", err)
		}
	})
}

// testConfig is DefaultConfig with the cost function's weight 1 and deterministic choices
// (temperature 0), which the tests' expected picks and costs are written for.
func testConfig() Config {
	c := DefaultConfig()
	c.OverlapWeight, c.Temperature = 1, 0
	return c
}

// A block in a lower tier weighs what loading it saves: the configured prior until the
// worker reports its measured load and prefill costs, then 1 − load/prefill (never below
// 0: a tier slower than computing saves nothing).
func TestTierCredits(t *testing.T) {
	prompt := toks(0, 20*testBlock+8) // 20.5 blocks
	h := hashes(prompt)
	tests := []struct {
		name    string
		loads   [4]int // µs per block, by tier
		prefill int    // µs per block
		want    float64
	}{
		// 4 device blocks, 4 host, 4 disk, 4 remote.
		{"priors", [4]int{}, 0, 20.5 - (4 + 4*0.5 + 4*0.3 + 4*0.2)},
		{"measured", [4]int{0, 100, 1000, 4000}, 2000, 20.5 - (4 + 4*0.95 + 4*0.5 + 0)},
		{"measured host only", [4]int{0, 500, 0, 0}, 1000, 20.5 - (4 + 4*0.5 + 4*0.3 + 4*0.2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestState(t, testConfig(), 1)
			r := load{}.report()
			r.TierLoadMicros, r.BlockPrefillMicros = tt.loads, tt.prefill
			if err := s.Report(1, r, t0); err != nil {
				t.Fatal(err)
			}
			cache(t, s, 1, kvcache.TierDevice, h[:4])
			cache(t, s, 1, kvcache.TierHost, h[4:8])
			cache(t, s, 1, kvcache.TierDisk, h[8:12])
			cache(t, s, 1, kvcache.TierRemote, h[12:16])
			d := decide(t, s, req(prompt))
			if math.Abs(d.Cost.Prefill-tt.want) > 1e-9 || d.Runs != [4]int{4, 8, 12, 16} {
				t.Fatalf("prefill cost %v, runs %v; want %v, [4 8 12 16]", d.Cost.Prefill, d.Runs, tt.want)
			}
		})
	}
}

// With peer pulls, a worker that lacks a prompt another worker holds is credited what
// pulling the blocks saves, and told where to pull them from; a busy holder then loses
// the request to an idle worker that pulls.
func TestPeerPulls(t *testing.T) {
	prompt := toks(0, 40*testBlock+8)
	h := hashes(prompt)
	cfg := testConfig()
	cfg.PeerPulls, cfg.PeerMinBlocks = true, 8
	s := newTestState(t, cfg, 1, 2)
	cache(t, s, 1, kvcache.TierDevice, h[:30])
	cache(t, s, 1, kvcache.TierHost, h[30:36])
	setLoad(t, s, 1, load{decode: 200, prefillTokens: 16 * 30}) // busy
	r := load{}.report()
	r.PullMicros, r.BlockPrefillMicros = 100, 1000 // a pulled block saves 0.9 of computing it
	if err := s.Report(2, r, t0); err != nil {
		t.Fatal(err)
	}
	d := decide(t, s, req(prompt))
	if d.Worker != 2 || d.Peer != 1 || d.PeerBlocks != 36 {
		t.Fatalf("decision %+v: want worker 2 pulling 36 blocks from worker 1", d)
	}
	if want := 40.5 - 0.9*36; math.Abs(d.Cost.Prefill-want) > 1e-9 {
		t.Fatalf("prefill cost %v, want %v", d.Cost.Prefill, want)
	}
	s.RemoveInflight(d.Inflight)
	// Pulling slower than computing: no pull; and no pull of fewer than PeerMinBlocks.
	r.PullMicros = 2000
	s.Report(2, r, t0)
	if d := decide(t, s, req(prompt)); d.PeerBlocks != 0 {
		t.Fatalf("a pull slower than computing: %+v", d)
	}
	cfg.PeerPulls = false
	s2 := newTestState(t, cfg, 1, 2)
	cache(t, s2, 1, kvcache.TierDevice, h[:30])
	setLoad(t, s2, 1, load{decode: 200, prefillTokens: 16 * 30})
	if d := decide(t, s2, req(prompt)); d.PeerBlocks != 0 {
		t.Fatalf("peer pulls off: %+v", d)
	}
}
