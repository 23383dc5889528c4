package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/hal"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
)

// startEngine runs an engine on the stories260K fixture until the test ends.
func startEngine(t *testing.T, cfg Config) (*Engine, *model.Model) {
	t.Helper()
	return startEngineKV(t, cfg, hal.F32)
}

// startEngineKV is startEngine with a KV cache of kvType.
func startEngineKV(t *testing.T, cfg Config, kvType hal.DType) (*Engine, *model.Model) {
	t.Helper()
	m, be := loadStories(t)
	m.KVType = kvType
	if cfg.KVBlocks == 0 {
		cfg.KVBlocks = 256
	}
	e, err := New(m, be, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runEngine(t, e)
	return e, m
}

// runEngine runs e's step loop until the test ends.
func runEngine(tb testing.TB, e *Engine) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
}

// collect reads a stream to its end within a bounded time.
func collect(t *testing.T, s llm.Stream) ([]int32, llm.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids []int32
	var last llm.Event
	for {
		ev, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			return ids, last
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		ids = append(ids, ev.Token)
		last = ev
	}
}

// prompts are 16 requests: six unrelated, ten sharing long prefixes.
var prompts = func() []string {
	p := []string{
		"Once upon a time",
		"Lily and Ben went to the park to play with a big red ball",
		"The cat sat",
		"One day, a little boy named Tim found a shiny stone in the garden. He",
		"Sue",
		"The sun was hot and the birds were singing in the tall green trees near",
	}
	shared := "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "
	for _, end := range []string{"One day", "Her mom", "The dog", "A big", "She saw"} {
		p = append(p, shared+end, shared+shared[:40]+end)
	}
	return p
}()

// solo runs each prompt alone through the single-sequence generator.
func solo(t *testing.T, m *model.Model, maxTokens int) [][]int32 {
	t.Helper()
	_, be := loadStories(t)
	g := NewGenerator(m, be)
	var out [][]int32
	for _, p := range prompts {
		_, ids := generate(t, g, &Request{Prompt: m.Tokenizer.Encode(p, true, false), MaxTokens: maxTokens})
		out = append(out, ids)
	}
	return out
}

// runConcurrently submits every prompt at once and returns each one's tokens.
func runConcurrently(t *testing.T, e *Engine, m *model.Model, maxTokens int) ([][]int32, []llm.Event) {
	t.Helper()
	out := make([][]int32, len(prompts))
	last := make([]llm.Event, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		s, err := e.Generate(context.Background(), &llm.Request{Prompt: m.Tokenizer.Encode(p, true, false), MaxTokens: maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); out[i], last[i] = collect(t, s) }()
	}
	wg.Wait()
	return out, last
}

func TestContinuousBatchingMatchesSolo(t *testing.T) {
	reg := prometheus.NewRegistry()
	met := metrics.NewEngine(reg, "stories")
	cases := []struct {
		name   string
		cfg    Config
		kvType hal.DType
	}{
		{"roomy", Config{Metrics: met}, hal.F32},
		{"chunked prefill of 5", Config{MaxBatchTokens: 5}, hal.F32},
		{"two sequences at once", Config{MaxSeqs: 2}, hal.F32},
		{"roomy, F16 KV", Config{Metrics: met}, hal.F16},
		{"chunked prefill of 5, F16 KV", Config{MaxBatchTokens: 5}, hal.F16},
	}
	for _, c := range cases {
		cfg := c.cfg
		t.Run(c.name, func(t *testing.T) {
			e, m := startEngineKV(t, cfg, c.kvType)
			want := solo(t, m, 40)
			got, last := runConcurrently(t, e, m, 40)
			for i := range prompts {
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("prompt %d: batched %v, alone %v", i, got[i], want[i])
				}
				if last[i].Finish != llm.FinishLength || last[i].Usage.CompletionTokens != 40 {
					t.Errorf("prompt %d: finish %q usage %+v", i, last[i].Finish, last[i].Usage)
				}
			}
			waitIdle(t, e)
		})
	}
	if n := testutil.ToFloat64(met.GenerationTokens); n != float64(2*40*len(prompts)) {
		t.Errorf("generation tokens metric %v", n)
	}
}

