package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/model"
)

// BenchmarkAdapters measures batched generation (8 streams, 64 tokens each) with no
// adapter, every stream under one rank-16 adapter, and the streams spread over 4 adapters
// and the base model, on the stories fixture or the model in TANDEM_BENCH_MODEL:
//
//	go test -run x -bench Adapters -benchtime 2x ./engine
func BenchmarkAdapters(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	path := os.Getenv("TANDEM_BENCH_MODEL")
	if path == "" {
		path = fixtures.Model(b, "stories260K-f32.gguf")
	}
	m, err := model.Load(path, be)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.Prefault(be, nil)
	e, err := New(m, be, Config{KVBlocks: 8 * 8, MaxSeqs: 8, ServedName: "m"})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	for i := range 4 {
		a, err := model.RandomAdapter(m, 16, 16, uint64(i+1))
		if err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(dir, fmt.Sprintf("a%d.gguf", i))
		if err := a.WriteGGUF(p); err != nil {
			b.Fatal(err)
		}
		if err := e.LoadAdapter(context.Background(), fmt.Sprintf("a%d", i), p); err != nil {
			b.Fatal(err)
		}
	}
	runEngine(b, e)
	prompt := m.Tokenizer.Encode("Once upon a time", true, false)
	genLen := min(64, m.Config.ContextLen-len(prompt)-1)
	for _, a := range []string{"", "a0", "a1", "a2", "a3"} { // warm up: buffers, caches, adapters' pages
		s, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: 8, IgnoreEOS: true, Adapter: a})
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := s.Next(context.Background()); err != nil {
				break
			}
		}
	}
	for _, mix := range []struct {
		name     string
		adapters []string
	}{
		{"base", []string{""}},
		{"one-adapter", []string{"a0"}},
		{"four-adapters-and-base", []string{"", "a0", "a1", "a2", "a3"}},
	} {
		b.Run(mix.name, func(b *testing.B) {
			var tokens int
			var mu sync.Mutex
			start := time.Now()
			for range b.N {
				var wg sync.WaitGroup
				for i := range 8 {
					s, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: genLen, IgnoreEOS: true,
						Adapter: mix.adapters[i%len(mix.adapters)]})
					if err != nil {
						b.Fatal(err)
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						n := 0
						for {
							if _, err := s.Next(context.Background()); err != nil {
								break
							}
							n++
						}
						mu.Lock()
						tokens += n
						mu.Unlock()
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(tokens)/time.Since(start).Seconds(), "tok/s")
		})
	}
}
