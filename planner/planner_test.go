package planner

import (
	"math"
	"strings"
	"testing"
	"time"

	"tandem/sla"
)

// linear is a timing model with round numbers, in milliseconds.
type linear struct{ pBase, pTok, dBase, dSeq, dKV float64 }

func (l linear) Prefill(n int, quad float64) time.Duration {
	return time.Duration((l.pBase + l.pTok*float64(n)) * float64(time.Millisecond))
}

func (l linear) Decode(b, kv int) time.Duration {
	return time.Duration((l.dBase + l.dSeq*float64(b) + l.dKV*float64(kv)) * float64(time.Millisecond))
}

func TestQueueAndDecodeModel(t *testing.T) {
	// Prefill: 0.1 ms a token, every prompt 1000 uncached tokens: 100 ms of work. At 5
	// requests/s on one worker ρ = 0.5 and the Pollaczek–Khinchine mean wait of a
	// deterministic service is λS²/(2(1−ρ)) = 50 ms: mean TTFT 150 ms.
	perf := linear{pTok: 0.1, dBase: 10, dSeq: 1}
	cfg := Config{Perf: perf, SLA: sla.Targets{TTFT: time.Second, ITL: 50 * time.Millisecond}, Disaggregated: true, MinRemoteTokens: 1}
	cfg.defaults()
	m := modelOf(&cfg)
	wl := Workload{Rate: 5, Input: 1000, Output: 100}
	p := m.eval(Prefill, 1, wl)
	if math.Abs(p.TTFT.Seconds()-0.150) > 1e-3 || math.Abs(p.Utilization-0.5) > 1e-9 || !p.OK {
		t.Errorf("prefill pool of 1: TTFT %v utilisation %v OK %v; want 150ms 0.5 true", p.TTFT, p.Utilization, p.OK)
	}
	// Decode: a step is 10 ms + 1 ms per sequence. At 2 requests/s of 100 tokens per
	// worker, ITL = 10/(1 − 0.001·2·100) = 12.5 ms (Little: 2.5 sequences in the batch).
	wl = Workload{Rate: 4, Input: 0, Output: 100}
	d := m.evalTail(Decode, 2, wl)
	if math.Abs(d.ITL.Seconds()-0.0125) > 1e-5 { // a 1-token prompt's local prefill adds 3 µs
		t.Errorf("decode pool of 2: ITL %v, want 12.5ms", d.ITL)
	}
	if d.ITLTail <= d.ITL || !d.OK {
		t.Errorf("decode pool of 2: tail %v should exceed the mean %v and meet 50ms", d.ITLTail, d.ITL)
	}
	// Saturated: 10 requests/s of 100 tokens on one worker need 1 s of batch slope per second.
	if s := m.eval(Decode, 1, Workload{Rate: 10, Output: 100}); s.OK || s.ITL != time.Duration(math.MaxInt64) {
		t.Errorf("saturated decode: %+v", s)
	}
}

func TestSizeIsTheSmallestThatMeetsTheTargets(t *testing.T) {
	perf := linear{pBase: 5, pTok: 0.06, dBase: 6, dSeq: 0.05, dKV: 0.00005}
	dist := []Weighted{{Value: 500, Weight: 0.5}, {Value: 2000, Weight: 0.3}, {Value: 8000, Weight: 0.2}}
	for _, tc := range []struct {
		pool  Pool
		rate  float64
		disag bool
	}{
		{Aggregated, 2, false}, {Aggregated, 20, false}, {Aggregated, 60, false},
		{Prefill, 20, true}, {Prefill, 80, true}, {Decode, 20, true}, {Decode, 80, true},
	} {
		cfg := Config{Perf: perf, SLA: sla.Targets{TTFT: 2 * time.Second, ITL: 30 * time.Millisecond}, Disaggregated: tc.disag}
		wl := Workload{Rate: tc.rate, Input: 3000, Output: 300, Uncached: dist}
		n, pred, ok := Size(cfg, tc.pool, wl, 500)
		if !ok || !pred.OK {
			t.Errorf("%s at %v req/s: no size within 500 (%+v)", tc.pool, tc.rate, pred)
			continue
		}
		cfg.defaults()
		m := modelOf(&cfg)
		if n > 1 && m.eval(tc.pool, n-1, wl).OK {
			t.Errorf("%s at %v req/s: %d workers, but %d meet the targets too", tc.pool, tc.rate, n, n-1)
		}
		for k := n; k < n+5; k++ {
			if !m.eval(tc.pool, k, wl).OK {
				t.Errorf("%s at %v req/s: %d workers meet the targets, %d do not", tc.pool, tc.rate, n, k)
			}
		}
		t.Logf("%s at %v req/s: %d workers, %+v", tc.pool, tc.rate, n, pred)
	}
}

