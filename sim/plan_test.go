package sim

import (
	"math/rand/v2"
	"testing"
	"time"

	"tandem/bench"
	"tandem/planner"
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
