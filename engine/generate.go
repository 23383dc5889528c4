package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tandem/hal"
	"tandem/llm"
	"tandem/model"
)

// Request is one generation: a tokenized prompt and how to continue it.
type Request struct {
	Prompt     []int32
	Params     SamplingParams
	MaxTokens  int     // 0 means up to the context length
	StopTokens []int32 // extra token ids that end generation
	IgnoreEOS  bool    // keep going past end-of-generation tokens
}

// Token is one generated token as it is emitted.
type Token struct {
	Sample
}

// Result summarizes a finished generation.
type Result struct {
	Tokens       []int32
	FinishReason llm.FinishReason
	PromptTokens int
	PrefillTime  time.Duration
	DecodeTime   time.Duration
}

// Generator runs one sequence at a time on a model: the engine of
// `tandem run`. Prefill runs in chunks of at most ChunkSize tokens.
type Generator struct {
	Runner    *model.Runner
	BlockSize int
	ChunkSize int

	kv     hal.KVStore
	logits []float32
}

// NewGenerator prepares a generator for m on be.
func NewGenerator(m *model.Model, be hal.Backend) *Generator {
	return &Generator{Runner: model.NewRunner(m, be), BlockSize: 16, ChunkSize: 512}
}

// Generate runs req to completion, calling emit for each new token. It stops
// early, returning ctx.Err(), when ctx is done.
func (g *Generator) Generate(ctx context.Context, req *Request, emit func(Token) error) (Result, error) {
	m := g.Runner.M
	cfg := &m.Config
	res := Result{PromptTokens: len(req.Prompt)}
	if len(req.Prompt) == 0 {
		return res, errors.New("engine: empty prompt")
	}
	if len(req.Prompt) >= cfg.ContextLen {
		return res, fmt.Errorf("engine: %w: %d prompt tokens, context %d", llm.ErrPromptTooLong, len(req.Prompt), cfg.ContextLen)
	}
	if err := req.Params.Validate(cfg.VocabSize); err != nil {
		return res, fmt.Errorf("engine: %w", err)
	}
	maxTokens := maxNewTokens(cfg.ContextLen, len(req.Prompt), req.MaxTokens)
	total := len(req.Prompt) + maxTokens
	blocks := (total + g.BlockSize - 1) / g.BlockSize
	if err := g.ensureKV(blocks); err != nil {
		return res, err
	}
	table := make([]int32, blocks)
	for i := range table {
		table[i] = int32(i)
	}
	if len(g.logits) < cfg.VocabSize {
		g.logits = make([]float32, cfg.VocabSize)
	}
	sampler := NewSampler(req.Params, cfg.VocabSize, req.Prompt)

	rules := stopRules{tok: m.Tokenizer, stopTokens: req.StopTokens, ignoreEOS: req.IgnoreEOS, maxTokens: maxTokens}
	batch := &model.Batch{Attn: hal.AttnBatch{Blocks: [][]int32{table}}}
	step := func(tokens []int32, start int, wantLogits bool) error {
		batch.Tokens = tokens
		batch.Attn.Pos = batch.Attn.Pos[:0]
		batch.Attn.SeqOf = batch.Attn.SeqOf[:0]
		for i := range tokens {
			batch.Attn.Pos = append(batch.Attn.Pos, int32(start+i))
			batch.Attn.SeqOf = append(batch.Attn.SeqOf, 0)
		}
		batch.Outputs = batch.Outputs[:0]
		if wantLogits {
			batch.Outputs = append(batch.Outputs, len(tokens)-1)
		}
		return g.Runner.Forward(g.kv, batch, g.logits)
	}

	t0 := time.Now()
	chunk := max(g.ChunkSize, 1)
	for start := 0; start < len(req.Prompt); start += chunk {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		end := min(start+chunk, len(req.Prompt))
		if err := step(req.Prompt[start:end], start, end == len(req.Prompt)); err != nil {
			return res, err
		}
	}
	res.PrefillTime = time.Since(t0)
	t1 := time.Now()

	pos := len(req.Prompt)
	one := make([]int32, 1)
	for {
		s := sampler.Sample(g.logits[:cfg.VocabSize])
		res.Tokens = append(res.Tokens, s.ID)
		if err := emit(Token{Sample: s}); err != nil {
			return res, err
		}
		if res.FinishReason = rules.finish(s.ID, len(res.Tokens)); res.FinishReason != "" {
			res.DecodeTime = time.Since(t1)
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		one[0] = s.ID
		if err := step(one, pos, true); err != nil {
			return res, err
		}
		pos++
	}
}

func (g *Generator) ensureKV(blocks int) error {
	if g.kv != nil && g.kv.Layout().Blocks >= blocks && g.kv.Layout().DType == g.Runner.M.KVType {
		return nil
	}
	kv, err := g.Runner.Be.NewKVStore(g.Runner.M.KVLayout(blocks, g.BlockSize))
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	g.kv = kv
	return nil
}