// drive feeds a planner: for each interval of dur, rate requests per second arrive and
// finish with the given latencies in pool p (TTFT and TPOT; modelled: what the uncorrected
// model predicts at the ready size, which keeps the corrections at 1), then Step runs.
type drive struct {
	t     *testing.T
	p     *Planner
	c     Counters
	now   time.Duration
	state State
}

func newDrive(t *testing.T, cfg Config, replicas [NumPools]int) *drive {
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &drive{t: t, p: p}
	d.state = State{Counters: &d.c, Replicas: replicas, Ready: replicas}
	if _, ran := p.Step(d.state); ran {
		t.Fatal("the first step ran a loop")
	}
	return d
}

// run advances by dur in load-interval steps and returns the decisions that changed a
// target; the replicas follow the targets at once (apply), or not.
func (d *drive) run(dur time.Duration, rate float64, input, output int, ttft, tpot [NumPools]time.Duration, apply bool) []Decision {
	var out []Decision
	step := d.p.cfg.LoadInterval
	for end := d.now + dur; d.now < end; {
		d.now += step
		n := int(math.Round(rate * step.Seconds()))
		m := modelOf(&d.p.cfg)
		wl := Workload{Rate: rate, Input: float64(input), Output: float64(output)}
		for range n {
			d.c.Arrive()
			for _, pool := range d.p.pools {
				pred := m.eval(pool, d.state.Ready[pool], wl)
				switch lat := ttft[pool]; {
				case lat == modelled:
					d.c.FirstToken(pool, pred.TTFT)
				case lat > 0:
					d.c.FirstToken(pool, lat)
				}
				switch lat := tpot[pool]; {
				case lat == modelled:
					d.c.Finish(pool, input, 0, output, pred.ITL)
				case lat > 0:
					d.c.Finish(pool, input, 0, output, lat)
				}
			}
		}
		d.state.Now = d.now
		dec, ran := d.p.Step(d.state)
		if ran && dec.Changed() {
			out = append(out, dec)
			if apply {
				d.state.Replicas, d.state.Ready = dec.Target, dec.Target
			}
		}
	}
	return out
}

const modelled = time.Duration(-1)

var gpu = linear{pBase: 5, pTok: 0.06, dBase: 6, dSeq: 0.05, dKV: 0.00005}

func TestThroughputLoopScalesUpAndDownWithHysteresis(t *testing.T) {
	cfg := Config{Perf: gpu, SLA: sla.Targets{TTFT: time.Second, ITL: 40 * time.Millisecond}, NoLoadLoop: true}
	d := newDrive(t, cfg, [NumPools]int{Aggregated: 1})
	fine := [NumPools]time.Duration{Aggregated: modelled}
	tpot := [NumPools]time.Duration{Aggregated: modelled}
	want, _, _ := Size(cfg, Aggregated, Workload{Rate: 30, Input: 2000, Output: 200}, 64)
	decs := d.run(2*time.Minute, 30, 2000, 200, fine, tpot, true)
	if len(decs) == 0 || !strings.HasPrefix(decs[0].Reason[Aggregated], "up") {
		t.Fatalf("no scale-up at 30 req/s: %+v", decs)
	}
	got := d.state.Replicas[Aggregated]
	if got < want || got > want+2 {
		t.Errorf("at 30 req/s the pool has %d, the model sizes %d", got, want)
	}
	// The load drops to about a third: nothing within the cooldown, then down by at most a
	// quarter of the pool per interval, to the size that would hold 10% more.
	high := got
	decs = d.run(time.Minute, 10.4, 2000, 200, fine, tpot, true)
	for _, dec := range decs {
		if dec.Target[Aggregated] < high && dec.At-time.Minute < cfg.Interval {
			t.Errorf("scaled down at %v, within the cooldown: %s", dec.At, dec.Reason[Aggregated])
		}
	}
	decs = d.run(10*time.Minute, 10.4, 2000, 200, fine, tpot, true)
	prev := d.state.Replicas[Aggregated]
	for _, dec := range decs {
		if dec.Was[Aggregated]-dec.Target[Aggregated] > max(1, dec.Was[Aggregated]/4) {
			t.Errorf("a down step from %d to %d is more than a quarter", dec.Was[Aggregated], dec.Target[Aggregated])
		}
	}
	// While the forecast still falls, the interval measured (624 requests a minute, less
	// their Poisson noise) bounds the load sized for.
	low, _, _ := Size(cfg, Aggregated, Workload{Rate: (10.4 - math.Sqrt(624)/60) * 1.1, Input: 2000, Output: 200}, 64)
	if prev != low {
		t.Errorf("after the drop the pool has %d, want the size at 10%% more load, %d", prev, low)
	}
	// Steady at the low rate: no flapping.
	if decs := d.run(10*time.Minute, 10.4, 2000, 200, fine, tpot, true); len(decs) != 0 {
		t.Errorf("a steady load changed the pool: %s", decs[0].Reason[Aggregated])
	}
}

