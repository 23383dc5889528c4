package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"tandem/kvcache"
)

// TestBurstTwoRouters: a burst of requests that share a system prompt, over 100 idle
// workers that all hold it, decided by one router and by two that know nothing of each
// other's decisions (no report comes between them: the worst case of a real burst). One
// router puts each on a worker of its own. Two routers without shares draw apart (each its
// own seed), so they meet only by chance: at most two requests on a worker, on a few workers
// (about n²/400 of them, the birthday bound), where ties that went to the lowest worker id
// put both routers' whole burst on the same workers. Two routers with shares (SetShare: 0
// and 1 of 2, as workers that join both tell them) take their own share's workers first, so
// they put no more on a worker than one router does, up to bursts that fill both shares
// (96 requests, 48 each, over two shares of 50). Both at the default temperature (the
// softmax) and at temperature 0 (the argmin), by groups (100 workers); the exhaustive
// decision picks the same (TestDecideMatchesExhaustive's shares cases). docs/routing-study.md
// has the counts.
func TestBurstTwoRouters(t *testing.T) {
	sys := toks(0, 8*testBlock)
	newRouter := func(t *testing.T, temp float64, seed uint64, share, shares int) *State {
		s := shareState(t, temp, rand.New(rand.NewPCG(seed, seed)), share, shares)
		for id := range WorkerID(100) {
			addNamed(t, s, id+1, fmt.Sprintf("node-%d", id))
			cache(t, s, id+1, kvcache.TierDevice, hashes(sys))
		}
		return s
	}
	most := func(c map[WorkerID]int) int {
		m := 0
		for _, v := range c {
			m = max(m, v)
		}
		return m
	}
	for _, temp := range []float64{DefaultConfig().Temperature, 0} {
		for _, shares := range []int{0, 2} {
			t.Run(fmt.Sprintf("temperature=%v/shares=%d", temp, shares), func(t *testing.T) {
				for _, n := range []int{24, 48, 96} {
					if n > 50 && shares == 0 {
						continue // two routers without shares meet on about n²/400 workers
					}
					for trial := range uint64(3) {
						one := newRouter(t, temp, trial+1, 0, 0)
						a, b := newRouter(t, temp, trial+100, 0, shares), newRouter(t, temp, trial+200, 1%max(shares, 1), shares)
						byOne, byTwo := map[WorkerID]int{}, map[WorkerID]int{}
						for i := range n {
							r := req(append(append([]int32{}, sys...), toks(100000*(i+1), 4*testBlock)...))
							byOne[decide(t, one, r).Worker]++
							if i%2 == 0 {
								byTwo[decide(t, a, r).Worker]++
							} else {
								byTwo[decide(t, b, r).Worker]++
							}
						}
						t.Logf("burst of %d: one router %d workers (at most %d on one), two routers %d workers (at most %d on one)",
							n, len(byOne), most(byOne), len(byTwo), most(byTwo))
						if len(byOne) != n {
							t.Errorf("burst of %d, trial %d: one router used %d workers, want %d", n, trial, len(byOne), n)
						}
						switch {
						case shares > 1 && most(byTwo) > most(byOne):
							t.Errorf("burst of %d, trial %d: two routers with shares put %d requests on a worker, one router %d",
								n, trial, most(byTwo), most(byOne))
						case most(byTwo) > 2 || len(byTwo) < n*3/4:
							t.Errorf("burst of %d, trial %d: two routers used %d workers, at most %d on one (want at least %d, at most 2)",
								n, trial, len(byTwo), most(byTwo), n*3/4)
						}
					}
				}
			})
		}
	}
}

