package simstep

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tandem/bench"
	"tandem/engine"
	"tandem/internal/datadriven"
	"tandem/llm"
	"tandem/router"
	"tandem/sim"
)

// scriptWorkload is what a sched script's scheduler (a new and what follows it) asks for:
// the scheduler's sizes, its ITL target and step cost (itl: none), the arrivals, and the
// plans the script expects, one "step N: …" line each, with each step's predicted time
// when the script has a cost model.
type scriptWorkload struct {
	budget, seqs, blocks, blockSize int
	itl                             time.Duration
	itlDecodes                      float64 // a relative target instead (itl=Kx)
	timing                          sim.Timing
	arrivals                        []scriptArrival
	plans                           []string
	times                           []time.Duration
}

// scriptArrival is one add of the script: it arrives once after steps have run.
type scriptArrival struct {
	id, out, prio int
	after         int
	segs          []bench.Segment
}

func (a scriptArrival) promptLen() int {
	n := 0
	for _, s := range a.segs {
		n += s.Len
	}
	return n
}

// pair parses a script's "A+B" (ms).
func pair(t *testing.T, d *datadriven.TestData, key string) (float64, float64) {
	a, b, ok := strings.Cut(d.Str(key, "0+0"), "+")
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("%s: %s=%q, want A+B", d.Pos, key, d.Str(key, ""))
	}
	return x, y
}

// readScript reads the workloads of a sched script that uses new, add (ids 1, 2, … in
// order after each new), step and run: one per new. The script's cost model (itl=,
// prefill=A+B, decode=C+D) is the Timing of A ms + B ms a prompt token and C ms + D ms a
// decoding sequence.
func readScript(t *testing.T, path string) []scriptWorkload {
	t.Helper()
	cases, err := datadriven.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ws []scriptWorkload
	var w *scriptWorkload
	steps := 0
	for _, d := range cases {
		if d.Cmd != "new" && w == nil {
			t.Fatalf("%s: %s before new", d.Pos, d.Cmd)
		}
		switch d.Cmd {
		case "new":
			ws = append(ws, scriptWorkload{})
			w, steps = &ws[len(ws)-1], 0
			w.budget, w.seqs = d.Int(t, "budget", 16), d.Int(t, "seqs", 8)
			w.blocks, w.blockSize = d.Int(t, "blocks", 64), d.Int(t, "block-size", 4)
			if d.Has("itl") {
				w.timing.PrefillBase, w.timing.PrefillPerToken = pair(t, d, "prefill")
				w.timing.DecodeBase, w.timing.DecodePerSeq = pair(t, d, "decode")
				if k, ok := strings.CutSuffix(d.Str("itl", ""), "x"); ok {
					if w.itlDecodes, err = strconv.ParseFloat(k, 64); err != nil {
						t.Fatalf("%s: itl=%sx", d.Pos, k)
					}
				} else {
					w.itl = time.Duration(d.Int(t, "itl", 0)) * time.Millisecond
				}
			}
		case "add":
			a := scriptArrival{id: d.Int(t, "id", 0), out: d.Int(t, "out", 1), prio: d.Int(t, "prio", 0), after: steps}
			if a.id != len(w.arrivals)+1 {
				t.Fatalf("%s: id %d; the engine numbers requests 1, 2, … in order", d.Pos, a.id)
			}
			n, shared := d.Int(t, "prompt", 0), 0
			if p := d.Str("prefix", ""); p != "" {
				j, l, _ := strings.Cut(p, ":")
				jj, err1 := strconv.Atoi(j)
				ll, err2 := strconv.Atoi(l)
				if err1 != nil || err2 != nil || jj < 1 || jj >= a.id {
					t.Fatalf("%s: prefix=%q", d.Pos, p)
				}
				shared = ll
				for _, s := range w.arrivals[jj-1].segs { // the first shared tokens of jj's prompt
					if m := min(s.Len, ll); m > 0 {
						a.segs = append(a.segs, bench.Segment{Seed: s.Seed, Len: m})
						ll -= m
					}
				}
			}
			if n > shared {
				a.segs = append(a.segs, bench.Segment{Seed: uint64(1000*len(ws) + a.id), Len: n - shared})
			}
			w.arrivals = append(w.arrivals, a)
		case "step", "run":
			if d.Cmd == "step" {
				steps += d.Int(t, "n", 1)
			} else {
				steps = 1 << 30 // nothing may arrive after a run
			}
			for _, l := range strings.Split(d.Expected, "\n") {
				if !strings.HasPrefix(l, "step ") {
					continue
				}
				if w.itl > 0 || w.itlDecodes > 0 { // "step N: PLAN (TIME)"
					i := strings.LastIndex(l, " (")
					dur, err := time.ParseDuration(strings.TrimSuffix(l[i+2:], ")"))
					if i < 0 || err != nil {
						t.Fatalf("%s: %q has no predicted time", d.Pos, l)
					}
					l = l[:i]
					w.times = append(w.times, dur)
				}
				w.plans = append(w.plans, l)
			}
		case "state":
		default:
			t.Fatalf("%s: %s cannot be replayed through the engine and the simulator", d.Pos, d.Cmd)
		}
		d.CheckArgs(t)
	}
	for _, w := range ws {
		if w.blocks == 0 || len(w.arrivals) == 0 || len(w.plans) == 0 {
			t.Fatalf("%s: a new without add or step", path)
		}
	}
	return ws
}

