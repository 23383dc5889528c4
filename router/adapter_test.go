package router

import (
	"errors"
	"slices"
	"testing"

	"tandem/kvcache"
	"tandem/llm"
)

// A request under a LoRA adapter goes only to workers whose reports list it, even when
// another worker holds its prefix; none serving it is ErrNoAdapter (a 400), not a 503; the
// adapter's salt is the workers' (kvcache.Salt of the model and NAME@ID), and Adapters
// lists each adapter once.
func TestDecideByAdapter(t *testing.T) {
	s := newTestState(t, testConfig(), 1, 2, 3)
	for id, adapters := range map[WorkerID]string{1: "", 2: "sql@aa tell@bb", 3: "tell@bb"} {
		r := load{}.report()
		r.Adapters = adapters
		if err := s.Report(id, r, t0); err != nil {
			t.Fatal(err)
		}
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	cache(t, s, 1, kvcache.TierDevice, hashes(prompt)) // worker 1 has the prefix, not the adapter
	for _, tc := range []struct {
		adapter string
		want    []WorkerID
	}{{"sql", []WorkerID{2}}, {"tell", []WorkerID{2, 3}}, {"", []WorkerID{1}}} {
		for range 4 {
			r := req(prompt)
			r.Adapter = tc.adapter
			d := decide(t, s, r)
			s.RemoveInflight(d.Inflight)
			if !slices.Contains(tc.want, d.Worker) {
				t.Errorf("adapter %q: worker %d, want one of %v", tc.adapter, d.Worker, tc.want)
			}
		}
	}
	r := req(prompt)
	r.Adapter = "nope"
	if _, err := Decide(s, r); !errors.Is(err, ErrNoAdapter) || !errors.Is(err, llm.ErrInvalid) {
		t.Errorf("an adapter no worker serves: %v, want ErrNoAdapter", err)
	}
	if salt, ok := s.AdapterSalt("tell"); !ok || salt != kvcache.Salt(testCard.Model, "", "tell@bb") {
		t.Errorf("AdapterSalt(tell) = %x, %v", salt, ok)
	}
	if _, ok := s.AdapterSalt("nope"); ok {
		t.Error("AdapterSalt of an adapter no worker serves")
	}
	if got := s.Adapters(); len(got) != 2 || got[0].Name != "sql" || got[1].Name != "tell" || got[1].ID != "bb" {
		t.Errorf("Adapters() = %+v", got)
	}
}

// A request under an adapter the caller can load may go to a worker without it, at
// AdapterLoadCost more, when the workers that serve it are busier than that: the decision
// then says to load it there.
func TestDecideAdapterLoadCost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loadCost float64
		loadable bool
		decode   int // the adapter's worker's decode blocks
		want     WorkerID
		load     bool
	}{
		{"busy holder: load elsewhere", 64, true, 1000, 1, true},
		{"light holder: stay", 64, true, 10, 2, false},
		{"not loadable: stay", 64, false, 1000, 2, false},
		{"no load cost: stay", 0, true, 1000, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.AdapterLoadCost = tc.loadCost
			s := newTestState(t, cfg, 1, 2)
			setLoad(t, s, 1, load{})
			r := load{decode: tc.decode}.report()
			r.Adapters = "tell@bb"
			if err := s.Report(2, r, t0); err != nil {
				t.Fatal(err)
			}
			rq := req([]int32{1, 2, 3})
			rq.Adapter, rq.AdapterLoadable = "tell", tc.loadable
			d := decide(t, s, rq)
			if d.Worker != tc.want || d.LoadAdapter != tc.load {
				t.Errorf("worker %d, load %v; want %d, %v (cost %+v)", d.Worker, d.LoadAdapter, tc.want, tc.load, d.Cost)
			}
		})
	}
}