// TestShares: a router's share (SetShare) decides only where workers tie. A worker of
// another share that holds more of the prompt still wins; when the router's own share is
// all loaded, fresh prompts spill onto the other share's idle workers. Routers that know
// the same workers, registered in any order, deal each to exactly one share, the shares
// within one worker of each other, also after a worker leaves; a share out of range is
// refused.
func TestShares(t *testing.T) {
	for _, temp := range []float64{DefaultConfig().Temperature, 0} {
		s := shareState(t, temp, rand.New(rand.NewPCG(7, 7)), 0, 2)
		for id := range WorkerID(8) {
			addNamed(t, s, id+1, fmt.Sprintf("w%d", id))
		}
		var own, foreign []WorkerID
		for id := range WorkerID(8) {
			if inShare(s, id+1) {
				own = append(own, id+1)
			} else {
				foreign = append(foreign, id+1)
			}
		}
		if len(own) != 4 {
			t.Fatalf("8 workers in 2 shares: own %v, other %v", own, foreign)
		}
		// A long prompt cached on a worker of the other share goes there.
		p := toks(0, 16*testBlock)
		cache(t, s, foreign[0], kvcache.TierDevice, hashes(p))
		if got := decide(t, s, req(append(append([]int32{}, p...), toks(5000, testBlock)...))).Worker; got != foreign[0] {
			t.Errorf("temperature %v: a prompt cached on worker %d (the other share) went to %d", temp, foreign[0], got)
		}
		// Fresh prompts: the router's own idle workers first, then the others'.
		picked := map[WorkerID]bool{}
		for i := range 7 {
			w := decide(t, s, req(toks(100000*(i+1), 4*testBlock))).Worker
			picked[w] = true
			if i < len(own) && !inShare(s, w) {
				t.Errorf("temperature %v: fresh prompt %d went to worker %d of the other share while own workers were idle", temp, i, w)
			}
		}
		if len(picked) != 7 {
			t.Errorf("temperature %v: 7 fresh prompts went to %d workers, want 7 (spilling onto the other share)", temp, len(picked))
		}
	}

	const shares, workers = 3, 301
	routers := make([]*State, shares)
	for k := range routers {
		s := shareState(t, DefaultConfig().Temperature, nil, k, shares)
		// Each router numbers the workers its own way: in another order, other ids.
		for i := range workers {
			n := (i*2*(k+1) + k) % workers // a permutation: 2, 4, 6 are prime to 301
			addNamed(t, s, WorkerID(1000*k+n), fmt.Sprintf("engine-%d", n))
		}
		routers[k] = s
	}
	check := func(step string, gone map[int]bool) {
		t.Helper()
		sizes := make([]int, shares)
		for n := range workers {
			if gone[n] {
				continue
			}
			in := 0
			for k, s := range routers {
				if inShare(s, WorkerID(1000*k+n)) {
					in++
					sizes[k]++
				}
			}
			if in != 1 {
				t.Fatalf("%s: engine-%d is in %d routers' shares, want 1", step, n, in)
			}
		}
		if slices.Max(sizes)-slices.Min(sizes) > 1 {
			t.Errorf("%s: shares of %v workers", step, sizes)
		}
	}
	check("all registered", nil)
	gone := map[int]bool{}
	for n := 0; n < workers; n += 5 {
		gone[n] = true
		for k, s := range routers {
			s.RemoveWorker(WorkerID(1000*k + n))
		}
	}
	check("every fifth gone", gone)

	s, _ := NewState(DefaultConfig(), nil)
	for _, c := range [][2]int{{2, 2}, {-1, 3}} {
		if err := s.SetShare(c[0], c[1]); err == nil {
			t.Errorf("SetShare(%d, %d) accepted", c[0], c[1])
		}
	}
	if err := s.SetShare(5, 1); err != nil {
		t.Errorf("SetShare(5, 1) (one router: no share): %v", err)
	}
}

// shareState is a State of the default configuration at temperature temp, drawing from rng
// (nil: a fixed seed), that is router share of shares.
func shareState(t testing.TB, temp float64, rng *rand.Rand, share, shares int) *State {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Temperature = temp
	s, err := NewState(cfg, rng)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(share, shares); err != nil {
		t.Fatal(err)
	}
	return s
}

// addNamed registers worker id with the test card and node name node.
func addNamed(t testing.TB, s *State, id WorkerID, node string) {
	t.Helper()
	card := testCard
	card.Node = node
	if err := s.AddWorker(id, card); err != nil {
		t.Fatal(err)
	}
}

// inShare reports whether worker id is in s's share.
func inShare(s *State, id WorkerID) bool {
	w := s.lookup(id)
	return w != nil && w.own
}
