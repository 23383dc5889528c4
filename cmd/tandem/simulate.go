package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"tandem/bench"
	"tandem/kvcache"
	"tandem/router"
	"tandem/sim"
)

func simulateCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem simulate", flag.ContinueOnError)
	tracePath := fs.String("trace", "", "Mooncake trace (JSONL: timestamp ms, input_length, output_length, hash_ids of 512-token blocks)")
	kind := fs.String("workload", "mooncake", "mooncake (--trace, at its timestamps), shared-prefix or multi-turn (at --request-rate)")
	rate := fs.Float64("request-rate", math.Inf(1), "shared-prefix and multi-turn: sessions per second, Poisson (inf: all at once)")
	spGroups := fs.Int("shared-prefix-groups", 64, "shared-prefix: groups (system prompts)")
	spPer := fs.Int("shared-prefix-prompts-per-group", 16, "shared-prefix: questions per group")
	spSys := fs.Int("shared-prefix-system-len", 2048, "shared-prefix: system prompt tokens")
	spQ := fs.Int("shared-prefix-question-len", 128, "shared-prefix: question tokens")
	spOut := fs.Int("shared-prefix-output-len", 256, "shared-prefix: output tokens")
	mtConv := fs.Int("multi-turn-conversations", 32, "multi-turn: conversations")
	mtTurns := fs.Int("multi-turn-turns", 4, "multi-turn: turns per conversation")
	mtSys := fs.Int("multi-turn-system-len", 0, "multi-turn: system prompt tokens per conversation")
	mtIn := fs.Int("multi-turn-input-len", 256, "multi-turn: new user tokens per turn")
	mtOut := fs.Int("multi-turn-output-len", 128, "multi-turn: output tokens per turn")
	mtThink := fs.Duration("multi-turn-think-time", 0, "multi-turn: pause between an answer and the next turn")
	workers := fs.Int("workers", 4, "simulated workers (role both)")
	prefillWorkers := fs.Int("prefill-workers", 0, "disaggregated: workers of role prefill (with --decode-workers, instead of --workers)")
	decodeWorkers := fs.Int("decode-workers", 0, "disaggregated: workers of role decode (with --prefill-workers)")
	disaggMin := fs.Int("disagg-min-tokens", router.DefaultDisaggConfig().MinRemoteTokens, "disaggregated: prefill on a prefill worker only when the decode worker lacks at least this many prompt tokens")
	kvPerToken := fs.Int64("kv-bytes-per-token", 131072, "disaggregated: the model's KV bytes per token, which a transfer moves (131072: an 8B model in bf16)")
	routing := fs.String("routing", "kv", "routing mode: kv, round-robin, random or least-loaded")
	jsonOut := fs.String("json-out", "", "write the JSON report (tandem bench's, plus hit rate and imbalance) here")
	timingPath := fs.String("timing", "gpu", "timing model: gpu (≈8B on an H100), cpu (≈0.5B on 2 cores) or a JSON file of sim.Timing (absent fields: gpu)")
	numPrompts := fs.Int("num-prompts", 0, "replay the first N rows of the trace (0: all)")
	traceBlock := fs.Int("trace-block-size", bench.MooncakeBlockSize, "tokens per trace hash id; less than 512 scales prompts down, keeping their reuse")
	maxOut := fs.Int("max-output-len", 0, "cap the trace's output lengths (0: none)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem simulate [--trace FILE | --workload shared-prefix|multi-turn] [--workers N | --prefill-workers P --decode-workers D] [--routing MODE] [flags]")
		fs.PrintDefaults()
	}
	blockSize := fs.Int("block-size", 16, "KV block size of the simulated workers and the router, in tokens")
	kvBlocks := fs.Int("kv-blocks", 28672, "KV blocks per worker")
	budget := fs.Int("max-num-batched-tokens", 8192, "token budget of a step")
	maxSeqs := fs.Int("max-num-seqs", 256, "running sequences per worker")
	itlFlag := fs.String("itl-target", "0", "the workers' inter-token latency target, as tandem serve --itl-target (default there: "+defaultITLTarget+"): a step with decode tokens reads only the prompt tokens the timing model predicts within it; a duration, a multiple of the step's decodes alone, or 0 (none, as the vLLM defaults this simulator's other defaults follow)")
	reportEvery := fs.Duration("report-interval", 100*time.Millisecond, "load report interval (virtual time)")
	reportDelay := fs.Duration("report-delay", 0, "how long a load report takes to reach the router")
	eventDelay := fs.Duration("event-delay", 0, "how long a KV event takes to reach the router")
	overlapW := fs.Float64("overlap-weight", router.DefaultConfig().OverlapWeight, "kv: weight of prefill blocks against decode blocks")
	temp := fs.Float64("router-temperature", router.DefaultConfig().Temperature, "kv: softmax temperature over normalised costs (0: cheapest worker)")
	busyWaiting := fs.Int("busy-waiting", router.DefaultConfig().BusyWaiting, "a worker with this many requests before their first token takes no more (0: no limit)")
	seed := fs.Int64("seed", 0, "seed of the router's RNG (random mode, softmax) and of the trace's tokens")
	pcts := fs.String("metric-percentiles", "90,99", "percentiles to report, comma-separated")
	hostMem := fs.String("kv-host-memory", "", "per worker: a host-memory KV tier of this size, e.g. 512GB (docs/kv-tiers.md)")
	diskSize := fs.String("kv-disk-size", "", "per worker: a local-disk KV tier of this size, e.g. 4TB")
	sharedSize := fs.String("kv-shared-size", "", "a shared-directory KV tier that every worker reads, of this size")
	offload := fs.String("kv-offload", "write-back", "when KV blocks go to host memory: write-back or write-through")
	diskUses := fs.Int("kv-disk-min-uses", 2, "frequency filter: a block goes to disk only once used this many times")
	blockBytes := fs.String("kv-block-bytes", "2MiB", "bytes of one KV block of the modelled model (an 8B model's 16 tokens: 2MiB)")
	loadCosts := fs.String("tier-load-ms-per-mib", "", "measured time to load a MiB of KV from host memory, disk and the shared directory, comma-separated ms (default: a GPU server's 0.04,0.2,1)")
	peerPulls := fs.Bool("peer-pulls", false, "the router tells a worker to pull a prefix it lacks from the worker holding it, when pulling beats computing")
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	if *kind == "mooncake" && *tracePath == "" {
		return fmt.Errorf("--trace is required (or --workload shared-prefix or multi-turn)")
	}
	mode, err := router.ParseMode(*routing)
	if err != nil {
		return err
	}
	itl, err := parseITLTarget(*itlFlag)
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
	if (*prefillWorkers > 0) != (*decodeWorkers > 0) || *prefillWorkers < 0 || *decodeWorkers < 0 {
		return fmt.Errorf("--prefill-workers and --decode-workers go together: a disaggregated cluster needs both pools")
	}
	if *prefillWorkers > 0 {
		*workers = 0
		if *disaggMin < 0 || *kvPerToken < 1 {
			return fmt.Errorf("--disagg-min-tokens must be ≥ 0 and --kv-bytes-per-token positive")
		}
	} else if *workers < 1 {
		return fmt.Errorf("--workers must be positive")
	}
	if *blockSize < 1 || *kvBlocks < 1 || *budget < 1 || *maxSeqs < 1 || *reportEvery <= 0 || *traceBlock < 1 {
		return fmt.Errorf("--block-size, --kv-blocks, --max-num-batched-tokens, --max-num-seqs, --report-interval and --trace-block-size must be positive")
	}

	var wl bench.Workload
	switch *kind {
	case "mooncake":
		f, ferr := os.Open(*tracePath)
		if ferr != nil {
			return ferr
		}
		rows, perr := bench.ParseMooncake(f)
		f.Close()
		if perr != nil {
			return perr
		}
		wl, err = bench.Mooncake(rows, bench.MooncakeOptions{N: *numPrompts, BlockSize: *traceBlock, MaxOutputLen: *maxOut, Seed: *seed})
	case "shared-prefix":
		wl, err = bench.SharedPrefix(bench.SharedPrefixOptions{Groups: *spGroups, PromptsPerGroup: *spPer, SystemLen: *spSys,
			QuestionLen: *spQ, OutputLen: *spOut, N: *numPrompts, Seed: *seed})
	case "multi-turn":
		wl, err = bench.MultiTurn(bench.MultiTurnOptions{Conversations: *mtConv, Turns: *mtTurns, SystemLen: *mtSys,
			InputLen: *mtIn, OutputLen: *mtOut, Think: *mtThink, Seed: *seed})
	default:
		return fmt.Errorf("--workload %q: want mooncake, shared-prefix or multi-turn", *kind)
	}
	if err != nil {
		return err
	}
	var reqs []sim.Request
	if wl.Timed() {
		reqs, err = sim.FromWorkload(wl)
	} else {
		var at []time.Duration
		if at, err = bench.Schedule(bench.Poisson, wl.Sessions(), *rate, 1, 1, *seed); err == nil {
			reqs, err = sim.FromSessions(wl.Sessions(), at)
		}
	}
	if err != nil {
		return err
	}
	tiers, err := simTierFlags(*hostMem, *diskSize, *sharedSize, *offload, *diskUses, *blockBytes, *loadCosts)
	if err != nil {
		return err
	}
	rc := router.DefaultConfig()
	rc.Mode, rc.OverlapWeight, rc.Temperature, rc.BusyWaiting = mode, *overlapW, *temp, *busyWaiting
	rc.PeerPulls = *peerPulls
	start := time.Now()
	dis := router.DefaultDisaggConfig()
	dis.MinRemoteTokens = max(*disaggMin, 1)
	res, err := sim.Run(sim.Config{
		Workers: *workers, PrefillWorkers: *prefillWorkers, DecodeWorkers: *decodeWorkers, Disagg: dis, KVBytesPerToken: *kvPerToken,
		Router: rc, Timing: timing, BlockSize: *blockSize, KVBlocks: *kvBlocks,
		TokenBudget: *budget, MaxSeqs: *maxSeqs, ITLTarget: itl.abs, ITLDecodes: itl.decodes, ReportInterval: *reportEvery, ReportDelay: *reportDelay, EventDelay: *eventDelay, Seed: *seed, Percentiles: percentiles,
		Tiers: tiers,
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

// simTierFlags reads tandem simulate's tier flags into the simulated workers' tiers.
func simTierFlags(hostMem, diskSize, sharedSize, offload string, diskUses int, blockBytes, loadCosts string) (sim.TierModel, error) {
	var m sim.TierModel
	bb, err := parseBytes(blockBytes)
	if err != nil {
		return m, fmt.Errorf("--kv-block-bytes: %w", err)
	}
	m.BlockBytes = int(bb)
	blocks := func(flag, v string) (int, error) {
		if v == "" {
			return 0, nil
		}
		n, err := parseBytes(v)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", flag, err)
		}
		return int(n / bb), nil
	}
	if m.HostBlocks, err = blocks("--kv-host-memory", hostMem); err != nil {
		return m, err
	}
	if m.DiskBlocks, err = blocks("--kv-disk-size", diskSize); err != nil {
		return m, err
	}
	if m.SharedBlocks, err = blocks("--kv-shared-size", sharedSize); err != nil {
		return m, err
	}
	if m.Offload, err = kvcache.ParseOffload(offload); err != nil {
		return m, fmt.Errorf("--kv-offload: %w", err)
	}
	if diskUses < 1 {
		return m, fmt.Errorf("--kv-disk-min-uses %d: want 1 or more", diskUses)
	}
	m.DiskMinUses = diskUses
	if loadCosts != "" {
		parts := strings.Split(loadCosts, ",")
		if len(parts) != 3 {
			return m, fmt.Errorf("--tier-load-ms-per-mib %q: want three numbers (host, disk, shared)", loadCosts)
		}
		for i, p := range parts {
			v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil || v <= 0 || math.IsInf(v, 0) {
				return m, fmt.Errorf("--tier-load-ms-per-mib: %q is not a positive number of ms", p)
			}
			m.LoadMsPerMiB[i+1] = v
		}
	}
	return m, nil
}
