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

// scriptWorkload is what a sched script asks for: the scheduler's sizes, the arrivals and
// the plans the script expects, one "step N: …" line each.
type scriptWorkload struct {
	budget, seqs, blocks, blockSize int
	arrivals                        []scriptArrival
	plans                           []string
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

// readScript reads the workload of a sched script that uses new, add (ids 1, 2, … in
// order), step and run.
func readScript(t *testing.T, path string) scriptWorkload {
	t.Helper()
	cases, err := datadriven.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var w scriptWorkload
	steps := 0
	for _, d := range cases {
		switch d.Cmd {
		case "new":
			w.budget, w.seqs = d.Int(t, "budget", 16), d.Int(t, "seqs", 8)
			w.blocks, w.blockSize = d.Int(t, "blocks", 64), d.Int(t, "block-size", 4)
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
				a.segs = append(a.segs, bench.Segment{Seed: uint64(1000 + a.id), Len: n - shared})
			}
			w.arrivals = append(w.arrivals, a)
		case "step", "run":
			if d.Cmd == "step" {
				steps += d.Int(t, "n", 1)
			} else {
				steps = 1 << 30 // nothing may arrive after a run
			}
			for _, l := range strings.Split(d.Expected, "\n") {
				if strings.HasPrefix(l, "step ") {
					w.plans = append(w.plans, l)
				}
			}
		case "state":
		default:
			t.Fatalf("%s: %s cannot be replayed through the engine and the simulator", d.Pos, d.Cmd)
		}
		d.CheckArgs(t)
	}
	if w.blocks == 0 || len(w.arrivals) == 0 || len(w.plans) == 0 {
		t.Fatalf("%s: no new, add or step", path)
	}
	return w
}

// TestEngineAndSimulatorScheduleAlike is the check that the simulator schedules as the
// engine does: one sched script's workload through the engine (on a sim Step, on a virtual
// clock) and through the simulator's worker (every step 1 ns of virtual time) gives, step
// by step, the plans the script prints, preemption and resume included.
func TestEngineAndSimulatorScheduleAlike(t *testing.T) {
	w := readScript(t, filepath.Join("..", "..", "sched", "testdata", "parity.txt"))
	fromEngine, fromSim := engineSchedule(t, w), simSchedule(t, w)
	for i := range max(len(w.plans), len(fromEngine), len(fromSim)) {
		at := func(p []string) string {
			if i < len(p) {
				return p[i]
			}
			return "(none)"
		}
		if at(fromEngine) != at(w.plans) || at(fromSim) != at(w.plans) {
			t.Errorf("step %d:\n script    %s\n engine    %s\n simulator %s", i+1, at(w.plans), at(fromEngine), at(fromSim))
		}
	}
	preempted := false
	for _, p := range w.plans {
		preempted = preempted || strings.Contains(p, "preempt")
	}
	if !preempted {
		t.Error("the script preempts nothing; the test does not compare preemptions")
	}
}

// engineSchedule runs w through an engine on a Step and returns its plans.
func engineSchedule(t *testing.T, w scriptWorkload) []string {
	m := demoModel(t)
	vocab := m.Config.VocabSize
	step, err := New(Config{Timing: sim.Timing{DecodeBase: 1, PrefillPerToken: 0.1}, Vocab: vocab, Clock: &virtualClock{t: time.Unix(0, 0)}})
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
	return plans
}

// simSchedule runs w through the simulator's one worker and returns its plans.
func simSchedule(t *testing.T, w scriptWorkload) []string {
	var reqs []sim.Request
	for _, a := range w.arrivals {
		// Every step takes 1 ns (a timing model that is zero for compute), so the arrival
		// after step k comes at k ns, before the step's end is handled.
		reqs = append(reqs, sim.Request{At: time.Duration(a.after), Segments: a.segs, OutputLen: a.out, Priority: a.prio})
	}
	rc := router.DefaultConfig()
	rc.Mode, rc.BusyKVUsage, rc.BusyWaiting = router.ModeRoundRobin, 0, 0 // nothing waits in the router
	var plans []string
	res, err := sim.Run(sim.Config{
		Workers: 1, Router: rc, Timing: sim.Timing{TransferBase: 1}, BlockSize: w.blockSize, KVBlocks: w.blocks,
		TokenBudget: w.budget, MaxSeqs: w.seqs,
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
