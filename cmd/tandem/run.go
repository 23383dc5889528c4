package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"tandem/engine"
	"tandem/tokenizer"
)

// samplingFlags registers the sampling flags, named like the OpenAI API's
// fields, with llama.cpp's defaults.
func samplingFlags(fs *flag.FlagSet) func() (engine.SamplingParams, error) {
	temp := fs.Float64("temperature", 0.8, "sampling temperature; 0 is greedy")
	topP := fs.Float64("top-p", 0.95, "nucleus sampling: keep the smallest set of tokens whose probability reaches this (1 disables)")
	topK := fs.Int("top-k", 40, "keep only the k most likely tokens (0 disables)")
	minP := fs.Float64("min-p", 0.05, "drop tokens less likely than this fraction of the most likely one (0 disables)")
	rep := fs.Float64("repetition-penalty", 1, "penalty for tokens of the prompt and output (1 disables)")
	pres := fs.Float64("presence-penalty", 0, "penalty for tokens already generated, once")
	freq := fs.Float64("frequency-penalty", 0, "penalty for tokens already generated, per occurrence")
	seed := fs.Int64("seed", -1, "random seed (-1: random)")
	return func() (engine.SamplingParams, error) {
		p := engine.SamplingParams{
			Temperature:       float32(*temp),
			TopP:              float32(*topP),
			TopK:              *topK,
			MinP:              float32(*minP),
			RepetitionPenalty: float32(*rep),
			PresencePenalty:   float32(*pres),
			FrequencyPenalty:  float32(*freq),
		}
		if *seed >= 0 {
			p.Seed, p.HasSeed = uint64(*seed), true
		}
		return p, nil
	}
}

func runCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem run", flag.ContinueOnError)
	modelPath := fs.String("model", "", "GGUF file or Hugging Face model directory (default: the built-in demo model)")
	chat := fs.Bool("chat", false, "apply the model's chat template to the prompt (as a user message)")
	system := fs.String("system", "", "system message, with --chat")
	maxTokens := fs.Int("max-tokens", 256, "most tokens to generate")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating past end-of-generation tokens")
	threads := fs.Int("threads", 0, "worker threads (0: all cores)")
	dev := addDeviceFlag(fs)
	chunk := fs.Int("prefill-chunk", 512, "most prompt tokens per forward pass")
	kvt := addKVTypeFlag(fs)
	sampling := samplingFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem run [--model PATH] [flags] \"prompt\"")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args, stderr)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("want exactly one prompt argument, got %d", len(pos))
	}
	params, err := sampling()
	if err != nil {
		return err
	}
	if *maxTokens <= 0 {
		return fmt.Errorf("--max-tokens must be positive, got %d", *maxTokens)
	}
	kvType, err := kvt.parse()
	if err != nil {
		return err
	}

	t0 := time.Now()
	be, m, closeModel, err := openModel(*modelPath, dev, *threads, nil)
	if err != nil {
		return err
	}
	defer closeModel()
	m.KVType = kvType
	loadTime := time.Since(t0)

	text := pos[0]
	parseSpecial := false
	if *chat {
		var msgs []tokenizer.Message
		if *system != "" {
			msgs = append(msgs, tokenizer.Message{Role: "system", Content: *system})
		}
		msgs = append(msgs, tokenizer.Message{Role: "user", Content: text})
		if text, err = m.Tokenizer.ApplyChatTemplate(msgs, true); err != nil {
			return err
		}
		parseSpecial = true
	}
	prompt := m.Tokenizer.Encode(text, true, parseSpecial)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	out := bufio.NewWriter(stdout)
	dec := m.Tokenizer.NewStreamDecoder()
	g := engine.NewGenerator(m, be)
	g.ChunkSize = *chunk
	req := &engine.Request{Prompt: prompt, Params: params, MaxTokens: *maxTokens, IgnoreEOS: *ignoreEOS}
	res, err := g.Generate(ctx, req, func(t engine.Token) error {
		if m.Tokenizer.IsEOG(t.ID) && !*ignoreEOS {
			return nil
		}
		if _, err := io.WriteString(out, dec.Add(t.ID)); err != nil {
			return err
		}
		return out.Flush()
	})
	io.WriteString(out, dec.Flush())
	out.WriteString("\n")
	out.Flush()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	fmt.Fprintf(stderr, "\nmodel: %s (%s, %s), backend %s\n", m.Config.Name, m.Config.Arch, m.FileType, be.Name())
	fmt.Fprintf(stderr, "load time: %v\n", loadTime.Round(time.Millisecond))
	fmt.Fprintf(stderr, "prompt: %d tokens in %v, %.2f tokens/s\n", res.PromptTokens, res.PrefillTime.Round(time.Millisecond), rate(res.PromptTokens, res.PrefillTime))
	// The first generated token comes from the prompt pass; the rest each took a decode step.
	fmt.Fprintf(stderr, "generation: %d tokens in %v, %.2f tokens/s (finish: %s)\n", len(res.Tokens), res.DecodeTime.Round(time.Millisecond), rate(len(res.Tokens)-1, res.DecodeTime), res.FinishReason)
	return nil
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 || n <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