func TestLoadLoop(t *testing.T) {
	cfg := Config{Perf: gpu, SLA: sla.Targets{TTFT: time.Second, ITL: 40 * time.Millisecond}, NoThroughputLoop: true,
		Disaggregated: true}
	d := newDrive(t, cfg, [NumPools]int{Prefill: 2, Decode: 2})
	slow := [NumPools]time.Duration{Prefill: 3 * time.Second}
	tpot := [NumPools]time.Duration{Decode: 20 * time.Millisecond}
	decs := d.run(30*time.Second, 5, 2000, 200, slow, tpot, false)
	if len(decs) == 0 || decs[0].Target[Prefill] != 3 || decs[0].Target[Decode] != 2 {
		t.Fatalf("TTFT over target: want the prefill pool at 3, the decode pool kept: %+v", decs)
	}
	if !strings.Contains(decs[0].Reason[Prefill], "measured TTFT") {
		t.Errorf("reason %q", decs[0].Reason[Prefill])
	}
	// A replica starting: no more for the same pressure.
	d.state.Replicas[Prefill] = 3
	n := d.p.target[Prefill]
	d.run(30*time.Second, 5, 2000, 200, slow, tpot, false)
	if d.p.target[Prefill] != n {
		t.Errorf("the load loop grew a pool whose replicas are starting: %d → %d", n, d.p.target[Prefill])
	}
	// Ready and fine under the same load: the size that missed is not gone back to.
	d.state.Ready[Prefill] = 3
	fine := [NumPools]time.Duration{Prefill: 100 * time.Millisecond}
	d.run(2*time.Minute, 5, 2000, 200, fine, tpot, true)
	if got := d.state.Replicas[Prefill]; got != 3 {
		t.Errorf("well under target at the load that missed at 2: prefill pool %d, want 3 kept", got)
	}
	// Under less load the load loop removes what it added (the throughput loop never ran:
	// its size is the initial one).
	d.run(2*time.Minute, 3, 2000, 200, fine, tpot, true)
	if got := d.state.Replicas[Prefill]; got != 2 {
		t.Errorf("well under target under less load: prefill pool %d, want back to 2", got)
	}
}

func TestStartupTimeAsksEarlier(t *testing.T) {
	// A rate ramping 1 → 30 req/s over 20 minutes: a planner told that replicas take 120 s
	// to start asks for more, earlier, than one told they start at once.
	targets := map[time.Duration][]int{}
	for _, startup := range []time.Duration{0, 120 * time.Second} {
		cfg := Config{Perf: gpu, SLA: sla.Targets{TTFT: time.Second, ITL: 40 * time.Millisecond}, NoLoadLoop: true, Startup: startup}
		d := newDrive(t, cfg, [NumPools]int{Aggregated: 1})
		fine := [NumPools]time.Duration{Aggregated: 100 * time.Millisecond}
		tpot := [NumPools]time.Duration{Aggregated: 20 * time.Millisecond}
		for i := range 20 {
			d.run(time.Minute, 1+29*float64(i)/19, 2000, 200, fine, tpot, true)
			targets[startup] = append(targets[startup], d.state.Replicas[Aggregated])
		}
	}
	ahead := false
	for i := range targets[0] {
		if targets[120*time.Second][i] < targets[0][i] {
			t.Errorf("minute %d: %d replicas with a 120 s start-up, %d with none", i, targets[120*time.Second][i], targets[0][i])
		}
		ahead = ahead || targets[120*time.Second][i] > targets[0][i]
	}
	if !ahead {
		t.Errorf("a 120 s start-up never asked for more: %v against %v", targets[120*time.Second], targets[0])
	}
}

