package bench

import (
	"math"
	"testing"
	"time"
)

const msec = time.Millisecond

// timeline builds a timeline sent at t0 with content chunks at the given
// offsets (ms) and the stream's end 5 ms after the last.
func timeline(t0 time.Time, chunks []int, prompt, completion int, err string) *Timeline {
	tl := NewTimeline()
	tl.Sent = t0
	for _, c := range chunks {
		tl.Chunks = append(tl.Chunks, t0.Add(time.Duration(c)*msec))
	}
	last := 0
	if len(chunks) > 0 {
		last = chunks[len(chunks)-1]
	}
	tl.End = t0.Add(time.Duration(last+5) * msec)
	tl.PromptTokens, tl.CompletionTokens = prompt, completion
	tl.Err = err
	return tl
}

func TestTimelineMetrics(t *testing.T) {
	start := time.Unix(1000, 0)
	sent := start.Add(250 * msec)
	for _, tc := range []struct {
		name            string
		tl              *Timeline
		inputLen        int
		ttft, e2e, tpot time.Duration
		itl             []time.Duration
		wantIn, wantOut int
	}{
		{
			name: "usage, one token per chunk",
			tl:   timeline(sent, []int{100, 120, 150, 200}, 64, 4, ""), inputLen: 60,
			ttft: 100 * msec, e2e: 200 * msec, tpot: 100 * msec / 3,
			itl:    []time.Duration{20 * msec, 30 * msec, 50 * msec},
			wantIn: 64, wantOut: 4,
		},
		{
			name: "no usage: chunks counted, intended input",
			tl:   timeline(sent, []int{40, 50, 60}, -1, -1, ""), inputLen: 60,
			ttft: 40 * msec, e2e: 60 * msec, tpot: 10 * msec,
			itl:    []time.Duration{10 * msec, 10 * msec},
			wantIn: 60, wantOut: 3,
		},
		{
			name: "usage says more tokens than chunks",
			tl:   timeline(sent, []int{30, 100}, 10, 8, ""),
			ttft: 30 * msec, e2e: 100 * msec, tpot: 10 * msec,
			itl:    []time.Duration{70 * msec},
			wantIn: 10, wantOut: 8,
		},
		{
			name: "one token: no TPOT, no ITL",
			tl:   timeline(sent, []int{80}, 5, 1, ""),
			ttft: 80 * msec, e2e: 80 * msec, tpot: 0, itl: []time.Duration{},
			wantIn: 5, wantOut: 1,
		},
		{
			name: "no content: TTFT and E2E at the stream's end",
			tl:   timeline(sent, nil, 5, 0, ""),
			ttft: 5 * msec, e2e: 5 * msec, wantIn: 5, wantOut: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.tl.Result(start, tc.inputLen)
			if r.Start != 250*msec {
				t.Errorf("start %v, want 250ms", r.Start)
			}
			if r.TTFT != tc.ttft || r.E2E != tc.e2e || r.TPOT() != tc.tpot {
				t.Errorf("TTFT %v E2E %v TPOT %v, want %v %v %v", r.TTFT, r.E2E, r.TPOT(), tc.ttft, tc.e2e, tc.tpot)
			}
			if len(r.ITL) != len(tc.itl) {
				t.Fatalf("ITL %v, want %v", r.ITL, tc.itl)
			}
			for i := range r.ITL {
				if r.ITL[i] != tc.itl[i] {
					t.Errorf("ITL %v, want %v", r.ITL, tc.itl)
				}
			}
			if r.InputLen != tc.wantIn || r.OutputLen != tc.wantOut {
				t.Errorf("lens in %d out %d, want %d %d", r.InputLen, r.OutputLen, tc.wantIn, tc.wantOut)
			}
			if !r.OK() {
				t.Errorf("failed: %s", r.Err)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	// Expected values are numpy.percentile's (linear interpolation).
	for _, tc := range []struct {
		v    []float64
		p    float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 90, 3.7},
		{[]float64{1, 2, 3, 4}, 99, 3.97},
		{[]float64{1, 2, 3, 4}, 0, 1},
		{[]float64{1, 2, 3, 4}, 100, 4},
		{[]float64{7}, 99, 7},
		{[]float64{}, 50, 0},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 95, 95.5},
		{[]float64{0, 0, 0, 100}, 75, 25},
	} {
		if got := Percentile(tc.v, tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.v, tc.p, got, tc.want)
		}
	}
}

func TestComputeStats(t *testing.T) {
	s := ComputeStats([]float64{4, 1, 3, 2}, []float64{90, 99})
	if s.N != 4 || s.Mean != 2.5 || s.Median != 2.5 || math.Abs(s.Std-math.Sqrt(1.25)) > 1e-12 {
		t.Errorf("stats %+v", s)
	}
	if math.Abs(s.Percentiles[90]-3.7) > 1e-9 || math.Abs(s.Percentiles[99]-3.97) > 1e-9 {
		t.Errorf("percentiles %v", s.Percentiles)
	}
	if e := ComputeStats(nil, []float64{99}); e.N != 0 || e.Mean != 0 || e.Percentiles[99] != 0 {
		t.Errorf("empty stats %+v", e)
	}
}

