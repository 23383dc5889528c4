package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"tandem/bench"
	"tandem/planner"
	"tandem/planstudy"
	"tandem/router"
	"tandem/sim"
	"tandem/sla"
)

// planCmd is tandem plan: the simulator with the SLA planner in the loop, against fixed
// pools, aggregated and disaggregated, and the gate's verdict (docs/planner.md).
func planCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tracePath := fs.String("trace", "", "Mooncake trace (JSONL), replayed at its timestamps")
	kind := fs.String("workload", "mooncake", "mooncake (--trace), ramp (a Poisson rate that ramps up and back), multi-turn or shared-prefix (at --request-rate)")
	numPrompts := fs.Int("num-prompts", 0, "mooncake: the first N rows (0: all)")
	traceBlock := fs.Int("trace-block-size", bench.MooncakeBlockSize, "mooncake: tokens per trace hash id")
	speedup := fs.Float64("trace-speedup", 1, "mooncake: divide the timestamps by this")
	rate := fs.Float64("request-rate", 1, "multi-turn and shared-prefix: sessions per second, Poisson")
	mtConv := fs.Int("multi-turn-conversations", 1, "multi-turn: conversations")
	mtTurns := fs.Int("multi-turn-turns", 20, "multi-turn: turns per conversation")
	mtIn := fs.Int("multi-turn-input-len", 256, "multi-turn: new user tokens per turn")
	mtOut := fs.Int("multi-turn-output-len", 128, "multi-turn: output tokens per turn")
	mtThink := fs.Duration("multi-turn-think-time", 5*time.Second, "multi-turn: pause between an answer and the next turn")
	spGroups := fs.Int("shared-prefix-groups", 16, "shared-prefix: groups")
	spPer := fs.Int("shared-prefix-prompts-per-group", 16, "shared-prefix: questions per group")
	rp := rampFlags(fs)
	ttft := fs.Duration("sla-ttft", 2*time.Second, "time-to-first-token target")
	itl := fs.Duration("sla-itl", 50*time.Millisecond, "inter-token-latency target (a request's mean gap between tokens)")
	goal := fs.Float64("goal", 0.95, "the fraction of requests that must meet both targets")
	window := fs.Duration("window", 5*time.Minute, "a fixed pool meets the SLA at peak when every window of this length (by arrival) does")
	timingPath := fs.String("timing", "gpu", "one worker's performance model: gpu, cpu or a tandem profile JSON file")
	startups := fs.String("startup", "0,10s,60s,120s", "replica start-up times to plan with, comma-separated (the first for the main comparison)")
	mode := fs.String("mode", "both", "which deployments to compare: both, aggregated or disaggregated")
	maxWorkers := fs.Int("max-workers", 64, "most workers in a pool (and in all, for the planner's budget)")
	interval := fs.Duration("interval", time.Minute, "the planner's adjustment interval (throughput loop)")
	loadInterval := fs.Duration("load-interval", 5*time.Second, "the planner's load loop interval")
	predictor := fs.String("predictor", "kalman", "load predictor: "+strings.Join(planner.Predictors, ", "))
	kvBlocks := fs.Int("kv-blocks", 28672, "KV blocks per worker")
	blockSize := fs.Int("block-size", 16, "KV block size in tokens")
	budget := fs.Int("max-num-batched-tokens", 8192, "token budget of a step")
	maxSeqs := fs.Int("max-num-seqs", 256, "running sequences per worker")
	disaggMin := fs.Int("disagg-min-tokens", router.DefaultDisaggConfig().MinRemoteTokens, "disaggregated: prefill remotely only when the decode worker lacks at least this many prompt tokens")
	kvPerToken := fs.Int64("kv-bytes-per-token", 131072, "the model's KV bytes per token, which a transfer moves")
	seed := fs.Int64("seed", 0, "seed of the workload and the router")
	jsonOut := fs.String("json-out", "", "write every run's figures, the timeline and the verdict here")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem plan [--trace FILE | --workload ramp|multi-turn|shared-prefix] [--sla-ttft D] [--sla-itl D] [--timing FILE] [flags]")
		fmt.Fprintln(stderr, "\nRuns the simulator with the SLA planner in the loop and against fixed pools, and says whether the workload needs one engine, several behind the router, or disaggregated pools.")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	targets := sla.Targets{TTFT: *ttft, ITL: *itl}
	if err := targets.Check(); err != nil {
		return err
	}
	if !(*goal > 0 && *goal < 1) {
		return fmt.Errorf("--goal %v: want a fraction between 0 and 1", *goal)
	}
	var ups []time.Duration
	for _, f := range strings.Split(*startups, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if f = strings.TrimSpace(f); f == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			return fmt.Errorf("--startup: %q is not a duration", f)
		}
		ups = append(ups, d)
	}
	if *mode != "both" && *mode != "aggregated" && *mode != "disaggregated" {
		return fmt.Errorf("--mode %q: want both, aggregated or disaggregated", *mode)
	}
	if *maxWorkers < 1 || *kvBlocks < 1 || *blockSize < 1 || *budget < 1 || *maxSeqs < 1 || *window <= 0 || *kvPerToken < 1 {
		return errors.New("--max-workers, --kv-blocks, --block-size, --max-num-batched-tokens, --max-num-seqs, --window and --kv-bytes-per-token must be positive")
	}
	if _, err := planner.NewPredictor(*predictor); err != nil {
		return fmt.Errorf("--predictor: %w", err)
	}
	timing, err := loadTiming(*timingPath)
	if err != nil {
		return fmt.Errorf("--timing: %w", err)
	}

	var wl bench.Workload
	var reqs []sim.Request
	switch *kind {
	case "mooncake":
		if *tracePath == "" {
			return errors.New("--trace is required (or --workload ramp, multi-turn or shared-prefix)")
		}
		f, err := os.Open(*tracePath)
		if err != nil {
			return err
		}
		rows, err := bench.ParseMooncake(f)
		f.Close()
		if err != nil {
			return err
		}
		if wl, err = bench.Mooncake(rows, bench.MooncakeOptions{N: *numPrompts, BlockSize: *traceBlock, Seed: *seed}); err != nil {
			return err
		}
		if !(*speedup > 0) {
			return fmt.Errorf("--trace-speedup %v: want a positive factor", *speedup)
		}
		at, err := bench.Schedule(bench.Trace, wl.Sessions(), 0, 1, *speedup, *seed)
		if err != nil {
			return err
		}
		reqs, err = sim.FromSessions(wl.Sessions(), at)
		if err != nil {
			return err
		}
	case "ramp":
		if reqs, err = rp().Requests(*seed); err != nil {
			return err
		}
	case "multi-turn", "shared-prefix":
		if *kind == "multi-turn" {
			wl, err = bench.MultiTurn(bench.MultiTurnOptions{Conversations: *mtConv, Turns: *mtTurns, InputLen: *mtIn, OutputLen: *mtOut, Think: *mtThink, Seed: *seed})
		} else {
			wl, err = bench.SharedPrefix(bench.SharedPrefixOptions{Groups: *spGroups, PromptsPerGroup: *spPer, Seed: *seed})
		}
		if err != nil {
			return err
		}
		at, err := bench.Schedule(bench.Poisson, wl.Sessions(), *rate, 1, 1, *seed)
		if err != nil {
			return err
		}
		if reqs, err = sim.FromSessions(wl.Sessions(), at); err != nil {
			return err
		}
	default:
		return fmt.Errorf("--workload %q: want mooncake, ramp, multi-turn or shared-prefix", *kind)
	}
	if len(reqs) == 0 {
		return errors.New("the workload has no requests")
	}

	dis := router.DefaultDisaggConfig()
	dis.MinRemoteTokens = max(*disaggMin, 1)
	pcfg := planner.Config{SLA: targets, Goal: *goal, Interval: *interval, LoadInterval: *loadInterval, Predictor: *predictor,
		MaxTotal: *maxWorkers}
	for i := range pcfg.Bounds {
		pcfg.Bounds[i] = planner.Bounds{Min: 1, Max: *maxWorkers}
	}
	if err := pcfg.Validate(); err != nil && !strings.Contains(err.Error(), "performance model") {
		return err
	}
	p := planstudy.New(planstudy.Config{
		Requests: reqs, Targets: targets, Goal: *goal, Window: *window, MaxWorkers: *maxWorkers, Log: stderr,
		Base: sim.Config{Router: router.DefaultConfig(), Timing: timing, BlockSize: *blockSize, KVBlocks: *kvBlocks,
			TokenBudget: *budget, MaxSeqs: *maxSeqs, Disagg: dis, KVBytesPerToken: *kvPerToken, Seed: *seed},
		Planner: pcfg,
	})
	t0 := time.Now()
	rep, err := p.Run(*mode, ups)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "tandem plan: %d simulations in %.0f s\n", p.Sims(), time.Since(t0).Seconds())
	if err := rep.Write(stdout); err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := benchWriteFile(*jsonOut, func(w io.Writer) error { return json.NewEncoder(w).Encode(rep.JSON()) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s\n", *jsonOut)
	}
	return nil
}

