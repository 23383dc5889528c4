package router

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"tandem/cluster"
	"tandem/gguf"
	"tandem/tokenizer"
)

// tokenizerFromCard rebuilds the tokenizer a model card carries (docs/orpc.md, "Services"):
// the router needs no model files.
func tokenizerFromCard(c *cluster.ModelCard) (*tokenizer.Tokenizer, error) {
	switch c.TokenizerFormat {
	case cluster.TokenizerGGUF:
		b := c.TokenizerFile("tokenizer.gguf")
		if b == nil {
			return nil, fmt.Errorf("router: model card of %q: no tokenizer.gguf", c.Model)
		}
		f, err := gguf.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("router: model card of %q: tokenizer.gguf: %w", c.Model, err)
		}
		return tokenizer.FromGGUF(f)
	case cluster.TokenizerHF:
		dir, err := os.MkdirTemp("", "tandem-router-tokenizer-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		for _, f := range c.TokenizerFiles {
			if f.Name != filepath.Base(f.Name) || strings.HasPrefix(f.Name, ".") {
				return nil, fmt.Errorf("router: model card of %q: bad tokenizer file name %q", c.Model, f.Name)
			}
			if err := os.WriteFile(filepath.Join(dir, f.Name), f.Data, 0o600); err != nil {
				return nil, err
			}
		}
		return tokenizer.FromHF(dir)
	}
	return nil, fmt.Errorf("router: model card of %q: unknown tokenizer format %q", c.Model, c.TokenizerFormat)
}
