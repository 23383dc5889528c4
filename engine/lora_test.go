package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
)

// writeAdapters writes n random adapters of m into a temporary directory, GGUF files and
// PEFT directories in turn, and returns their paths.
func writeAdapters(t *testing.T, m *model.Model, n int) []string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for i := range n {
		a, err := model.RandomAdapter(m, 4+4*(i%2), 16, uint64(100+i))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("a%d.gguf", i))
		if i%2 == 1 {
			path = filepath.Join(dir, fmt.Sprintf("a%d", i))
			err = a.WritePEFT(path)
		} else {
			err = a.WriteGGUF(path)
		}
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	return paths
}

// loraEngine runs an engine on the stories fixture serving adapters named a0, a1, … from
// paths.
func loraEngine(t *testing.T, cfg Config, paths []string) (*Engine, *model.Model, *prometheus.Registry) {
	t.Helper()
	m, be := loadFixture(t, "stories260K-f32.gguf", 2)
	reg := prometheus.NewRegistry()
	cfg.ServedName, cfg.Metrics = "stories", metrics.NewEngine(reg, "stories")
	if cfg.KVBlocks == 0 {
		cfg.KVBlocks = 512
	}
	e, err := New(m, be, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range paths {
		if err := e.LoadAdapter(context.Background(), fmt.Sprintf("a%d", i), p); err != nil {
			t.Fatal(err)
		}
	}
	runEngine(t, e)
	return e, m, reg
}

func gen(t *testing.T, e *Engine, req *llm.Request) ([]int32, llm.Event) {
	t.Helper()
	s, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, s)
}

const loraPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day"