func TestSummarize(t *testing.T) {
	start := time.Unix(0, 0)
	reqs := []RequestResult{
		timeline(start, []int{100, 110, 120, 130, 140}, 100, 5, "").Result(start, 0),                    // TTFT 100, TPOT 10
		timeline(start.Add(500*msec), []int{300, 350, 400}, 50, 3, "").Result(start, 0),                 // TTFT 300, TPOT 50
		timeline(start.Add(time.Second), []int{50}, 20, 1, "").Result(start, 0),                         // one token
		timeline(start.Add(1500*msec), nil, -1, -1, "HTTP 500: boom").Result(start, 0),                  // failed
		timeline(start.Add(1600*msec), []int{100, 200}, -1, -1, "HTTP 429: slow down").Result(start, 0), // failed midway
	}
	slo := SLO{TTFT: 200 * msec, TPOT: 20 * msec}
	s := Summarize(reqs, 2*time.Second, slo, []float64{99})
	if s.Completed != 3 || s.Failed != 2 {
		t.Fatalf("completed %d failed %d, want 3 and 2", s.Completed, s.Failed)
	}
	if s.TotalInput != 170 || s.TotalOutput != 9 {
		t.Errorf("tokens in %d out %d, want 170 and 9", s.TotalInput, s.TotalOutput)
	}
	if s.RequestThroughput != 1.5 || s.OutputThroughput != 4.5 || s.TotalTokenThroughput != 89.5 {
		t.Errorf("throughputs %v %v %v", s.RequestThroughput, s.OutputThroughput, s.TotalTokenThroughput)
	}
	// Good: the first (100 ≤ 200, 10 ≤ 20) and the one-token request (TPOT 0).
	if s.RequestGoodput != 1 {
		t.Errorf("goodput %v, want 1 req/s", s.RequestGoodput)
	}
	if s.TTFT.N != 3 || math.Abs(s.TTFT.Mean-150) > 1e-9 || s.TTFT.Median != 100 {
		t.Errorf("TTFT %+v", s.TTFT)
	}
	if s.TPOT.N != 2 || math.Abs(s.TPOT.Mean-30) > 1e-9 {
		t.Errorf("TPOT %+v (one-token requests are left out)", s.TPOT)
	}
	if s.ITL.N != 6 || math.Abs(s.ITL.Mean-(40+100)/6.0) > 1e-9 {
		t.Errorf("ITL %+v", s.ITL)
	}
	if s.E2EL.N != 3 || math.Abs(s.E2EL.Mean-(140+400+50)/3.0) > 1e-9 {
		t.Errorf("E2EL %+v", s.E2EL)
	}
	// In flight: [0,140] [500,900] [1000,1050] [1500,1505] [1600,1800].
	if s.PeakConcurrency != 1 {
		t.Errorf("peak concurrency %d, want 1", s.PeakConcurrency)
	}
	if s.PeakOutputThroughput != 8 { // 5 + 3 tokens in the first second
		t.Errorf("peak output throughput %v, want 8", s.PeakOutputThroughput)
	}
	if g := Summarize(reqs, 2*time.Second, SLO{}, nil).RequestGoodput; g != 0 {
		t.Errorf("goodput without SLO %v", g)
	}
}

func TestTimeseries(t *testing.T) {
	start := time.Unix(0, 0)
	reqs := []RequestResult{
		timeline(start, []int{500, 1500, 2500}, 1, 6, "").Result(start, 0), // 2 tokens per chunk
		timeline(start.Add(1200*msec), []int{100}, 1, 1, "").Result(start, 0),
	}
	pts := Timeseries(reqs, time.Second)
	if len(pts) != 3 {
		t.Fatalf("%d points, want 3", len(pts))
	}
	wantTok := []float64{2, 3, 2}
	wantIn := []float64{1, 1.1, 0.5} // #0 over [0, 2.5s), #1 over [1.2s, 1.3s)
	wantDone := []float64{0, 1, 1}
	for i, p := range pts {
		if p.OutputTokens != wantTok[i] || math.Abs(p.InFlight-wantIn[i]) > 1e-9 || p.Completed != wantDone[i] {
			t.Errorf("point %d: %+v, want tokens %v in flight %v done %v", i, p, wantTok[i], wantIn[i], wantDone[i])
		}
	}
	if c := peakConcurrency(reqs); c != 2 {
		t.Errorf("peak concurrency %d, want 2", c)
	}
}

func TestParseSLO(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SLO
		err  bool
	}{
		{"ttft:500 tpot:50", SLO{TTFT: 500 * msec, TPOT: 50 * msec}, false},
		{"ttft:500,e2el:2000", SLO{TTFT: 500 * msec, E2EL: 2 * time.Second}, false},
		{"TPOT:12.5", SLO{TPOT: 12500 * time.Microsecond}, false},
		{"", SLO{}, false},
		{"ttft", SLO{}, true},
		{"ttft:-1", SLO{}, true},
		{"ttft:abc", SLO{}, true},
		{"itl:5", SLO{}, true},
	} {
		got, err := ParseSLO(tc.in)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParseSLO(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if !tc.err {
			if back, err := ParseSLO(got.String()); err != nil || back != got {
				t.Errorf("ParseSLO(%q.String()=%q) = %+v, %v", tc.in, got.String(), back, err)
			}
		}
	}
}
