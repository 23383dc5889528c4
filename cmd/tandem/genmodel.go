package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"tandem/gguf"
	"tandem/modelgen"
)

func genModelCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem gen-model", flag.ContinueOnError)
	presetNames := make([]string, 0, len(modelgen.Presets))
	for name := range modelgen.Presets {
		presetNames = append(presetNames, name)
	}
	slices.Sort(presetNames)
	preset := fs.String("preset", "", "start from a real model's shape: "+strings.Join(presetNames, ", "))
	out := fs.String("out", "", "output GGUF file (required)")
	typ := fs.String("type", "f32", "file type: "+strings.Join(modelgen.FileTypes(), ", "))
	vocabFrom := fs.String("vocab-from", "", "copy the tokenizer from this GGUF file (default: a byte-level vocabulary)")
	seed := fs.Uint64("seed", 1, "random seed for the weights")
	arch := fs.String("arch", "", "architecture: llama, mistral, qwen2, qwen3")
	embd := fs.Int("embd", 0, "hidden size")
	layers := fs.Int("layers", 0, "number of blocks")
	heads := fs.Int("heads", 0, "attention heads")
	kvHeads := fs.Int("kv-heads", 0, "key/value heads (grouped-query attention)")
	headDim := fs.Int("head-dim", 0, "head size (default embd/heads)")
	ffn := fs.Int("ffn", 0, "feed-forward size")
	vocabSize := fs.Int("vocab-size", 0, "vocabulary rows (default: the tokenizer's size)")
	ctxLen := fs.Int("ctx", 0, "context length")
	ropeBase := fs.Float64("rope-base", 0, "RoPE frequency base")
	tied := fs.String("tied", "", "tie output and embedding weights: true or false")
	name := fs.String("name", "", "general.name to write")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem gen-model [--preset NAME] [shape flags] [--type T] [--vocab-from FILE] --out FILE")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) != 0 {
		return fmt.Errorf("unexpected arguments %q", pos)
	}
	if *out == "" {
		fs.Usage()
		return fmt.Errorf("--out is required")
	}
	spec := modelgen.Spec{Arch: "llama", ContextLen: 2048, RopeBase: 10000, NormEps: 1e-5, Tied: true}
	if *preset != "" {
		p, ok := modelgen.Presets[*preset]
		if !ok {
			return fmt.Errorf("unknown preset %q (known: %s)", *preset, strings.Join(presetNames, ", "))
		}
		spec = p
	}
	setStr(&spec.Arch, *arch)
	setStr(&spec.Name, *name)
	setInt(&spec.Embd, *embd)
	setInt(&spec.Layers, *layers)
	setInt(&spec.Heads, *heads)
	setInt(&spec.KVHeads, *kvHeads)
	setInt(&spec.FFN, *ffn)
	setInt(&spec.VocabSize, *vocabSize)
	setInt(&spec.ContextLen, *ctxLen)
	setInt(&spec.HeadDim, *headDim)
	if *ropeBase > 0 {
		spec.RopeBase = *ropeBase
	}
	switch *tied {
	case "":
	case "true":
		spec.Tied = true
	case "false":
		spec.Tied = false
	default:
		return fmt.Errorf("--tied must be true or false, got %q", *tied)
	}
	if spec.KVHeads == 0 {
		spec.KVHeads = spec.Heads
	}
	if spec.HeadDim == 0 && spec.Heads > 0 {
		spec.HeadDim = spec.Embd / spec.Heads
	}
	if spec.Arch == "qwen2" && *preset == "" {
		spec.QKVBias = true
	}
	if spec.Name == "" {
		spec.Name = fmt.Sprintf("random %s %dx%d", spec.Arch, spec.Layers, spec.Embd)
	}
	spec.Type = *typ
	spec.Seed = *seed
	if *vocabFrom != "" {
		f, err := gguf.Open(*vocabFrom)
		if err != nil {
			return fmt.Errorf("--vocab-from: %w", err)
		}
		defer f.Close()
		spec.Vocab = f
		if *vocabSize == 0 {
			spec.VocabSize = 0 // the real tokenizer decides
		}
	}
	t0 := time.Now()
	w, err := modelgen.Build(spec)
	if err != nil {
		return err
	}
	if err := w.WriteFile(*out); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s (%s, %s) in %v\n", *out, spec.Name, spec.Type, time.Since(t0).Round(time.Millisecond))
	return nil
}

func setStr(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

func setInt(dst *int, v int) {
	if v > 0 {
		*dst = v
	}
}