// Requests under four adapters and the base model, all at once, get what each gets alone,
// token for token; the adapters change what the model says.
func TestAdaptersBatchedMatchAlone(t *testing.T) {
	m, _ := loadFixture(t, "stories260K-f32.gguf", 1)
	paths := writeAdapters(t, m, 4)
	names := []string{"", "a0", "a1", "a2", "a3"}
	prompt := m.Tokenizer.Encode(loraPrompt, true, false)
	req := func(name string, i int) *llm.Request {
		return &llm.Request{Prompt: prompt[:len(prompt)-i], MaxTokens: 24, IgnoreEOS: true, Adapter: name}
	}
	alone := map[string][]int32{}
	for _, name := range names {
		for i := range 2 {
			e, _, _ := loraEngine(t, Config{}, paths) // a fresh engine: nothing cached, nothing else running
			alone[fmt.Sprint(name, i)], _ = gen(t, e, req(name, i))
		}
	}
	e, _, reg := loraEngine(t, Config{}, paths)
	got := map[string][]int32{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range names {
		for i := range 2 {
			s, err := e.Generate(context.Background(), req(name, i))
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids, _ := collect(t, s)
				mu.Lock()
				got[fmt.Sprint(name, i)] = ids
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	for k, want := range alone {
		if !slices.Equal(got[k], want) {
			t.Errorf("%s: batched %v, alone %v", k, got[k], want)
		}
	}
	differ := 0
	for _, name := range names[1:] {
		if !slices.Equal(alone[name+"0"], alone["0"]) {
			differ++
		}
	}
	if differ == 0 {
		t.Error("no adapter changed the output")
	}
	if n := testutil.ToFloat64(findCounterVec(t, reg, "tandem:lora_requests_total", "a2")); n != 2 {
		t.Errorf("tandem:lora_requests_total{lora_name=a2} = %v, want 2", n)
	}
}

// A prefix computed under one adapter (or none) is never reused under another: the block
// hash salt includes the adapter; under the same adapter it is.
func TestAdapterPrefixCacheIsolation(t *testing.T) {
	m, _ := loadFixture(t, "stories260K-f32.gguf", 1)
	e, _, _ := loraEngine(t, Config{}, writeAdapters(t, m, 2))
	prompt := m.Tokenizer.Encode(loraPrompt, true, false)
	for _, step := range []struct {
		adapter string
		cached  bool
	}{{"", false}, {"a0", false}, {"a1", false}, {"a0", true}, {"", true}, {"a1", true}} {
		_, last := gen(t, e, &llm.Request{Prompt: prompt, MaxTokens: 2, Adapter: step.adapter})
		if got := last.Usage.CachedTokens > 0; got != step.cached {
			t.Errorf("adapter %q: %d cached prompt tokens, want cached %v", step.adapter, last.Usage.CachedTokens, step.cached)
		}
	}
}

// Past the resident budget the least recently used adapter's weights are evicted; a
// request naming it reads them again and gets the same tokens.
func TestAdapterEviction(t *testing.T) {
	m, _ := loadFixture(t, "stories260K-f32.gguf", 1)
	paths := writeAdapters(t, m, 3)
	e, _, reg := loraEngine(t, Config{MaxAdapters: 2}, paths[:1])
	prompt := m.Tokenizer.Encode(loraPrompt, true, false)
	first, _ := gen(t, e, &llm.Request{Prompt: prompt, MaxTokens: 16, Adapter: "a0", IgnoreEOS: true})
	for i, p := range paths[1:] {
		if err := e.LoadAdapter(context.Background(), fmt.Sprintf("a%d", i+1), p); err != nil {
			t.Fatal(err)
		}
	}
	var resident []string
	for _, a := range e.Adapters() {
		if a.Resident {
			resident = append(resident, a.Name)
		}
	}
	if strings.Join(resident, ",") != "a1,a2" {
		t.Fatalf("resident %v, want a1,a2 (a0 least recently used)", resident)
	}
	again, last := gen(t, e, &llm.Request{Prompt: prompt, MaxTokens: 16, Adapter: "a0", IgnoreEOS: true})
	if !slices.Equal(first, again) {
		t.Errorf("after its eviction a0 gives %v, before %v", again, first)
	}
	if last.Usage.CachedTokens == 0 {
		t.Error("the reloaded adapter (same content) lost its cached prefix")
	}
	if n := testutil.ToFloat64(findCounterVec(t, reg, "tandem:lora_loads_total", "ok")); n != 4 {
		t.Errorf("%v adapter loads, want 4 (three and a reload)", n)
	}
	if n := testutil.ToFloat64(findCounter(t, reg, "tandem:lora_evictions_total")); n != 2 {
		t.Errorf("%v evictions, want 2 (a0, then a1 at its reload)", n)
	}
}

// Adapters are loaded, used, unloaded and loaded again while requests of the base model,
// another adapter and the one being cycled run: none fails, and each gets the tokens it
// gets alone. A request running when its adapter is unloaded finishes with it.
func TestAdapterLoadUnloadUnderLoad(t *testing.T) {
	m, _ := loadFixture(t, "stories260K-f32.gguf", 1)
	paths := writeAdapters(t, m, 2)
	e, _, _ := loraEngine(t, Config{}, paths)
	prompt := m.Tokenizer.Encode(loraPrompt, true, false)
	want := map[string][]int32{}
	for _, name := range []string{"", "a0", "a1"} {
		want[name], _ = gen(t, e, &llm.Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: true, Adapter: name})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for _, name := range []string{"", "a1"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30 && ctx.Err() == nil; i++ {
				s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: true, Adapter: name})
				if err != nil {
					errs <- fmt.Errorf("%q: %w", name, err)
					return
				}
				ids, _ := collect(t, s)
				if !slices.Equal(ids, want[name]) {
					errs <- fmt.Errorf("%q under load: %v, want %v", name, ids, want[name])
					return
				}
			}
		}()
	}
	for range 5 {
		s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: 20, IgnoreEOS: true, Adapter: "a0"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.UnloadAdapter("a0"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Generate(ctx, &llm.Request{Prompt: prompt, Adapter: "a0"}); !errors.Is(err, llm.ErrInvalid) {
			t.Errorf("a request naming an unloaded adapter: %v", err)
		}
		if ids, _ := collect(t, s); !slices.Equal(ids, want["a0"]) {
			t.Errorf("a0, unloaded while running: %v, want %v", ids, want["a0"])
		}
		if err := e.LoadAdapter(ctx, "a0", paths[0]); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Bad names, names in use, missing files and unknown adapters are refused as invalid.
func TestAdapterRefusals(t *testing.T) {
	m, _ := loadFixture(t, "stories260K-f32.gguf", 1)
	paths := writeAdapters(t, m, 1)
	e, _, _ := loraEngine(t, Config{}, paths)
	ctx := context.Background()
	for _, tc := range []struct{ name, path, want string }{
		{"a0", paths[0], "loaded already"},
		{"stories", paths[0], "base model's"},
		{"", paths[0], "needs a name"},
		{"a b", paths[0], "spaces"},
		{"x", filepath.Join(t.TempDir(), "none.gguf"), "no such file"},
	} {
		err := e.LoadAdapter(ctx, tc.name, tc.path)
		if !errors.Is(err, llm.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadAdapter(%q, %s): %v, want an invalid-request error saying %q", tc.name, filepath.Base(tc.path), err, tc.want)
		}
	}
	if err := e.UnloadAdapter("nope"); !errors.Is(err, llm.ErrInvalid) {
		t.Errorf("unloading an unknown adapter: %v", err)
	}
	prompt := m.Tokenizer.Encode("Once", true, false)
	if _, err := e.Generate(ctx, &llm.Request{Prompt: prompt, Adapter: "nope"}); !errors.Is(err, llm.ErrInvalid) {
		t.Errorf("a request naming an unknown adapter: %v", err)
	}
	if _, err := e.Generate(ctx, &llm.Request{Prompt: prompt, Adapter: "a0", Pooling: llm.PoolLast}); !errors.Is(err, llm.ErrInvalid) {
		t.Errorf("an embedding under an adapter: %v", err)
	}
}

// findCounterVec is the value of the named metric's child with the given label value.
func findCounterVec(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetValue() == label {
					return gathered{name, mt.GetCounter().GetValue()}
				}
			}
		}
	}
	t.Fatalf("no metric %s{…=%q}", name, label)
	return nil
}