// TestEngineAndSimulatorScheduleAlike is the check that the simulator schedules as the
// engine does: sched scripts' workloads through the engine (on a sim Step, on a virtual
// clock) and through the simulator's worker give, step by step, the plans the script
// prints: preemption and resume (parity.txt), and prompt chunks cut to an ITL target by
// the step cost, with the steps over it (itl.txt), which the engine also counts in its
// Stats.
func TestEngineAndSimulatorScheduleAlike(t *testing.T) {
	preempted, over := false, false
	for _, name := range []string{"parity.txt", "itl.txt"} {
		for k, w := range readScript(t, filepath.Join("..", "..", "sched", "testdata", name)) {
			fromEngine, overs := engineSchedule(t, w)
			fromSim := simSchedule(t, w)
			for i := range max(len(w.plans), len(fromEngine), len(fromSim)) {
				at := func(p []string) string {
					if i < len(p) {
						return p[i]
					}
					return "(none)"
				}
				if at(fromEngine) != at(w.plans) || at(fromSim) != at(w.plans) {
					t.Errorf("%s, scheduler %d, step %d:\n script    %s\n engine    %s\n simulator %s", name, k+1, i+1, at(w.plans), at(fromEngine), at(fromSim))
				}
			}
			want := uint64(0)
			for _, p := range w.plans {
				preempted = preempted || strings.Contains(p, "preempt")
				if strings.Contains(p, "over target") {
					want++
				}
			}
			over = over || want > 0
			if overs != want {
				t.Errorf("%s, scheduler %d: the engine counts %d steps over the target, the script %d", name, k+1, overs, want)
			}
		}
	}
	if !preempted || !over {
		t.Errorf("the scripts preempt (%v) or go over the target (%v) nowhere; the test does not compare them", preempted, over)
	}
}

