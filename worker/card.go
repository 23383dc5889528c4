package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"tandem/cluster"
	"tandem/gguf"
)

// TokenizerGGUF returns the tokenizer of a GGUF model as a model card carries it: a GGUF file
// holding only the tokenizer.* keys of f.
func TokenizerGGUF(f *gguf.File) (format string, files []cluster.File, err error) {
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
		return "", nil, errors.New("worker: the GGUF file has no tokenizer.* keys")
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return "", nil, fmt.Errorf("worker: tokenizer GGUF: %w", err)
	}
	return cluster.TokenizerGGUF, []cluster.File{{Name: "tokenizer.gguf", Data: buf.Bytes()}}, nil
}

// TokenizerHF returns the tokenizer files of a Hugging Face model directory as a model card
// carries them: tokenizer.json, tokenizer_config.json and generation_config.json as they
// are, and of config.json only its vocab_size.
func TokenizerHF(dir string) (format string, files []cluster.File, err error) {
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) && name != "tokenizer.json" {
			continue
		}
		if err != nil {
			return "", nil, fmt.Errorf("worker: %w", err)
		}
		files = append(files, cluster.File{Name: name, Data: b})
	}
	if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		var mc struct {
			VocabSize int `json:"vocab_size"`
		}
		if json.Unmarshal(b, &mc) == nil && mc.VocabSize > 0 {
			small, _ := json.Marshal(mc)
			files = append(files, cluster.File{Name: "config.json", Data: small})
		}
	}
	return cluster.TokenizerHF, files, nil
}

// TokenizerFor returns the tokenizer of the model at path (a GGUF file or an HF directory)
// as a model card carries it.
func TokenizerFor(path string) (format string, files []cluster.File, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", nil, fmt.Errorf("worker: %w", err)
	}
	if st.IsDir() {
		return TokenizerHF(path)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("worker: %w", err)
	}
	defer f.Close()
	return TokenizerGGUF(f)
}
