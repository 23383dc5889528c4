package sim

import (
	"cmp"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"tandem/bench"
	"tandem/planner"
	"tandem/router"
	"tandem/sla"
)

// rampRequests is a Poisson stream at rate(t) requests per second for dur, every prompt
// in prompts tokens long (a shared 512-token system prompt, then its own) with out tokens.
func rampRequests(dur time.Duration, rate func(time.Duration) float64, peak float64, prompt, out int) []Request {
	rng := rand.New(rand.NewPCG(7, 7))
	var reqs []Request
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / peak * float64(time.Second))
		if t >= dur {
			return reqs
		}
		if rng.Float64()*peak > rate(t) { // thinning
			continue
		}
		reqs = append(reqs, Request{At: t, OutputLen: out,
			Segments: []bench.Segment{{Seed: 1, Len: 512}, {Seed: uint64(len(reqs)) + 2, Len: prompt - 512}}})
	}
}

func attainment(res *Result, t sla.Targets) float64 {
	slo := bench.SLO{TTFT: t.TTFT, TPOT: t.ITL}
	good := 0
	for i := range res.Bench.Requests {
		if slo.Meets(&res.Bench.Requests[i]) {
			good++
		}
	}
	return float64(good) / float64(len(res.Bench.Requests))
}

func TestPlannerInTheLoop(t *testing.T) {
	// The shape, shortened: 2 req/s for two minutes, up 4× over five, back over
	// five, two more at 2 req/s.
	rate := func(t time.Duration) float64 {
		switch m := t.Minutes(); {
		case m < 2 || m >= 12:
			return 2
		case m < 7:
			return 2 + 6*(m-2)/5
		default:
			return 8 - 6*(m-7)/5
		}
	}
	reqs := rampRequests(14*time.Minute, rate, 8, 6000, 100)
	targets := sla.Targets{TTFT: time.Second, ITL: 40 * time.Millisecond}
	for _, tc := range []struct {
		name    string
		cfg     Config
		startup time.Duration
	}{
		{"aggregated", Config{Workers: 1}, 0},
		{"aggregated, 60 s start-up", Config{Workers: 1}, time.Minute},
		{"disaggregated", Config{PrefillWorkers: 1, DecodeWorkers: 1}, 0},
	} {
		cfg := tc.cfg
		cfg.Timing, cfg.Startup = GPUTiming(), tc.startup
		cfg.Planner = &planner.Config{SLA: targets, Interval: 30 * time.Second, LoadInterval: 5 * time.Second}
		res := run(t, cfg, reqs)
		s := res.Bench.Summary
		if s.Failed != 0 || s.Completed != len(reqs) {
			t.Errorf("%s: %d failed, %d of %d completed", tc.name, s.Failed, s.Completed, len(reqs))
		}
		p := res.Plan
		total, peak := 0.0, 0
		for _, pool := range planner.Pools(cfg.PrefillWorkers > 0) {
			total += res.WorkerSeconds[pool]
			peak += p.PeakReplicas[pool]
		}
		final := p.Timeline[len(p.Timeline)-1]
		finalPaid := final.Paid[0] + final.Paid[1] + final.Paid[2]
		if peak <= 2 || finalPaid >= peak || p.Removed == 0 {
			t.Errorf("%s: peak %d workers, %d at the end, %d removed: want it to grow and shrink", tc.name, peak, finalPaid, p.Removed)
		}
		if dur := s.Duration.Seconds(); total >= float64(peak)*dur*0.75 {
			t.Errorf("%s: %.0f worker-seconds, against %.0f for the peak pool throughout", tc.name, total, float64(peak)*dur)
		}
		att := attainment(res, targets)
		if att < 0.95 {
			t.Errorf("%s: SLA attainment %.3f", tc.name, att)
		}
		lag := false
		for _, pt := range p.Timeline {
			lag = lag || pt.Starting != [planner.NumPools]int{}
		}
		if lag != (tc.startup > 0) {
			t.Errorf("%s: workers paid for and serving differ at some tick: %v, want %v", tc.name, lag, tc.startup > 0)
		}
		t.Logf("%s: %d requests, attainment %.3f, %.0f worker-s (peak %d × %.0f s = %.0f), %d decisions, %d removed, mean %.2v",
			tc.name, len(reqs), att, total, peak, s.Duration.Seconds(), float64(peak)*s.Duration.Seconds(), len(p.Decisions), p.Removed, p.MeanReplicas)
	}
}

