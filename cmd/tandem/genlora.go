package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"tandem/hal/cpu"
	"tandem/model"
)

// loraTargets are gen-lora's --targets names and the projections they update.
var loraTargets = map[string]model.TensorRole{
	"q": model.RoleQ, "k": model.RoleK, "v": model.RoleV, "o": model.RoleO,
	"gate": model.RoleGate, "up": model.RoleUp, "down": model.RoleDown,
}

func genLoRACmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem gen-lora", flag.ContinueOnError)
	modelPath := fs.String("model", "", "the base model (GGUF file or Hugging Face directory; required)")
	out := fs.String("out", "", "output: a GGUF adapter file, or with --format peft a directory (required)")
	format := fs.String("format", "gguf", "gguf (llama.cpp's adapter file) or peft (adapter_config.json + adapter_model.safetensors)")
	rank := fs.Int("rank", 8, "the adapter's rank")
	alpha := fs.Float64("alpha", 16, "LoRA alpha: the updates are scaled by alpha/rank")
	seed := fs.Uint64("seed", 1, "random seed for the weights")
	targets := fs.String("targets", "q,k,v,o,gate,up,down", "comma-separated projections to adapt: q, k, v, o, gate, up, down")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem gen-lora --model FILE --out PATH [--format gguf|peft] [--rank R] [--alpha A] [--targets q,v] [--seed N]")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) != 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	if *modelPath == "" || *out == "" {
		fs.Usage()
		return fmt.Errorf("--model and --out are required")
	}
	if *format != "gguf" && *format != "peft" {
		return fmt.Errorf("--format %q: want gguf or peft", *format)
	}
	var roles []model.TensorRole
	for _, t := range strings.Split(*targets, ",") {
		role, ok := loraTargets[strings.TrimSpace(t)]
		if !ok {
			return fmt.Errorf("--targets: unknown projection %q (want q, k, v, o, gate, up, down)", t)
		}
		roles = append(roles, role)
	}
	be := cpu.New(1)
	defer be.Close()
	m, err := model.Load(*modelPath, be)
	if err != nil {
		return err
	}
	defer m.Close()
	t0 := time.Now()
	a, err := model.RandomAdapter(m, *rank, float32(*alpha), *seed, roles...)
	if err != nil {
		return err
	}
	if *format == "peft" {
		err = a.WritePEFT(*out)
	} else {
		err = a.WriteGGUF(*out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s (%s, rank %d, %s, %.1f MiB) in %v\n", *out, *format, a.Rank, strings.Join(a.Targets, ","),
		float64(a.Bytes)/(1<<20), time.Since(t0).Round(time.Millisecond))
	return nil
}
