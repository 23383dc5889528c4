package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"tandem/gguf"
	"tandem/tokenizer"
)

// The model card's tokenizer codec (docs/orpc.md, "Services"): the worker encodes the
// tokenizer of its model files into the card, the router decodes it, so that the router
// needs no model files.

// EncodeTokenizerGGUF returns the tokenizer of a GGUF model as a model card carries it: a
// GGUF file holding only the tokenizer.* keys of f.
func EncodeTokenizerGGUF(f *gguf.File) (format string, files []File, err error) {
	w := gguf.NewWriter()
	n := 0
	for _, k := range f.Keys {
		if !strings.HasPrefix(k, "tokenizer.") {
			continue
		}
		v, _ := f.Get(k)
		w.SetKV(k, v)
		n++
	}
	if n == 0 {
		return "", nil, errors.New("cluster: the GGUF file has no tokenizer.* keys")
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return "", nil, fmt.Errorf("cluster: tokenizer GGUF: %w", err)
	}
	return TokenizerGGUF, []File{{Name: "tokenizer.gguf", Data: buf.Bytes()}}, nil
}

// EncodeTokenizerHF returns the tokenizer files of a Hugging Face model directory as a model
// card carries them: tokenizer.json, tokenizer_config.json and generation_config.json as
// they are, and of config.json only its vocab_size.
func EncodeTokenizerHF(dir string) (format string, files []File, err error) {
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) && name != "tokenizer.json" {
			continue
		}
		if err != nil {
			return "", nil, fmt.Errorf("cluster: %w", err)
		}
		files = append(files, File{Name: name, Data: b})
	}
	if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		var mc struct {
			VocabSize int `json:"vocab_size"`
		}
		if json.Unmarshal(b, &mc) == nil && mc.VocabSize > 0 {
			small, _ := json.Marshal(mc)
			files = append(files, File{Name: "config.json", Data: small})
		}
	}
	return TokenizerHF, files, nil
}

// EncodeTokenizer returns the tokenizer of the model at path (a GGUF file or an HF
// directory) as a model card carries it.
func EncodeTokenizer(path string) (format string, files []File, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", nil, fmt.Errorf("cluster: %w", err)
	}
	if st.IsDir() {
		return EncodeTokenizerHF(path)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("cluster: %w", err)
	}
	defer f.Close()
	return EncodeTokenizerGGUF(f)
}

// DecodeTokenizer rebuilds the tokenizer the card carries.
func (c *ModelCard) DecodeTokenizer() (*tokenizer.Tokenizer, error) {
	switch c.TokenizerFormat {
	case TokenizerGGUF:
		b := c.TokenizerFile("tokenizer.gguf")
		if b == nil {
			return nil, fmt.Errorf("cluster: model card of %q: no tokenizer.gguf", c.Model)
		}
		f, err := gguf.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("cluster: model card of %q: tokenizer.gguf: %w", c.Model, err)
		}
		return tokenizer.FromGGUF(f)
	case TokenizerHF:
		if c.TokenizerFile("tokenizer.json") == nil {
			return nil, fmt.Errorf("cluster: model card of %q: no tokenizer.json", c.Model)
		}
		return tokenizer.FromHFFiles(tokenizer.HFFiles{
			Tokenizer:        c.TokenizerFile("tokenizer.json"),
			TokenizerConfig:  c.TokenizerFile("tokenizer_config.json"),
			GenerationConfig: c.TokenizerFile("generation_config.json"),
			Config:           c.TokenizerFile("config.json"),
		})
	}
	return nil, fmt.Errorf("cluster: model card of %q: unknown tokenizer format %q", c.Model, c.TokenizerFormat)
}