// heavyTailRequests is a flat Poisson stream with the Mooncake conversation trace's shape:
// prompts log-normal around a median of 7,000 tokens (mean about 11,500, one in a
// hundred over 70,000, none over 126,000), each opening with one of 64 shared system
// prompts of 1,024 tokens; outputs mostly around 400 tokens, with one in twelve under
// 20 and one in five under 100 (the short answers a prefill chunk stalls most).
func heavyTailRequests(dur time.Duration, rate float64, seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed, 19))
	var reqs []Request
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if t >= dur {
			return reqs
		}
		prompt := min(126000, max(1100, int(7000*math.Exp(rng.NormFloat64()))))
		var out int
		switch u := rng.Float64(); {
		case u < 0.085:
			out = 2 + rng.IntN(18)
		case u < 0.2:
			out = 20 + rng.IntN(80)
		default:
			out = min(2000, max(100, int(400+150*rng.NormFloat64())))
		}
		reqs = append(reqs, Request{At: t, OutputLen: out, Segments: []bench.Segment{
			{Seed: uint64(rng.IntN(64)) + 1, Len: 1024}, {Seed: uint64(len(reqs)) + 1000, Len: prompt - 1024}}})
	}
}

// TestPlannerHeavyTail holds the planner on a flat load of heavy-tailed prompts (the
// Mooncake conversation trace's shape, shortened): it meets the goal at no more cost than
// the smallest fixed pool that meets it in every window, and its size neither swings
// nor flaps (it swung between 7 and 15 workers on the trace, at 122 % of the fixed
// pool's cost, when an interval's few 100k-token prompts set its size).
func TestPlannerHeavyTail(t *testing.T) {
	const window = 2 * time.Minute
	reqs := heavyTailRequests(12*time.Minute, 3.4, 3)
	targets := sla.Targets{TTFT: 10 * time.Second, ITL: 50 * time.Millisecond}
	base := Config{Router: router.DefaultConfig(), Timing: GPUTiming()}
	worst := func(res *Result) float64 {
		slo := bench.SLO{TTFT: targets.TTFT, TPOT: targets.ITL}
		var n, good [8]int
		for i := range res.Bench.Requests {
			r := &res.Bench.Requests[i]
			k := min(int(r.Start/window), len(n)-1)
			n[k]++
			if slo.Meets(r) {
				good[k]++
			}
		}
		w := 1.0
		for k := range n {
			if n[k] >= 50 {
				w = min(w, float64(good[k])/float64(n[k]))
			}
		}
		return w
	}
	total := func(res *Result) float64 { return res.WorkerSeconds[planner.Aggregated] }
	// The smallest fixed pool that meets the goal in every window.
	var fixed *Result
	size := 0
	for n := 5; n <= 12 && fixed == nil; n++ {
		cfg := base
		cfg.Workers = n
		res := run(t, cfg, reqs)
		att, w := attainment(res, targets), worst(res)
		t.Logf("fixed %d: attainment %.3f, worst window %.3f, %.0f worker-s", n, att, w, total(res))
		if att >= 0.95 && w >= 0.95 {
			fixed, size = res, n
		}
	}
	if fixed == nil {
		t.Fatal("no fixed pool of up to 12 meets the goal")
	}
	cfg := base
	cfg.Workers = size
	cfg.Planner = &planner.Config{SLA: targets, Interval: time.Minute, LoadInterval: 5 * time.Second}
	res := run(t, cfg, reqs)
	att := attainment(res, targets)
	// After the first two intervals (it starts at the fixed pool's size): the range of
	// sizes, and how often the size turned from growing to shrinking or back.
	lo, hi, turns, dir := math.MaxInt, 0, 0, 0
	prev := size
	for _, pt := range res.Plan.Timeline {
		n := pt.Paid[planner.Aggregated]
		if pt.At >= 2*time.Minute {
			lo, hi = min(lo, n), max(hi, n)
		}
		if d := cmp.Compare(n, prev); d != 0 {
			if dir != 0 && d != dir {
				turns++
			}
			dir, prev = d, n
		}
	}
	t.Logf("planner: attainment %.3f (worst window %.3f), %.0f worker-s against %.0f fixed at %d; sizes %d–%d, %d turns, %d decisions",
		att, worst(res), total(res), total(fixed), size, lo, hi, turns, len(res.Plan.Decisions))
	if att < 0.95 {
		t.Errorf("attainment %.3f, want at least 0.95", att)
	}
	if total(res) > total(fixed) {
		t.Errorf("%.0f worker-s, more than the fixed pool of %d (%.0f)", total(res), size, total(fixed))
	}
	if hi-lo > 3 || turns > 4 {
		t.Errorf("on a flat load the pool went between %d and %d workers and turned %d times", lo, hi, turns)
	}
}

