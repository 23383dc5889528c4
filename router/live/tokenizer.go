package live

import (
	"fmt"

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
		if c.TokenizerFile("tokenizer.json") == nil {
			return nil, fmt.Errorf("router: model card of %q: no tokenizer.json", c.Model)
		}
		return tokenizer.FromHFFiles(tokenizer.HFFiles{
			Tokenizer:        c.TokenizerFile("tokenizer.json"),
			TokenizerConfig:  c.TokenizerFile("tokenizer_config.json"),
			GenerationConfig: c.TokenizerFile("generation_config.json"),
			Config:           c.TokenizerFile("config.json"),
		})
	}
	return nil, fmt.Errorf("router: model card of %q: unknown tokenizer format %q", c.Model, c.TokenizerFormat)
}