func TestBoundsBudgetAndFixedPools(t *testing.T) {
	cfg := Config{Perf: gpu, SLA: sla.Targets{TTFT: 500 * time.Millisecond, ITL: 30 * time.Millisecond}, Disaggregated: true,
		NoLoadLoop: true, MaxTotal: 10}
	cfg.Bounds[Prefill] = Bounds{Min: 2, Max: 8}
	cfg.Bounds[Decode] = Bounds{Min: 1, Max: 8}
	d := newDrive(t, cfg, [NumPools]int{Prefill: 1, Decode: 1})
	if d.p.target[Prefill] != 2 {
		t.Errorf("a pool below its minimum starts at %d, want 2", d.p.target[Prefill])
	}
	ttft := [NumPools]time.Duration{Prefill: 100 * time.Millisecond}
	tpot := [NumPools]time.Duration{Decode: 20 * time.Millisecond}
	decs := d.run(2*time.Minute, 200, 4000, 300, ttft, tpot, true)
	last := decs[len(decs)-1]
	if s := last.Target[Prefill] + last.Target[Decode]; s != 10 || last.Target[Prefill] > 8 || last.Target[Decode] > 8 {
		t.Errorf("targets %v: want a total of 10, each within 8", last.Target)
	}
	if !strings.Contains(last.Reason[Prefill]+last.Reason[Decode], "budget") {
		t.Errorf("the budget is not named: %q / %q", last.Reason[Prefill], last.Reason[Decode])
	}
	if last.Held[Prefill]+last.Held[Decode] == "" {
		t.Errorf("a pool held to the budget is not marked held: %q", last.Held)
	}
	// A pool at its maximum that needs more is held by it.
	small := cfg
	small.MaxTotal = 0
	small.Bounds[Prefill] = Bounds{Min: 1, Max: 2}
	d = newDrive(t, small, [NumPools]int{Prefill: 1, Decode: 1})
	decs = d.run(2*time.Minute, 200, 4000, 300, ttft, tpot, true)
	if last := decs[len(decs)-1]; last.Target[Prefill] != 2 || last.Held[Prefill] != "max" {
		t.Errorf("prefill bounded at 2 under 200 req/s: target %d, held %q; want 2, max", last.Target[Prefill], last.Held[Prefill])
	}
	// A fixed pool keeps its size.
	cfg.Fixed[Decode] = true
	cfg.MaxTotal = 0
	d = newDrive(t, cfg, [NumPools]int{Prefill: 2, Decode: 3})
	d.run(3*time.Minute, 200, 4000, 300, ttft, tpot, true)
	if d.state.Replicas[Decode] != 3 || d.state.Replicas[Prefill] <= 2 {
		t.Errorf("decode fixed at 3: pools %v", d.state.Replicas)
	}
}

func TestValidate(t *testing.T) {
	good := Config{Perf: gpu}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"no perf":       func(c *Config) { c.Perf = nil },
		"goal":          func(c *Config) { c.Goal = 1.5 },
		"predictor":     func(c *Config) { c.Predictor = "prophet" },
		"bounds":        func(c *Config) { c.Bounds[Aggregated] = Bounds{Min: 4, Max: 2} },
		"load interval": func(c *Config) { c.LoadInterval = 2 * time.Minute },
		"negative sla":  func(c *Config) { c.SLA = sla.Targets{TTFT: -1, ITL: time.Millisecond} },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestVictims(t *testing.T) {
	c := []Candidate{
		{Name: "busy", Inflight: 5, Load: 100},
		{Name: "idle-cache-wanted", Hits: 1e6},
		{Name: "starting", Starting: true, Inflight: 0},
		{Name: "idle-cold"},
		{Name: "light", Inflight: 1, Load: 10},
	}
	got := Victims(c, 4)
	want := []string{"starting", "idle-cold", "idle-cache-wanted", "light"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("victims %v, want %v", got, want)
	}
	if len(Victims(c, 10)) != 5 || len(Victims(nil, 2)) != 0 {
		t.Error("victims beyond the candidates")
	}
}

// TestLoadLoopIgnoresUnattainableMisses: when a tenth of the prompts take longer than the
// TTFT target on an idle worker, no pool size meets them; the load loop must not add
// replicas for those misses (it did: it held measured TTFT to the full goal).
func TestLoadLoopIgnoresUnattainableMisses(t *testing.T) {
	cfg := Config{Perf: linear{pTok: 1, dBase: 10, dSeq: 0.1}, SLA: sla.Targets{TTFT: time.Second, ITL: 50 * time.Millisecond},
		Interval: 20 * time.Second, LoadInterval: 5 * time.Second, NoThroughputLoop: false}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var c Counters
	st := State{Counters: &c, Replicas: [NumPools]int{Aggregated: 2}, Ready: [NumPools]int{Aggregated: 2}}
	p.Step(st)
	for i := 1; i <= 24; i++ { // two minutes
		for j := range 10 { // 2 requests/s
			c.Arrive()
			input, ttft := 100, 150*time.Millisecond
			if j%10 == 0 {
				input, ttft = 5000, 5200*time.Millisecond // 5 s of prefill alone
			}
			c.FirstToken(Aggregated, ttft)
			c.Finish(Aggregated, input, 0, 50, 20*time.Millisecond)
		}
		st.Now = time.Duration(i) * 5 * time.Second
		d, ran := p.Step(st)
		if ran && d.Loop == "load" && strings.HasPrefix(d.Reason[Aggregated], "up") {
			t.Fatalf("at %v the load loop grew the pool for prompts no size can serve in time: %s", st.Now, d.Reason[Aggregated])
		}
	}
}
