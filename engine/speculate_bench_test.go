package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
)

// BenchmarkSpeculation compares single-stream greedy generation with and without prompt
// lookup decoding, and with a draft model, on text that quotes its prompt: the stories
// fixture retelling a story it was given (or the model in TANDEM_BENCH_MODEL, given the same
// text), reporting generated tokens/s and the acceptance rate side by side. The draft model
// is TANDEM_BENCH_DRAFT, else for the stories fixture its q8_0 file:
//
//	go test -run x -bench Speculation -benchtime 4x ./engine
//	TANDEM_BENCH_MODEL=/tmp/q.gguf TANDEM_BENCH_DRAFT=/tmp/d.gguf go test -run x -bench Speculation -benchtime 2x ./engine
func BenchmarkSpeculation(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	path, draftPath := os.Getenv("TANDEM_BENCH_MODEL"), os.Getenv("TANDEM_BENCH_DRAFT")
	if path == "" {
		path = fixtures.Model(b, "stories260K-f32.gguf")
		if draftPath == "" {
			draftPath = fixtures.Model(b, "stories260K-q8_0.gguf")
		}
	}
	m, err := model.Load(path, be)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.Prefault(be, nil)
	specs := []Speculation{{}, {Method: SpecNGram, Tokens: 4}, {Method: SpecNGram, Tokens: 8}}
	if draftPath != "" {
		d, err := model.Load(draftPath, be)
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		d.Prefault(be, nil)
		specs = append(specs, Speculation{Method: SpecDraft, Draft: d, Tokens: 4})
	}
	story := "Once upon a time, there was a little girl named Lily. She loved to play with her toys in the park. One day, she saw a big red ball under a tree. "
	// As many copies as leave room for 128 generated tokens (the stories model's context
	// is 128 tokens: one copy, and what is left).
	copies := 1
	for copies < 3 && len(m.Tokenizer.Encode(strings.Repeat(story, copies+1), true, false))+128 < m.Config.ContextLen {
		copies++
	}
	prompt := m.Tokenizer.Encode(strings.Repeat(story, copies)+"Once upon a time", true, false)
	genLen := min(128, m.Config.ContextLen-len(prompt)-1)
	for _, spec := range specs {
		name := "off"
		if spec.Method != "" {
			name = fmt.Sprintf("%s-k%d", spec.Method, spec.Tokens)
		}
		b.Run(name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			e, err := New(m, be, Config{KVBlocks: (len(prompt) + genLen + 64) / 16 * 2, Speculation: spec, Metrics: metrics.NewEngine(reg, "m")})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { e.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			var decode time.Duration
			var tokens int
			for range b.N {
				s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: genLen, IgnoreEOS: true})
				if err != nil {
					b.Fatal(err)
				}
				var first time.Time
				for n := 0; ; n++ {
					_, err := s.Next(ctx)
					if err != nil {
						break
					}
					if n == 0 {
						first = time.Now()
					} else {
						tokens++
					}
				}
				decode += time.Since(first)
			}
			b.ReportMetric(float64(tokens)/decode.Seconds(), "tok/s")
			drafted, accepted := counterValue(reg, "tandem:spec_decode_num_draft_tokens_total"), counterValue(reg, "tandem:spec_decode_num_accepted_tokens_total")
			if drafted > 0 {
				b.ReportMetric(accepted/drafted, "accepted/drafted")
				b.ReportMetric(accepted/float64(b.N*genLen), "accepted/token")
			}
		})
	}
}

// counterValue is the value of reg's counter name (0 if absent).
func counterValue(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