// TestScripted: a scripted deployment (the hindsight bound of tandem plan) follows its
// sizes: new workers serve a start-up time after they are asked for and are paid for
// meanwhile, removed ones drain and leave.
func TestScripted(t *testing.T) {
	reqs := rampRequests(3*time.Minute, func(time.Duration) float64 { return 2 }, 2, 2000, 50)
	cfg := Config{Workers: 1, Timing: GPUTiming(), Startup: 20 * time.Second}
	cfg.Scripted = func(t time.Duration) (n [planner.NumPools]int) {
		n[planner.Aggregated] = 1
		if t >= time.Minute && t < 2*time.Minute {
			n[planner.Aggregated] = 3
		}
		return n
	}
	res := run(t, cfg, reqs)
	if s := res.Bench.Summary; s.Failed != 0 || s.Completed != len(reqs) {
		t.Fatalf("%d failed, %d of %d completed", s.Failed, s.Completed, len(reqs))
	}
	for _, pt := range res.Plan.Timeline {
		var paid, ready int
		switch at := pt.At; {
		case at < time.Minute:
			paid, ready = 1, 1
		case at < time.Minute+cfg.Startup:
			paid, ready = 3, 1
		case at < 2*time.Minute:
			paid, ready = 3, 3
		default:
			continue // draining
		}
		if pt.Paid[planner.Aggregated] != paid || pt.Ready[planner.Aggregated] != ready {
			t.Fatalf("at %v: %d paid, %d serving; want %d, %d", pt.At, pt.Paid[planner.Aggregated], pt.Ready[planner.Aggregated], paid, ready)
		}
	}
	if last := res.Plan.Timeline[len(res.Plan.Timeline)-1]; last.Paid[planner.Aggregated] != 1 || res.Plan.Removed != 2 {
		t.Errorf("at the end %d paid, %d removed; want 1, 2", last.Paid[planner.Aggregated], res.Plan.Removed)
	}
	// One worker throughout, two more for a minute from when they were asked for.
	if ws, want := res.WorkerSeconds[planner.Aggregated], res.Bench.Summary.Duration.Seconds()+2*60; ws < want || ws > want+20 {
		t.Errorf("%.0f worker-seconds, want %.0f and the drain", ws, want)
	}
	cfg.Planner = &planner.Config{}
	if _, err := Run(cfg, reqs); err == nil {
		t.Error("a planner and a script both: accepted")
	}
}
