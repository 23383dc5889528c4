package router

import (
	"testing"
	"time"

	"tandem/kvcache"
)

// disaggState has decode workers 1 and 2 and prefill workers 3 and 4, idle but for a
// decode block on 2 and on 4.
func disaggState(t *testing.T) *State {
	t.Helper()
	s := newTestState(t, testConfig())
	for id, role := range map[WorkerID]string{1: RoleDecode, 2: RoleDecode, 3: RolePrefill, 4: RolePrefill} {
		c := testCard
		c.Role = role
		if err := s.AddWorker(id, c); err != nil {
			t.Fatal(err)
		}
	}
	// One decode block on 2 and 4: 1 and 3 win when nothing else differs.
	setLoad(t, s, 2, load{decode: 1})
	setLoad(t, s, 4, load{decode: 1})
	return s
}

func TestDecideDisagg(t *testing.T) {
	long := toks(0, 40*testBlock+3) // 40 full blocks and 3 tokens
	cfg := DisaggConfig{MinRemoteTokens: 10 * testBlock}
	tests := []struct {
		name        string
		prompt      []int32
		setup       func(t *testing.T, s *State)
		wantWhere   string
		wantReason  string
		wantDecode  WorkerID
		wantPrefill WorkerID
		wantUncache int
	}{
		{name: "short prompt stays on D", prompt: toks(0, 5*testBlock),
			wantWhere: PrefillLocal, wantReason: ReasonShortPrompt, wantDecode: 1, wantUncache: 5 * testBlock},
		{name: "long uncached prompt goes to P", prompt: long,
			wantWhere: PrefillRemote, wantReason: ReasonLongPrompt, wantDecode: 1, wantPrefill: 3, wantUncache: len(long)},
		{name: "D and P chosen by their KV", prompt: long,
			setup: func(t *testing.T, s *State) {
				h := hashes(long)
				cache(t, s, 2, kvcache.TierDevice, h[:10])
				cache(t, s, 4, kvcache.TierDevice, h[:20])
			},
			wantWhere: PrefillRemote, wantReason: ReasonLongPrompt, wantDecode: 2, wantPrefill: 4, wantUncache: len(long) - 10*testBlock},
		{name: "prefix on D leaves too little to move", prompt: long,
			setup:     func(t *testing.T, s *State) { cache(t, s, 2, kvcache.TierDevice, hashes(long)[:35]) },
			wantWhere: PrefillLocal, wantReason: ReasonShortPrompt, wantDecode: 2, wantUncache: 5*testBlock + 3},
		{name: "busy prefill pool", prompt: long,
			setup: func(t *testing.T, s *State) {
				setLoad(t, s, 3, load{waiting: 100})
				setLoad(t, s, 4, load{usage: 0.99})
			},
			wantWhere: PrefillLocal, wantReason: ReasonPrefillBusy, wantDecode: 1, wantUncache: len(long)},
		{name: "no healthy prefill worker", prompt: long,
			setup: func(t *testing.T, s *State) {
				s.SetHealthy(3, false)
				s.SetHealthy(4, false)
			},
			wantWhere: PrefillLocal, wantReason: ReasonNoPrefill, wantDecode: 1, wantUncache: len(long)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := disaggState(t)
			if tc.setup != nil {
				tc.setup(t, s)
			}
			d, err := DecideDisagg(s, req(tc.prompt), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if d.Where != tc.wantWhere || d.Reason != tc.wantReason || d.Decode.Worker != tc.wantDecode || d.Uncached != tc.wantUncache {
				t.Errorf("got %s (%s) on D %d, %d uncached; want %s (%s) on D %d, %d uncached",
					d.Where, d.Reason, d.Decode.Worker, d.Uncached, tc.wantWhere, tc.wantReason, tc.wantDecode, tc.wantUncache)
			}
			switch {
			case tc.wantPrefill == 0 && d.Prefill != nil:
				t.Errorf("prefill on %d, want none", d.Prefill.Worker)
			case tc.wantPrefill != 0 && (d.Prefill == nil || d.Prefill.Worker != tc.wantPrefill):
				t.Errorf("prefill decision %+v, want worker %d", d.Prefill, tc.wantPrefill)
			}
			// Decode decisions never land on a prefill worker; in-flight records are kept.
			if w, _ := s.Worker(d.Decode.Worker); w.Card.Role == RolePrefill || w.Inflight != 1 {
				t.Errorf("decode worker %+v", w)
			}
		})
	}
}

// Without a prefill pool, DecideDisagg is Decide; with only prefill workers, they decode.
func TestDecideDisaggWithoutPools(t *testing.T) {
	s := newTestState(t, testConfig(), 1, 2)
	d, err := DecideDisagg(s, req(toks(0, 40*testBlock)), DisaggConfig{MinRemoteTokens: 1})
	if err != nil || d.Where != PrefillLocal || d.Reason != ReasonAggregated || d.Prefill != nil {
		t.Errorf("aggregated cluster: %+v, %v", d, err)
	}
	s = newTestState(t, testConfig())
	c := testCard
	c.Role = RolePrefill
	if err := s.AddWorker(7, c); err != nil {
		t.Fatal(err)
	}
	d, err = DecideDisagg(s, req(toks(0, 40*testBlock)), DisaggConfig{MinRemoteTokens: 1})
	if err != nil || d.Decode.Worker != 7 || d.Prefill != nil || d.Reason != ReasonNoPrefill {
		t.Errorf("prefill workers only: %+v, %v", d, err)
	}
}

