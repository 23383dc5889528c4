package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"tandem/bench"
	"tandem/router"
	"tandem/sim"
)

func simulateCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem simulate", flag.ContinueOnError)
	tracePath := fs.String("trace", "", "Mooncake trace (JSONL: timestamp ms, input_length, output_length, hash_ids of 512-token blocks)")
	workers := fs.Int("workers", 4, "simulated workers")
	routing := fs.String("routing", "kv", "routing mode: kv, round-robin, random or least-loaded")
	jsonOut := fs.String("json-out", "", "write the JSON report (tandem bench's, plus hit rate and imbalance) here")
	timingPath := fs.String("timing", "gpu", "timing model: gpu (≈8B on an H100), cpu (≈0.5B on 2 cores) or a JSON file of sim.Timing (absent fields: gpu)")
	numPrompts := fs.Int("num-prompts", 0, "replay the first N rows of the trace (0: all)")
	traceBlock := fs.Int("trace-block-size", bench.MooncakeBlockSize, "tokens per trace hash id; less than 512 scales prompts down, keeping their reuse")
	maxOut := fs.Int("max-output-len", 0, "cap the trace's output lengths (0: none)")
	blockSize := fs.Int("block-size", 16, "KV block size of the simulated workers and the router, in tokens")
	kvBlocks := fs.Int("kv-blocks", 28672, "KV blocks per worker")
	budget := fs.Int("max-num-batched-tokens", 8192, "token budget of a step")
	maxSeqs := fs.Int("max-num-seqs", 256, "running sequences per worker")
	reportEvery := fs.Duration("report-interval", 100*time.Millisecond, "load report interval (virtual time)")
	reportDelay := fs.Duration("report-delay", 0, "how long a load report takes to reach the router")
	eventDelay := fs.Duration("event-delay", 0, "how long a KV event takes to reach the router")
	overlapW := fs.Float64("overlap-weight", router.DefaultConfig().OverlapWeight, "kv: weight of prefill blocks against decode blocks")
	temp := fs.Float64("router-temperature", 0, "kv: softmax temperature (0: cheapest worker)")
	busyWaiting := fs.Int("busy-waiting", router.DefaultConfig().BusyWaiting, "a worker with this many requests before their first token takes no more (0: no limit)")
	seed := fs.Int64("seed", 0, "seed of the router's RNG (random mode, softmax) and of the trace's tokens")
	pcts := fs.String("metric-percentiles", "90,99", "percentiles to report, comma-separated")
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	if *tracePath == "" {
		return fmt.Errorf("--trace is required")
	}
	mode, err := router.ParseMode(*routing)
	if err != nil {
		return err
	}
	var timing sim.Timing
	switch *timingPath {
	case "gpu", "":
		timing = sim.GPUTiming()
	case "cpu":
		timing = sim.CPUTiming()
	default:
		f, err := os.Open(*timingPath)
		if err != nil {
			return err
		}
		timing, err = sim.ReadTiming(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	var percentiles []float64
	for _, f := range strings.Split(*pcts, ",") {
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || p < 0 || p > 100 {
			return fmt.Errorf("--metric-percentiles: %q is not a percentile", f)
		}
		percentiles = append(percentiles, p)
	}
	if *reportDelay < 0 || *eventDelay < 0 {
		return fmt.Errorf("--report-delay and --event-delay must be ≥ 0")
	}
	if *workers < 1 || *blockSize < 1 || *kvBlocks < 1 || *budget < 1 || *maxSeqs < 1 || *reportEvery <= 0 || *traceBlock < 1 {
		return fmt.Errorf("--workers, --block-size, --kv-blocks, --max-num-batched-tokens, --max-num-seqs, --report-interval and --trace-block-size must be positive")
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
	wl, err := bench.Mooncake(rows, bench.MooncakeOptions{N: *numPrompts, BlockSize: *traceBlock, MaxOutputLen: *maxOut, Seed: *seed})
	if err != nil {
		return err
	}
	reqs, err := sim.FromWorkload(wl)
	if err != nil {
		return err
	}
	rc := router.DefaultConfig()
	rc.Mode, rc.OverlapWeight, rc.Temperature, rc.BusyWaiting = mode, *overlapW, *temp, *busyWaiting
	start := time.Now()
	res, err := sim.Run(sim.Config{
		Workers: *workers, Router: rc, Timing: timing, BlockSize: *blockSize, KVBlocks: *kvBlocks,
		TokenBudget: *budget, MaxSeqs: *maxSeqs, ReportInterval: *reportEvery, ReportDelay: *reportDelay, EventDelay: *eventDelay, Seed: *seed, Percentiles: percentiles,
	}, reqs)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "simulated %d requests, %.0f s of virtual time, in %.1f s\n",
		len(reqs), res.Bench.Summary.Duration.Seconds(), time.Since(start).Seconds())
	if err := res.WriteTable(stdout); err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := benchWriteFile(*jsonOut, res.WriteJSON); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s\n", *jsonOut)
	}
	return nil
}
