package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"

	"tandem/bench"
	"tandem/bench/loadgen"
)

// benchSLOFlag collects --goodput targets, repeatable and space- or
// comma-separated.
type benchSLOFlag struct{ slo bench.SLO }

func (f *benchSLOFlag) String() string     { return f.slo.String() }
func (f *benchSLOFlag) Set(s string) error { return f.slo.Add(s) }

// benchSLOArg matches a goodput target given as its own argument, as vLLM's
// `--goodput ttft:500 tpot:50` spreads them.
var benchSLOArg = regexp.MustCompile(`^(?i:ttft|tpot|e2el):[0-9.]+$`)

func benchCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem bench", flag.ContinueOnError)
	baseURL := fs.String("base-url", "http://127.0.0.1:8080", "server root (a trailing /v1 is fine)")
	model := fs.String("model", "", "model name to send (default: the first of GET /v1/models)")
	endpoint := fs.String("endpoint", "completions", "API to drive: completions or chat")
	apiKey := fs.String("api-key", os.Getenv("OPENAI_API_KEY"), "bearer token (default $OPENAI_API_KEY)")
	kind := fs.String("workload", "random", "workload: random, shared-prefix, multi-turn, sharegpt or mooncake")
	numPrompts := fs.Int("num-prompts", 0, "requests to send (default: random 1000, shared-prefix groups×per-group, multi-turn conversations×turns, sharegpt and mooncake the whole file)")
	seed := fs.Int64("seed", 0, "seed of the workload and of Poisson arrivals")
	datasetPath := fs.String("dataset-path", "", "ShareGPT JSON or Mooncake JSONL file (sharegpt, mooncake)")

	randIn := fs.Int("random-input-len", 1024, "random: mean prompt tokens (after the prefix)")
	randOut := fs.Int("random-output-len", 128, "random: mean output tokens")
	randRatio := fs.Float64("random-range-ratio", 0, "random and multi-turn: lengths uniform in [len·(1−r), len·(1+r)]")
	randPrefix := fs.Int("random-prefix-len", 0, "random: tokens every prompt starts with")

	spGroups := fs.Int("shared-prefix-groups", 64, "shared-prefix: groups (system prompts)")
	spPer := fs.Int("shared-prefix-prompts-per-group", 16, "shared-prefix: questions per group")
	spSys := fs.Int("shared-prefix-system-len", 2048, "shared-prefix: system prompt tokens")
	spQ := fs.Int("shared-prefix-question-len", 128, "shared-prefix: question tokens")
	spOut := fs.Int("shared-prefix-output-len", 256, "shared-prefix: output tokens")

	mtConv := fs.Int("multi-turn-conversations", 32, "multi-turn: conversations")
	mtTurns := fs.Int("multi-turn-turns", 4, "multi-turn: turns per conversation")
	mtSys := fs.Int("multi-turn-system-len", 0, "multi-turn: system prompt tokens at the start of each conversation")
	mtIn := fs.Int("multi-turn-input-len", 256, "multi-turn: new user tokens per turn")
	mtOut := fs.Int("multi-turn-output-len", 128, "multi-turn: output tokens per turn")
	mtThink := fs.Duration("multi-turn-think-time", 0, "multi-turn: pause between an answer and the next turn")

	sgOut := fs.Int("sharegpt-output-len", 256, "sharegpt: output tokens per request (the sample has no replies)")
	mcBlock := fs.Int("mooncake-block-size", bench.MooncakeBlockSize, "mooncake: replay tokens per trace hash id (less than 512 scales prompts down, keeping their reuse)")
	mcOut := fs.Int("mooncake-max-output-len", 0, "mooncake: cap the trace's output lengths (0: none)")

	rateStr := fs.String("request-rate", "inf", "requests (sessions) per second, or inf to send all at once")
	arrival := fs.String("arrival", "", "arrival process: poisson, constant or trace (default: trace for mooncake, else poisson)")
	burst := fs.Float64("burstiness", 1, "poisson: gamma shape of the gaps (1: Poisson; <1 burstier, >1 steadier)")
	speedup := fs.Float64("trace-speedup", 1, "trace: replay this many times faster than recorded")
	maxConc := fs.Int("max-concurrency", 0, "most requests in flight (0: no limit)")

	ignoreEOS := fs.Bool("ignore-eos", false, "send ignore_eos so every request generates its max_tokens")
	temp := fs.Float64("temperature", 0, "sampling temperature sent with each request")
	extra := fs.String("extra-body", "", "JSON object merged into every request body")
	timeout := fs.Duration("timeout", 0, "per-request timeout (0: none)")
	warmups := fs.Int("warmups", 1, "unmeasured short requests sent first, to check the server")
	var slo benchSLOFlag
	fs.Var(&slo, "goodput", "SLO targets in ms for goodput, e.g. \"ttft:500 tpot:50\" (keys ttft, tpot, e2el)")
	pcts := fs.String("metric-percentiles", "90,99", "percentiles to report, comma-separated")
	format := fs.String("prompt-format", "auto", "synthetic prompts as token ids (ids, completions only) or words (text); auto: ids for single-turn completions")
	tokenIDs := fs.String("token-ids", "auto", "token ids of ids prompts: auto (from the server's /tokenize, else 1000:10000) or LO:HI")

	jsonOut := fs.String("json-out", "", "write the summary and per-request arrays as JSON to this file")
	plotDir := fs.String("plot-dir", "", "write SVG charts (latency histograms and CDFs, throughput over time) to this directory")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem bench [--base-url URL] [--model NAME] [--workload KIND] [flags]")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args, stderr)
	if err != nil {
		return err
	}
	for _, p := range pos {
		if !benchSLOArg.MatchString(p) {
			fs.Usage()
			return fmt.Errorf("unexpected argument %q", p)
		}
		if err := slo.Set(p); err != nil {
			return err
		}
	}

	cfg := loadgen.Config{
		BaseURL: *baseURL, Model: *model, Endpoint: bench.Endpoint(*endpoint), APIKey: *apiKey,
		Arrival: bench.Arrival(*arrival), Burstiness: *burst, TraceSpeedup: *speedup, MaxConcurrency: *maxConc,
		IgnoreEOS: *ignoreEOS, Temperature: *temp, Timeout: *timeout, Warmups: *warmups, SLO: slo.slo, Seed: *seed,
		Log: stderr,
	}
	if cfg.RequestRate, err = benchParseRate(*rateStr); err != nil {
		return err
	}
	if *format != "auto" {
		cfg.PromptFormat = bench.PromptFormat(*format)
	}
	if *tokenIDs != "auto" {
		lo, hi, ok := strings.Cut(*tokenIDs, ":")
		l, err1 := strconv.ParseInt(lo, 10, 32)
		h, err2 := strconv.ParseInt(hi, 10, 32)
		if !ok || err1 != nil || err2 != nil || l < 0 || h <= l || h-l > 1<<24 {
			return fmt.Errorf("--token-ids %q: want auto or LO:HI with 0 ≤ LO < HI", *tokenIDs)
		}
		for id := l; id < h; id++ {
			cfg.TokenIDs = append(cfg.TokenIDs, int32(id))
		}
	}
	if *extra != "" {
		if err := json.Unmarshal([]byte(*extra), &cfg.ExtraBody); err != nil {
			return fmt.Errorf("--extra-body: want a JSON object: %v", err)
		}
	}
	for _, f := range strings.Split(*pcts, ",") {
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return fmt.Errorf("--metric-percentiles: %q is not a number", f)
		}
		cfg.Percentiles = append(cfg.Percentiles, p)
	}

	switch *kind {
	case "random":
		cfg.Workload, err = bench.Random(bench.RandomOptions{N: cmp.Or(*numPrompts, 1000), InputLen: *randIn, OutputLen: *randOut,
			RangeRatio: *randRatio, PrefixLen: *randPrefix, Seed: *seed})
	case "shared-prefix":
		if *spGroups <= 0 || *spPer <= 0 || *spSys <= 0 || *spQ <= 0 || *spOut <= 0 {
			return fmt.Errorf("shared-prefix: groups, prompts per group and the system, question and output lengths must be positive")
		}
		cfg.Workload, err = bench.SharedPrefix(bench.SharedPrefixOptions{Groups: *spGroups, PromptsPerGroup: *spPer,
			SystemLen: *spSys, QuestionLen: *spQ, OutputLen: *spOut, N: *numPrompts, Seed: *seed})
	case "multi-turn":
		conv := *mtConv
		if *numPrompts > 0 && *mtTurns > 0 {
			conv = (*numPrompts + *mtTurns - 1) / *mtTurns
		}
		cfg.Workload, err = bench.MultiTurn(bench.MultiTurnOptions{Conversations: conv, Turns: *mtTurns, SystemLen: *mtSys,
			InputLen: *mtIn, OutputLen: *mtOut, RangeRatio: *randRatio, Think: *mtThink, Seed: *seed})
	case "sharegpt":
		var prompts []string
		if prompts, err = benchReadDataset(*datasetPath, bench.ParseShareGPT); err == nil {
			cfg.Workload, err = bench.ShareGPT(prompts, *numPrompts, *sgOut, *seed)
		}
	case "mooncake":
		var rows []bench.TraceRow
		if rows, err = benchReadDataset(*datasetPath, bench.ParseMooncake); err == nil {
			cfg.Workload, err = bench.Mooncake(rows, bench.MooncakeOptions{N: *numPrompts, BlockSize: *mcBlock, MaxOutputLen: *mcOut, Seed: *seed})
		}
	default:
		return fmt.Errorf("unknown --workload %q (want random, shared-prefix, multi-turn, sharegpt or mooncake)", *kind)
	}
	if err != nil {
		return err
	}
	if benchIsTerminal(stderr) {
		cfg.Progress = stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := res.WriteTable(stdout); err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := benchWriteFile(*jsonOut, res.WriteJSON); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s\n", *jsonOut)
	}
	if *plotDir != "" {
		paths, err := bench.WritePlots(*plotDir, res)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s\n", strings.Join(paths, ", "))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %d of %d requests not measured", res.Interrupted, res.NumPrompts)
	}
	return nil
}

func benchParseRate(s string) (float64, error) {
	if strings.EqualFold(s, "inf") {
		return math.Inf(1), nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r > 0) {
		return 0, fmt.Errorf("--request-rate %q: want a positive number or inf", s)
	}
	return r, nil
}

func benchReadDataset[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	var zero T
	if path == "" {
		return zero, fmt.Errorf("this workload needs --dataset-path")
	}
	f, err := os.Open(path)
	if err != nil {
		return zero, err
	}
	defer f.Close()
	return parse(f)
}

func benchWriteFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func benchIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
