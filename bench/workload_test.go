package bench

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestScheduleRates(t *testing.T) {
	const n = 20000
	sessions := make([]Session, n)
	for _, tc := range []struct {
		kind  Arrival
		rate  float64
		burst float64
	}{
		{Poisson, 10, 1},
		{Poisson, 250, 1},
		{Poisson, 10, 0.5}, // bursty gamma gaps
		{Poisson, 10, 3},
		{Constant, 10, 1},
	} {
		off, err := Schedule(tc.kind, sessions, tc.rate, tc.burst, 1, 42)
		if err != nil {
			t.Fatal(err)
		}
		if off[0] != 0 || !slices.IsSorted(off) {
			t.Fatalf("%s rate %v: offsets not starting at 0 and sorted", tc.kind, tc.rate)
		}
		// n−1 gaps over the span: the measured rate.
		got := float64(n-1) / off[n-1].Seconds()
		if math.Abs(got-tc.rate)/tc.rate > 0.03 {
			t.Errorf("%s rate %v burstiness %v: measured rate %.3f", tc.kind, tc.rate, tc.burst, got)
		}
		// Gap variance: exponential has CV 1, gamma(k) has CV 1/√k, constant 0.
		var gaps []float64
		for i := 1; i < n; i++ {
			gaps = append(gaps, (off[i] - off[i-1]).Seconds())
		}
		st := ComputeStats(gaps, nil)
		wantCV := 0.0
		if tc.kind == Poisson {
			wantCV = 1 / math.Sqrt(tc.burst)
		}
		if cv := st.Std / st.Mean; math.Abs(cv-wantCV) > 0.05 {
			t.Errorf("%s burstiness %v: gap CV %.3f, want %.3f", tc.kind, tc.burst, cv, wantCV)
		}
	}
	again, _ := Schedule(Poisson, sessions, 10, 1, 1, 42)
	first, _ := Schedule(Poisson, sessions, 10, 1, 1, 42)
	if !slices.Equal(again, first) {
		t.Error("Poisson arrivals differ with the same seed")
	}
	inf, _ := Schedule(Poisson, sessions[:5], math.Inf(1), 1, 1, 1)
	if slices.Max(inf) != 0 {
		t.Errorf("infinite rate: offsets %v, want all 0", inf)
	}
	trace := []Session{{At: 0}, {At: time.Second}, {At: 3 * time.Second}}
	if got, _ := Schedule(Trace, trace, 0, 0, 4, 0); !slices.Equal(got, []time.Duration{0, 250 * time.Millisecond, 750 * time.Millisecond}) {
		t.Errorf("trace ×4: %v", got)
	}
	for _, bad := range []struct {
		kind       Arrival
		rate, b, s float64
	}{{Poisson, 0, 1, 1}, {Poisson, -1, 1, 1}, {Poisson, 1, 0, 1}, {Trace, 1, 1, 0}, {"uniform", 1, 1, 1}} {
		if _, err := Schedule(bad.kind, trace, bad.rate, bad.b, bad.s, 0); err == nil {
			t.Errorf("Schedule(%q, rate %v, burstiness %v, speed-up %v): no error", bad.kind, bad.rate, bad.b, bad.s)
		}
	}
}

