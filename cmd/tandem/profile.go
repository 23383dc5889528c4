package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/sim"
)

func profileCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem profile", flag.ContinueOnError)
	modelPath := fs.String("model", "", "GGUF file or Hugging Face directory (default: the built-in demo model)")
	out := fs.String("out", "", "write the fitted timing model (the JSON --sim-profile and tandem simulate --timing load) here (default: stdout)")
	backend := fs.String("backend", "cpu", "what to profile: cpu (the model's forward pass) or sim (the sim backend, to check that a profile gives its parameters back)")
	simProfile := fs.String("sim-profile", "", "with --backend sim: its timing model (gpu, cpu or a JSON file)")
	reps := fs.Int("r", 3, "repetitions of each step shape (the median counts)")
	threads := fs.Int("threads", 0, "worker threads (0: all cores)")
	dev := addDeviceFlag(fs)
	blockSize := fs.Int("block-size", engine.DefaultBlockSize, "KV block size in tokens")
	kvt := addKVTypeFlag(fs)
	maxBatch := fs.Int("max-batch-tokens", engine.DefaultMaxBatchTokens, "largest step to time, in tokens (the serving engine's budget)")
	maxSeqs := fs.Int("max-seqs", 32, "largest decode batch to time")
	transfers := fs.Bool("transfer", true, "with --backend cpu: also time KV-sized transfers (64 KiB to 64 MiB) over loopback ORPC and fit the transfer parameters")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem profile [--model FILE] [--out FILE] [-r 3] [--max-batch-tokens 512] [--max-seqs 32]")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	if *reps < 1 || *blockSize < 1 || *maxBatch < 16 || *maxSeqs < 1 {
		return fmt.Errorf("-r, --block-size and --max-seqs must be ≥ 1 and --max-batch-tokens ≥ 16")
	}
	kvType, err := kvt.parse()
	if err != nil {
		return err
	}
	var base sim.Timing
	switch *backend {
	case "cpu":
		if *simProfile != "" {
			return fmt.Errorf("--sim-profile needs --backend sim")
		}
		base = sim.CPUTiming() // the transfer parameters, which a forward pass does not tell
	case "sim":
		var err error
		if base, err = loadTiming(*simProfile); err != nil {
			return err
		}
		*threads = 1
	default:
		return fmt.Errorf("--backend %q: want cpu or sim", *backend)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	be, m, closeModel, err := openModel(*modelPath, dev, *threads, nil)
	if err != nil {
		return err
	}
	defer closeModel()
	m.KVType = kvType
	plan := simstep.DefaultPlan(m.Config.ContextLen, *maxBatch, *maxSeqs, *reps)
	var f engine.Forwarder
	if *backend == "sim" {
		if f, err = simstep.New(simstep.Config{Timing: base, Vocab: m.Config.VocabSize}); err != nil {
			return err
		}
	} else {
		m.Prefault(be, progressPrinter(stderr, "loading weights"))
		if f, err = engine.ModelForwarder(m, be, plan.Blocks(*blockSize), *blockSize); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "profiling %s (%s) on %s: %d prefill and %d decode shapes, %d repetitions each\n",
		modelName(*modelPath, m.Config.Name), *backend, be.Name(), len(plan.Prefill), len(plan.Decode), *reps)
	t0 := time.Now()
	var progress func(done, total int)
	if f, ok := stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			progress = func(done, total int) {
				fmt.Fprintf(stderr, "\r  %d/%d shapes", done, total)
				if done == total {
					fmt.Fprintln(stderr)
				}
			}
		}
	}
	samples, err := simstep.Profile(ctx, f, m.Config.VocabSize, *blockSize, plan, nil, progress)
	if err != nil {
		return err
	}
	var moved []sim.TransferSample
	if *transfers && *backend == "cpu" {
		if moved, err = profileTransfers(ctx, []int64{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}, *reps); err != nil {
			return err
		}
	}
	fit, err := sim.Fit(samples, moved, base)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "profiled in %.1f s\n\n%s", time.Since(t0).Seconds(), fitTable(samples, fit))
	for _, m := range moved {
		fmt.Fprintf(stderr, "transfer %8.2f MiB: %10s measured, %10s fitted\n", float64(m.Bytes)/(1<<20), m.Time.Round(time.Microsecond), fit.Transfer(m.Bytes).Round(time.Microsecond))
	}
	data, err := json.MarshalIndent(fit, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if *out == "" {
		_, err = stdout.Write(data)
		return err
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s\n", *out)
	return nil
}

// fitTable shows each profiled step beside the fitted model's prediction.
func fitTable(samples []sim.Sample, fit sim.Timing) string {
	s := fmt.Sprintf("| %-8s | %6s | %9s | %6s | %9s | %10s | %10s | %6s |\n", "step", "tokens", "Σn·ctx", "seqs", "KV tokens", "measured", "fitted", "error")
	s += "| -------- | -----: | --------: | -----: | --------: | ---------: | ---------: | -----: |\n"
	worst := 0.0
	for _, x := range samples {
		kind := "prefill"
		if x.Shape.PrefillTokens == 0 {
			kind = "decode"
		}
		p := fit.Step(x.Shape)
		e := float64(p-x.Time) / float64(x.Time)
		worst = max(worst, math.Abs(e))
		s += fmt.Sprintf("| %-8s | %6d | %9.0f | %6d | %9d | %10s | %10s | %+5.1f%% |\n", kind, x.Shape.PrefillTokens, x.Shape.PrefillQuad,
			x.Shape.DecodeSeqs, x.Shape.KVTokens, x.Time.Round(time.Microsecond), p.Round(time.Microsecond), 100*e)
	}
	return s + fmt.Sprintf("largest error %.1f%%\n", 100*worst)
}