// engineSchedule runs w through an engine on a Step and returns its plans and the steps
// over the target its Stats count. The engine's step cost is the Step's timing, and it
// times the Step on the Step's virtual clock, so its live correction stays 1.
func engineSchedule(t *testing.T, w scriptWorkload) ([]string, uint64) {
	m := demoModel(t)
	vocab := m.Config.VocabSize
	timing := sim.Timing{DecodeBase: 1, PrefillPerToken: 0.1}
	if w.itl > 0 || w.itlDecodes > 0 {
		timing = w.timing
	}
	clock := &virtualClock{t: time.Unix(0, 0)}
	step, err := New(Config{Timing: timing, Vocab: vocab, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type sent struct {
		a scriptArrival
		s llm.Stream
	}
	streams := make(chan sent, len(w.arrivals))
	var plans []string
	var submitErr error
	var e *engine.Engine
	submit := func(after int) {
		for _, a := range w.arrivals {
			if a.after != after {
				continue
			}
			var prompt []int32
			var buf []uint32
			for _, s := range a.segs {
				for _, tok := range s.Tokens(buf[:0]) {
					prompt = append(prompt, int32(tok%uint32(vocab)))
				}
			}
			s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: a.out, IgnoreEOS: true, Priority: a.prio})
			if err != nil {
				submitErr = errors.Join(submitErr, fmt.Errorf("request %d: %w", a.id, err))
				continue
			}
			streams <- sent{a, s}
		}
	}
	e, err = engine.NewWithForwarder(m, step, engine.Config{
		MaxBatchTokens: w.budget, MaxSeqs: w.seqs, KVBlocks: w.blocks, BlockSize: w.blockSize,
		ITLTarget: w.itl, ITLDecodes: w.itlDecodes, Cost: timing, StepClock: clock,
		// Called on Run's goroutine before the step's forward pass: requests sent now are
		// taken in before the next step, as the script's arrivals after this step.
		OnPlan: func(p fmt.Stringer) {
			plans = append(plans, fmt.Sprintf("step %d: %s", len(plans)+1, p))
			submit(len(plans))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	submit(0)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { e.Run(runCtx); close(done) }()
	for range w.arrivals {
		var r sent
		select {
		case r = <-streams:
		case <-ctx.Done():
			stop()
			<-done
			t.Fatalf("the engine did not take every request (%v); its plans:\n%s", submitErr, strings.Join(plans, "\n"))
			return nil, 0
		}
		n := 0
		for {
			_, err := r.s.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			n++
		}
		if n != r.a.out {
			t.Errorf("request %d: %d tokens, want %d", r.a.id, n, r.a.out)
		}
	}
	stop()
	<-done // plans are written by Run's goroutine
	if submitErr != nil {
		t.Fatal(submitErr)
	}
	return plans, e.Stats().StepsOverTarget
}

// simSchedule runs w through the simulator's one worker and returns its plans.
func simSchedule(t *testing.T, w scriptWorkload) []string {
	var reqs []sim.Request
	timing := sim.Timing{TransferBase: 1}
	for _, a := range w.arrivals {
		// Without a cost model every step takes 1 ns (a timing model that is zero for
		// compute), so the arrival after step k comes at k ns, before the step's end is
		// handled. With one, steps take their predicted time and the arrival after step k
		// comes 1 ns before its end.
		at := time.Duration(a.after)
		if w.itl > 0 || w.itlDecodes > 0 {
			timing, at = w.timing, 0
			for _, d := range w.times[:min(a.after, len(w.times))] {
				at += d
			}
			at = max(at-1, 0)
		}
		reqs = append(reqs, sim.Request{At: at, Segments: a.segs, OutputLen: a.out, Priority: a.prio})
	}
	rc := router.DefaultConfig()
	rc.Mode, rc.BusyKVUsage, rc.BusyWaiting = router.ModeRoundRobin, 0, 0 // nothing waits in the router
	var plans []string
	res, err := sim.Run(sim.Config{
		Workers: 1, Router: rc, Timing: timing, BlockSize: w.blockSize, KVBlocks: w.blocks,
		TokenBudget: w.budget, MaxSeqs: w.seqs, ITLTarget: w.itl, ITLDecodes: w.itlDecodes,
		OnPlan: func(_ int, p fmt.Stringer) { plans = append(plans, fmt.Sprintf("step %d: %s", len(plans)+1, p)) },
	}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range res.Bench.Requests {
		if !q.OK() || q.OutputLen != w.arrivals[i].out || q.InputLen != w.arrivals[i].promptLen() {
			t.Errorf("simulated request %d: error %q, %d of %d prompt tokens, %d of %d generated", i+1, q.Err,
				q.InputLen, w.arrivals[i].promptLen(), q.OutputLen, w.arrivals[i].out)
		}
	}
	return plans
}