// waitIdle waits until the pool holds no referenced blocks.
func waitIdle(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.Pool().Stats().Used != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("blocks still in use: %+v", e.Pool().Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPreemptionKeepsOutput(t *testing.T) {
	for _, kvType := range []hal.DType{hal.F32, hal.F16} {
		t.Run("kv-"+kvType.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			met := metrics.NewEngine(reg, "stories")
			// 12 blocks of 16: room for about two 90-token sequences, not six.
			e, m := startEngineKV(t, Config{KVBlocks: 12, Metrics: met}, kvType)
			want := solo(t, m, 70)
			got, _ := runConcurrently(t, e, m, 70)
			for i := range prompts {
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("prompt %d: with preemption %v, alone %v", i, got[i], want[i])
				}
			}
			if n := testutil.ToFloat64(met.Preemptions); n == 0 {
				t.Error("no preemption happened; the test does not test it")
			}
			waitIdle(t, e)
		})
	}
}

func TestPrefixCacheReuse(t *testing.T) {
	e, m := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode(prompts[1]+" and then they went home to eat a big cake with mom and dad", true, false)
	var first []int32
	for round := range 2 {
		s, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		ids, last := collect(t, s)
		wantCached := 0
		if round == 1 {
			wantCached = (len(prompt) - 1) / 16 * 16
		}
		if last.Usage.CachedTokens != wantCached || last.Usage.PromptTokens != len(prompt) {
			t.Errorf("round %d: usage %+v, want %d cached of %d", round, last.Usage, wantCached, len(prompt))
		}
		if round == 0 {
			first = ids
		} else if !slices.Equal(ids, first) {
			t.Errorf("cached prefix changed the output: %v then %v", first, ids)
		}
	}
}

func TestCloseFreesSequence(t *testing.T) {
	e, m := startEngine(t, Config{})
	s, err := e.Generate(context.Background(), &llm.Request{Prompt: m.Tokenizer.Encode(prompts[0], true, false), MaxTokens: 100, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	waitIdle(t, e)

	ctx, cancel := context.WithCancel(context.Background())
	s, err = e.Generate(ctx, &llm.Request{Prompt: m.Tokenizer.Encode(prompts[1], true, false), MaxTokens: 100, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Next(context.Background())
	cancel() // the client went away
	waitIdle(t, e)
}

func TestGenerateRejects(t *testing.T) {
	m, be := loadStories(t)
	e, err := New(m, be, Config{KVBlocks: 4, MaxQueue: 2}) // not running: requests stay queued
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		req  llm.Request
		want error
	}{
		{llm.Request{}, llm.ErrInvalid},
		{llm.Request{Prompt: []int32{1, 9999}}, llm.ErrInvalid},
		{llm.Request{Prompt: make([]int32, 128)}, llm.ErrPromptTooLong},
		{llm.Request{Prompt: make([]int32, 70)}, llm.ErrPromptTooLong}, // over the 64-token pool
		{llm.Request{Prompt: []int32{1}, Sampling: llm.SamplingParams{TopP: 2}}, llm.ErrInvalid},
	}
	for i, tc := range cases {
		if _, err := e.Generate(context.Background(), &tc.req); !errors.Is(err, tc.want) {
			t.Errorf("case %d: %v, want %v", i, err, tc.want)
		}
	}
	for i := range 3 {
		_, err := e.Generate(context.Background(), &llm.Request{Prompt: []int32{1, 2}})
		if want := i == 2; errors.Is(err, llm.ErrQueueFull) != want {
			t.Errorf("request %d with a queue of 2: %v", i, err)
		}
	}
}

func TestPriorityOrder(t *testing.T) {
	m, be := loadStories(t)
	e, err := New(m, be, Config{KVBlocks: 64, MaxSeqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	var streams []*stream
	for _, prio := range []int{5, 0, 3} {
		s, err := e.Generate(context.Background(), &llm.Request{Prompt: []int32{1, 403}, MaxTokens: 3, Priority: prio})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s.(*stream))
	}
	// Step the scheduler by hand: with one sequence at a time, the order in
	// which streams finish is the order the scheduler admitted them.
	var order []int
	for step := 0; step < 100 && len(order) < len(streams); step++ {
		e.intake()
		e.reap()
		if _, err := e.step(); err != nil {
			t.Fatal(err)
		}
		for i, s := range streams {
			if s.done && !slices.Contains(order, i) {
				order = append(order, i)
			}
		}
	}
	if fmt.Sprint(order) != "[1 2 0]" {
		t.Errorf("finish order %v, want priorities 0, 3, 5 → [1 2 0]", order)
	}
}
