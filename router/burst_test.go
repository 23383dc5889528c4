package router

import (
	"math/rand/v2"
	"testing"

	"tandem/kvcache"
)

// TestBurstTwoRouters: a burst of requests that share a system prompt, over 100 idle
// workers that all hold it, decided by one router and by two that know nothing of each
// other's decisions (no report comes between them: the worst case of a real burst). One
// router puts each on a worker of its own. Two routers draw apart (each its own seed), so
// they meet only by chance: at most two requests on a worker, on a few workers (about
// n²/400 of them, the birthday bound), where ties that went to the lowest worker id put both
// routers' whole burst on the same workers. docs/routing-study.md has the counts.
func TestBurstTwoRouters(t *testing.T) {
	sys := toks(0, 8*testBlock)
	newRouter := func(seed uint64) *State {
		s, err := NewState(DefaultConfig(), rand.New(rand.NewPCG(seed, seed)))
		if err != nil {
			t.Fatal(err)
		}
		for id := range WorkerID(100) {
			if err := s.AddWorker(id+1, testCard); err != nil {
				t.Fatal(err)
			}
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
	for _, n := range []int{24, 48} {
		for trial := range uint64(3) {
			one, a, b := newRouter(trial+1), newRouter(trial+100), newRouter(trial+200)
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
			if len(byOne) != n || most(byTwo) > 2 || len(byTwo) < n*3/4 {
				t.Errorf("burst of %d, trial %d: one router used %d workers (want %d); two routers %d workers, at most %d on one (want at least %d, at most 2)",
					n, trial, len(byOne), n, len(byTwo), most(byTwo), n*3/4)
			}
		}
	}
}