// Pool sizes follow registrations, replacements and removals.
func TestPoolSize(t *testing.T) {
	s := disaggState(t)
	check := func(p Pool, want int) {
		t.Helper()
		if n, h := s.PoolSize(p); n != want || h != want {
			t.Errorf("%v pool: %d workers (%d healthy), want %d", p, n, h, want)
		}
	}
	check(PoolPrefill, 2)
	check(PoolDecode, 2)
	if err := s.AddWorker(3, testCard); err != nil { // worker 3 comes back as "both"
		t.Fatal(err)
	}
	check(PoolPrefill, 1)
	check(PoolDecode, 3)
	s.RemoveWorker(4)
	s.RemoveWorker(4) // twice: no effect
	check(PoolPrefill, 0)
	check(PoolDecode, 3)
}

// TestDecideDisaggKVFormat: a decode worker's prompt goes only to a prefill worker whose
// blocks it can import (the same KV format, or one of the two names none); with none
// healthy, it stays on the decode worker for that reason, not for want of a prefill pool.
func TestDecideDisaggKVFormat(t *testing.T) {
	long := toks(0, 40*testBlock)
	cfg := DisaggConfig{MinRemoteTokens: 10 * testBlock}
	tests := []struct {
		name        string
		decode      string              // worker 1's format
		prefill     map[WorkerID]string // prefill workers 3 and 4
		unhealthy   []WorkerID
		wantReason  string
		wantPrefill WorkerID
	}{
		{name: "same format", decode: "f32", prefill: map[WorkerID]string{3: "f16", 4: "f32"},
			wantReason: ReasonLongPrompt, wantPrefill: 4},
		{name: "no prefill worker of the format", decode: "f32", prefill: map[WorkerID]string{3: "f16", 4: "q8"},
			wantReason: ReasonKVFormat},
		{name: "the one of the format is down", decode: "f32", prefill: map[WorkerID]string{3: "f16", 4: "f32"}, unhealthy: []WorkerID{4},
			wantReason: ReasonKVFormat},
		{name: "every prefill worker down", decode: "f32", prefill: map[WorkerID]string{3: "f32", 4: "f32"}, unhealthy: []WorkerID{3, 4},
			wantReason: ReasonNoPrefill},
		{name: "a prefill worker that names none", decode: "f32", prefill: map[WorkerID]string{3: "f16", 4: ""},
			wantReason: ReasonLongPrompt, wantPrefill: 4},
		{name: "a decode worker that names none", decode: "", prefill: map[WorkerID]string{3: "f16", 4: "q8"},
			wantReason: ReasonLongPrompt, wantPrefill: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestState(t, testConfig())
			c := testCard
			c.Role, c.KVFormat = RoleDecode, tc.decode
			if err := s.AddWorker(1, c); err != nil {
				t.Fatal(err)
			}
			for id, f := range tc.prefill {
				c := testCard
				c.Role, c.KVFormat = RolePrefill, f
				if err := s.AddWorker(id, c); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range tc.unhealthy {
				s.SetHealthy(id, false)
			}
			d, err := DecideDisagg(s, req(long), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if d.Reason != tc.wantReason || d.Decode.Worker != 1 {
				t.Errorf("reason %q on D %d, want %q on 1", d.Reason, d.Decode.Worker, tc.wantReason)
			}
			switch {
			case tc.wantPrefill == 0 && d.Prefill != nil:
				t.Errorf("prefill on %d (format %q), want none", d.Prefill.Worker, tc.prefill[d.Prefill.Worker])
			case tc.wantPrefill != 0 && (d.Prefill == nil || d.Prefill.Worker != tc.wantPrefill):
				t.Errorf("prefill decision %+v, want worker %d", d.Prefill, tc.wantPrefill)
			}
		})
	}
}

// Request.KVFormat holds on every path of Decide: in a pool large enough to decide by
// groups, and over a session bound to a worker of another format.
func TestDecideKVFormatEveryPath(t *testing.T) {
	cfg := testConfig()
	cfg.AffinityTTL = time.Hour
	s := newTestState(t, cfg)
	for id := range WorkerID(2 * groupFrom) {
		c := testCard
		c.KVFormat = "f32"
		if id == 7 {
			c.KVFormat = "f16"
		}
		if err := s.AddWorker(id+1, c); err != nil {
			t.Fatal(err)
		}
	}
	r := req(toks(0, 4*testBlock))
	r.SessionID = "s"
	if d := decide(t, s, r); d.Worker == 8 {
		t.Fatalf("the request without a format went to the one f16 worker")
	}
	r.KVFormat = "f16"
	for range 3 {
		if d := decide(t, s, r); d.Worker != 8 {
			t.Fatalf("an f16 request went to worker %d (%s), want 8", d.Worker, d.Reason)
		}
	}
	r.SessionID = ""
	if d := decide(t, s, r); d.Worker != 8 {
		t.Fatalf("an f16 request went to worker %d (%s), want 8", d.Worker, d.Reason)
	}
}
