package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"tandem/engine"
)

type benchResult struct {
	Model           string    `json:"model"`
	ModelType       string    `json:"model_type"`
	SizeBytes       int64     `json:"model_size"`
	Backend         string    `json:"backend"`
	Threads         int       `json:"n_threads"`
	Test            string    `json:"test"`
	NPrompt         int       `json:"n_prompt"`
	NGen            int       `json:"n_gen"`
	NSeqs           int       `json:"n_seqs"`
	NDepth          int       `json:"n_depth"`
	KVType          string    `json:"type_kv"` // the KV cache's element type, F32 or F16
	TokensPerSecond float64   `json:"tokens_per_second"`
	Stddev          float64   `json:"stddev_tokens_per_second"`
	Samples         []float64 `json:"samples_tokens_per_second"`
	// CPUSamples are tokens per second of process CPU time (user+system)
	// times the thread count: an upper bound on what the test reaches with
	// its cores to itself (it assumes every thread busy throughout), which
	// on a shared machine the wall clock hides.
	CPUSamples []float64 `json:"samples_tokens_per_cpu_second_x_threads,omitempty"`
	// A device backend's steps over the test's runs: how many, how many were
	// replays of a recorded command buffer, and the host's time per step.
	Steps           int64   `json:"steps,omitempty"`
	Replays         int64   `json:"replayed_steps,omitempty"`
	HostUSPerStep   float64 `json:"host_us_per_step,omitempty"`
	SubmitUSPerStep float64 `json:"submit_us_per_step,omitempty"`
	benchMemory
}

// benchMemory is the process's resident memory after a test against what
// issue 4's target allows for: the weight file's size plus the KV store the
// tests share.
type benchMemory struct {
	RSSBytes     int64   `json:"rss_bytes,omitempty"`      // VmRSS after the test
	RSSPeakBytes int64   `json:"rss_peak_bytes,omitempty"` // VmHWM so far, loading included
	WeightsBytes int64   `json:"weights_bytes"`            // the weight file(s), metadata included
	KVBytes      int64   `json:"kv_bytes"`
	OverPct      float64 `json:"rss_over_weights_kv_pct"` // RSS / (weights + KV) − 1, in percent
	LoadSeconds  float64 `json:"load_seconds"`            // opening the model and preparing its weights
}

func measureMemory(weights, kv int64, load time.Duration) benchMemory {
	rss, peak := residentBytes()
	m := benchMemory{RSSBytes: rss, RSSPeakBytes: peak, WeightsBytes: weights, KVBytes: kv, LoadSeconds: load.Seconds()}
	if rss > 0 {
		m.OverPct = 100 * (float64(rss)/float64(weights+kv) - 1)
	}
	return m
}

func (m benchMemory) String() string {
	if m.RSSBytes == 0 {
		return fmt.Sprintf("weight file %s + KV %s; resident memory unknown here; load %.2fs", formatBytes(m.WeightsBytes), formatBytes(m.KVBytes), m.LoadSeconds)
	}
	return fmt.Sprintf("resident memory %s (peak %s) = weight file %s + KV %s %+.1f%%; load %.2fs",
		formatBytes(m.RSSBytes), formatBytes(m.RSSPeakBytes), formatBytes(m.WeightsBytes), formatBytes(m.KVBytes), m.OverPct, m.LoadSeconds)
}

func benchEngineCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem bench-engine", flag.ContinueOnError)
	modelPath := fs.String("model", "", "GGUF file or Hugging Face directory (default: the built-in demo model)")
	prompt := fs.Int("p", 512, "prompt tokens for the prompt-processing test (0 skips it)")
	gen := fs.Int("n", 64, "generated tokens for the generation tests (0 skips them)")
	depth := fs.Int("d", 0, "context depth: every test starts after this many positions of context (random keys and values), as llama-bench's -d")
	batches := fs.String("batch", "4,16", "comma-separated sequence counts for batched decode")
	reps := fs.Int("r", 3, "repetitions of each test")
	threads := fs.Int("threads", 0, "worker threads (0: all cores)")
	dev := addDeviceFlag(fs)
	replay := fs.Bool("replay", true, "with --device vulkan: replay the recorded command buffer of a step shape (false: record and run every step's ops, to measure what replay saves)")
	kvt := addKVTypeFlag(fs)
	asJSON := fs.Bool("json", false, "print a JSON array instead of a table")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the tests to this file")
	memProfile := fs.String("memprofile", "", "write a heap profile taken after the tests to this file")
	packCache := fs.String("pack-cache", "", "map the prepared (packed) weights from this directory, writing them there first if they are not (as tandem serve --pack-cache)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem bench-engine [--model FILE] [-p 512] [-n 64] [--batch 4,16] [-r 3] [--json]")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	var seqCounts []int
	for _, f := range strings.Split(*batches, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return fmt.Errorf("--batch: %q is not a positive count", f)
		}
		seqCounts = append(seqCounts, n)
	}
	if *reps < 1 || *prompt < 0 || *gen < 0 || *depth < 0 {
		return fmt.Errorf("-r must be ≥ 1 and -p, -n, -d ≥ 0")
	}
	kvType, err := kvt.parse()
	if err != nil {
		return err
	}
	t0 := time.Now()
	dev.noReplay = !*replay
	be, m, closeModel, err := openModel(*modelPath, dev, *threads, nil)
	if err != nil {
		return err
	}
	defer closeModel()
	m.KVType = kvType
	if *packCache != "" {
		if err := benchPackCache(*packCache, *modelPath, be, m, stderr); err != nil {
			return err
		}
	}
	m.Prefault(be, nil)
	loadTime := time.Since(t0)
	fileBytes := weightFileBytes(*modelPath, m.WeightBytes)
	if need := *depth + max(*prompt, *gen); need > m.Config.ContextLen {
		return fmt.Errorf("tests need %d positions but the context is %d", need, m.Config.ContextLen)
	}
	ob := engine.NewOfflineBench(m, be)
	ob.Depth = *depth
	at := "" // the test names' depth suffix, as llama-bench writes it
	if *depth > 0 {
		at = fmt.Sprintf(" @ d%d", *depth)
	}
	// One KV store, for the test that needs the most positions, serves
	// them all: its size is the run's KV budget.
	shapes := []engine.KVShape{{Seqs: 1, Positions: max(*prompt, *gen)}}
	if *gen > 0 {
		for _, n := range seqCounts {
			shapes = append(shapes, engine.KVShape{Seqs: n, Positions: *gen})
		}
	}
	if err := ob.Reserve(shapes...); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	base := benchResult{Model: modelName(*modelPath, m.Config.Name), ModelType: m.Config.Arch + " " + m.FileType,
		SizeBytes: m.WeightBytes, Backend: backendKind(be), Threads: backendThreads(be)}
	var results []benchResult
	run := func(test string, np, ng, seqs int, f func() (time.Duration, error)) error {
		r := base
		r.Test, r.NPrompt, r.NGen, r.NSeqs, r.NDepth, r.KVType = test+at, np, ng, seqs, *depth, kvType.String()
		if _, err := f(); err != nil { // warm-up, as llama-bench does
			return err
		}
		s0 := deviceSteps(be)
		for range *reps {
			c0 := cpuSeconds()
			d, err := f()
			if err != nil {
				return err
			}
			r.Samples = append(r.Samples, float64(max(np, ng*seqs))/d.Seconds())
			if c := cpuSeconds() - c0; c > 0 {
				r.CPUSamples = append(r.CPUSamples, float64(max(np, ng*seqs))/c*float64(backendThreads(be)))
			}
		}
		if s1 := deviceSteps(be); s1.Steps > s0.Steps {
			r.Steps, r.Replays = s1.Steps-s0.Steps, s1.Replays-s0.Replays
			r.HostUSPerStep = float64((s1.HostTime - s0.HostTime).Microseconds()) / float64(r.Steps)
			r.SubmitUSPerStep = float64((s1.SubmitTime - s0.SubmitTime).Microseconds()) / float64(r.Steps)
		}
		r.TokensPerSecond, r.Stddev = meanStddev(r.Samples)
		r.benchMemory = measureMemory(fileBytes, ob.KVBytes(), loadTime)
		results = append(results, r)
		return nil
	}
	if *prompt > 0 {
		if err := run(fmt.Sprintf("pp%d", *prompt), *prompt, 0, 1, func() (time.Duration, error) { return ob.Prompt(*prompt) }); err != nil {
			return err
		}
	}
	if *gen > 0 {
		if err := run(fmt.Sprintf("tg%d", *gen), 0, *gen, 1, func() (time.Duration, error) { return ob.Decode(1, *gen) }); err != nil {
			return err
		}
		for _, n := range seqCounts {
			if err := run(fmt.Sprintf("batch%d", n), 0, *gen, n, func() (time.Duration, error) { return ob.Decode(n, *gen) }); err != nil {
				return err
			}
		}
	}
	// Resident memory after the tests against the weights plus the KV
	// store: packed copies replace the file's pages (see
	// docs/architecture.md).
	mem := measureMemory(fileBytes, ob.KVBytes(), loadTime)
	if *memProfile != "" {
		if err := writeHeapProfile(*memProfile); err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
	}
	if *asJSON {
		fmt.Fprintln(stderr, mem) // the table carries it otherwise
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	tw := 8 // the test column: "batch16 @ d2048" with a depth
	for _, r := range results {
		tw = max(tw, len(r.Test))
	}
	fmt.Fprintf(stdout, "| %-28s | %-14s | %10s | %-10s | %7s | %-4s | %*s | %18s |\n", "model", "type", "size", "backend", "threads", "kv", tw, "test", "t/s")
	fmt.Fprintf(stdout, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", strings.Repeat("-", 28), strings.Repeat("-", 14), strings.Repeat("-", 10), strings.Repeat("-", 10), strings.Repeat("-", 7), strings.Repeat("-", 4), strings.Repeat("-", tw), strings.Repeat("-", 18))
	for _, r := range results {
		fmt.Fprintf(stdout, "| %-28s | %-14s | %10s | %-10s | %7d | %-4s | %*s | %9.2f ± %6.2f |\n", trunc(r.Model, 28), r.ModelType, formatBytes(r.SizeBytes), r.Backend, r.Threads, r.KVType, tw, r.Test, r.TokensPerSecond, r.Stddev)
	}
	fmt.Fprintf(stdout, "\n%s\n", mem)
	if deviceSteps(be).Steps > 0 {
		fmt.Fprintf(stdout, "device: %s\n", be.Name())
	}
	for _, r := range results {
		if r.Steps > 0 {
			fmt.Fprintf(stdout, "%s: %d steps, %d replayed; host %.1f µs a step (recording the ops or writing a replay's inputs, reading the logits), %.1f µs in vkQueueSubmit\n",
				r.Test, r.Steps, r.Replays, r.HostUSPerStep, r.SubmitUSPerStep)
		}
	}
	return nil
}

func meanStddev(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	if len(xs) > 1 {
		sd = math.Sqrt(sd / float64(len(xs)-1))
	}
	return mean, sd
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// weightFileBytes is the size of the model's weight file: the GGUF file,
// or a Hugging Face directory's safetensors files; tensorBytes for the
// built-in demo model, which has none.
func weightFileBytes(path string, tensorBytes int64) int64 {
	st, err := os.Stat(path)
	if path == "" || err != nil {
		return tensorBytes
	}
	if !st.IsDir() {
		return st.Size()
	}
	files, _ := filepath.Glob(filepath.Join(path, "*.safetensors"))
	var n int64
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			n += st.Size()
		}
	}
	if n == 0 {
		return tensorBytes
	}
	return n
}

// writeHeapProfile writes the live heap, as of a collection run now, to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
