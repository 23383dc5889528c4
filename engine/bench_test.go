package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"tandem/hal/cpu"
	"tandem/llm"
	"tandem/model"
)

// BenchmarkStreams measures aggregate generation tokens/s and mean time to
// first token with 1, 4 and 16 concurrent streams (128-token prompts, 32
// generated tokens each) on the model in TANDEM_BENCH_MODEL, e.g.
//
//	tandem gen-model --preset qwen2.5-0.5b --type q8_0 --vocab-from qwen2-vocab.gguf --out /tmp/q.gguf
//	TANDEM_BENCH_MODEL=/tmp/q.gguf go test -run x -bench Streams -benchtime 1x ./engine
func BenchmarkStreams(b *testing.B) {
	path := os.Getenv("TANDEM_BENCH_MODEL")
	if path == "" {
		b.Skip("set TANDEM_BENCH_MODEL to a GGUF file (tandem gen-model writes one)")
	}
	be := cpu.New(0)
	defer be.Close()
	m, err := model.Load(path, be)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.Prefault(be, nil)
	const promptLen, genLen = 128, 32
	for _, streams := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			e, err := New(m, be, Config{MaxSeqs: 16, MaxBatchTokens: 512, KVBlocks: 16 * (promptLen + genLen + 16) / 16})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { e.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			rng := rand.New(rand.NewPCG(1, 2))
			var tokens int
			var ttft time.Duration
			start := time.Now()
			for range b.N {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for range streams {
					prompt := make([]int32, promptLen)
					for i := range prompt {
						prompt[i] = int32(rng.IntN(m.Tokenizer.VocabSize()))
					}
					t0 := time.Now()
					s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: genLen, IgnoreEOS: true})
					if err != nil {
						b.Fatal(err)
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer s.Close()
						n := 0
						for {
							if _, err := s.Next(ctx); err != nil {
								break
							}
							if n++; n == 1 {
								mu.Lock()
								ttft += time.Since(t0)
								mu.Unlock()
							}
						}
						mu.Lock()
						tokens += n
						mu.Unlock()
					}()
				}
				wg.Wait()
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(tokens)/elapsed.Seconds(), "gen_tok/s")
			b.ReportMetric(float64(ttft.Milliseconds())/float64(streams*b.N), "ttft_ms")
		})
	}
}