func TestSharedPrefixShape(t *testing.T) {
	for _, tc := range []struct {
		o                  SharedPrefixOptions
		groups, per, total int
		sys, q, out        int
	}{
		{SharedPrefixOptions{}, 64, 16, 1024, 2048, 128, 256}, // SGLang's defaults
		{SharedPrefixOptions{Groups: 3, PromptsPerGroup: 5, SystemLen: 40, QuestionLen: 7, OutputLen: 9}, 3, 5, 15, 40, 7, 9},
		{SharedPrefixOptions{Groups: 2, PromptsPerGroup: 2, SystemLen: 10, QuestionLen: 3, OutputLen: 4, N: 10}, 2, 2, 10, 10, 3, 4},
	} {
		w, err := SharedPrefix(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		ss := w.Sessions()
		if len(ss) != tc.total || w.Timed() || w.Name() != "shared-prefix" {
			t.Fatalf("%+v: %d sessions, want %d", tc.o, len(ss), tc.total)
		}
		bySystem := map[uint64]int{}
		questions := map[uint64]bool{}
		for _, s := range ss {
			if len(s.Turns) != 1 {
				t.Fatalf("%d turns", len(s.Turns))
			}
			r := s.Turns[0]
			if len(r.Segments) != 2 || r.Segments[0].Len != tc.sys || r.Segments[1].Len != tc.q || r.OutputLen != tc.out || r.InputLen() != tc.sys+tc.q {
				t.Fatalf("request %+v, want system %d + question %d → %d", r, tc.sys, tc.q, tc.out)
			}
			bySystem[r.Segments[0].Seed]++
			questions[r.Segments[1].Seed] = true
		}
		if len(bySystem) != tc.groups || len(questions) != tc.groups*tc.per {
			t.Errorf("%d system prompts and %d questions, want %d and %d", len(bySystem), len(questions), tc.groups, tc.groups*tc.per)
		}
		if tc.o.N == 0 {
			for _, c := range bySystem {
				if c != tc.per {
					t.Errorf("a system prompt is shared by %d requests, want %d", c, tc.per)
				}
			}
		}
	}
	// Shared segments render to shared token prefixes.
	w, _ := SharedPrefix(SharedPrefixOptions{Groups: 1, PromptsPerGroup: 2, SystemLen: 50, QuestionLen: 20, OutputLen: 1})
	r := &Renderer{TokenIDs: []int32{5, 6, 7, 8, 9, 10, 11}}
	a, b := r.IDs(w.Sessions()[0].Turns[0].Segments), r.IDs(w.Sessions()[1].Turns[0].Segments)
	if len(a) != 70 || !slices.Equal(a[:50], b[:50]) || slices.Equal(a[50:], b[50:]) {
		t.Errorf("prompts %v and %v: want a common 50-token prefix and different questions", a, b)
	}
}

func TestRandomAndMultiTurnShapes(t *testing.T) {
	w, err := Random(RandomOptions{N: 500, InputLen: 100, OutputLen: 20, RangeRatio: 0.5, PrefixLen: 8, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	var first uint64
	for i, s := range w.Sessions() {
		r := s.Turns[0]
		if r.Segments[0].Len != 8 || (i > 0 && r.Segments[0].Seed != first) {
			t.Fatalf("request %d lacks the common prefix: %+v", i, r.Segments)
		}
		first = r.Segments[0].Seed
		if in := r.Segments[1].Len; in < 50 || in > 150 {
			t.Errorf("input length %d outside [50, 150]", in)
		}
		if r.OutputLen < 10 || r.OutputLen > 30 {
			t.Errorf("output length %d outside [10, 30]", r.OutputLen)
		}
	}
	again, _ := Random(RandomOptions{N: 500, InputLen: 100, OutputLen: 20, RangeRatio: 0.5, PrefixLen: 8, Seed: 3})
	for i := range again.Sessions() {
		if !slices.Equal(again.Sessions()[i].Turns[0].Segments, w.Sessions()[i].Turns[0].Segments) {
			t.Fatal("the same seed gave different prompts")
		}
	}
	if _, err := Random(RandomOptions{N: 1, InputLen: 1, OutputLen: 1, RangeRatio: 1}); err == nil {
		t.Error("range ratio 1: no error")
	}

	mt, err := MultiTurn(MultiTurnOptions{Conversations: 4, Turns: 3, SystemLen: 16, InputLen: 10, OutputLen: 5, Think: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(mt.Sessions()) != 4 {
		t.Fatalf("%d conversations", len(mt.Sessions()))
	}
	for _, s := range mt.Sessions() {
		if len(s.Turns) != 3 || s.Think != time.Millisecond || s.Turns[0].InputLen() != 26 || s.Turns[1].InputLen() != 10 || s.Turns[2].OutputLen != 5 {
			t.Errorf("conversation %+v", s)
		}
	}
	if txt := RenderText([]Segment{{Seed: 1, Len: 12}}); len(strings.Fields(txt)) != 12 {
		t.Errorf("RenderText gave %q, want 12 words", txt)
	}
}

func TestShareGPTFixture(t *testing.T) {
	p := workloadsDir(t, "sharegpt/ShareGPT_V3_filtered_500.json")
	prompts, err := readFileWith(p, ParseShareGPT)
	if err != nil {
		t.Fatal(err)
	}
	if len(prompts) != 500 {
		t.Errorf("%d prompts, want 500", len(prompts))
	}
	w, err := ShareGPT(prompts, 1200, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(w.Sessions()); n != 1200 {
		t.Errorf("%d requests, want 1200 (cycled)", n)
	}
	rows := loadTrace(t, "mooncake/arxiv_mooncake_trace_first20.jsonl")
	if len(rows) != 20 {
		t.Errorf("arXiv fixture: %d rows, want 20", len(rows))
	}
	if _, err := Mooncake(rows, MooncakeOptions{}); err != nil {
		t.Error(err)
	}
}