// rampFlags are tandem plan's --ramp-* flags; the returned func reads them.
func rampFlags(fs *flag.FlagSet) func() planstudy.Ramp {
	r := struct {
		base, factor          *float64
		hold, up              *time.Duration
		input, output, system *int
		groups                *int
	}{
		base:   fs.Float64("ramp-base-rate", 2, "ramp: requests per second at the start and the end"),
		factor: fs.Float64("ramp-factor", 4, "ramp: the peak rate over the base rate"),
		hold:   fs.Duration("ramp-hold", 5*time.Minute, "ramp: time at the base rate before and after"),
		up:     fs.Duration("ramp-up", 10*time.Minute, "ramp: time to the peak (and as long back)"),
		input:  fs.Int("ramp-input-len", 3000, "ramp: mean prompt tokens"),
		output: fs.Int("ramp-output-len", 200, "ramp: mean output tokens"),
		system: fs.Int("ramp-system-len", 512, "ramp: system prompt tokens shared by a group of prompts"),
		groups: fs.Int("ramp-groups", 8, "ramp: system prompts"),
	}
	return func() planstudy.Ramp {
		return planstudy.Ramp{BaseRate: *r.base, Factor: *r.factor, Hold: *r.hold, Up: *r.up,
			InputLen: *r.input, OutputLen: *r.output, SystemLen: *r.system, Groups: *r.groups}
	}
}
