package cluster

import (
	"slices"
	"strings"
	"testing"

	"tandem/gguf"
	"tandem/internal/fixtures"
	"tandem/tokenizer"
)

// TestTokenizerCodec: the tokenizer a card carries decodes to one that encodes like the
// model file's own, and a card without one, or with an unknown format, is refused by name.
func TestTokenizerCodec(t *testing.T) {
	path := fixtures.Model(t, "rand-qwen2-qwen2vocab-f32.gguf")
	format, files, err := EncodeTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	card := &ModelCard{Model: "q", TokenizerFormat: format, TokenizerFiles: files}
	got, err := card.DecodeTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello, world! <|im_start|>user\nnaïve café 12345<|im_end|>"
	if a, b := got.Encode(text, true, true), want.Encode(text, true, true); !slices.Equal(a, b) {
		t.Errorf("decoded tokenizer encodes %v, the file's %v", a, b)
	}
	for name, c := range map[string]*ModelCard{
		"no file":        {Model: "q", TokenizerFormat: TokenizerGGUF},
		"unknown format": {Model: "q", TokenizerFormat: "sentencepiece-proto"},
		"no json":        {Model: "q", TokenizerFormat: TokenizerHF},
	} {
		if _, err := c.DecodeTokenizer(); err == nil || !strings.Contains(err.Error(), `"q"`) {
			t.Errorf("%s: %v, want an error naming the model", name, err)
		}
	}
}
