package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
)

func tokenizeCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem tokenize", flag.ContinueOnError)
	modelPath := fs.String("model", "", "GGUF file or Hugging Face model directory (default: the built-in demo model)")
	special := fs.Bool("special", false, "match special-token text (like <|im_start|>) as special tokens")
	noBOS := fs.Bool("no-bos", false, "do not add the BOS token even when the model asks for it")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem tokenize [--model PATH] [--special] [--no-bos] \"text\"")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args, stderr)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("want exactly one text argument, got %d", len(pos))
	}
	_, m, closeModel, err := openModel(*modelPath, cpuDevice(), 1, nil)
	if err != nil {
		return err
	}
	defer closeModel()
	ids := m.Tokenizer.Encode(pos[0], !*noBOS, *special)
	if ids == nil {
		ids = []int32{}
	}
	out, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, string(out))
	return nil
}
