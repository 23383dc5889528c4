package engine

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
)

func TestPromptLookup(t *testing.T) {
	for _, tc := range []struct {
		tokens     []int32
		minN, maxN int
		k          int
		want       []int32 // the drafts
	}{
		{[]int32{1, 2, 3, 4, 1, 2}, 1, 3, 4, []int32{3, 4, 1, 2}},
		{[]int32{1, 2, 3, 4, 1, 2}, 1, 3, 1, []int32{3}},
		{[]int32{1, 2, 3}, 1, 3, 4, nil},                             // nothing repeats
		{[]int32{7}, 1, 3, 4, nil},                                   // too short
		{[]int32{5, 9, 5, 8, 5}, 1, 3, 2, []int32{8, 5}},             // the latest occurrence of "5"
		{[]int32{1, 2, 3, 1, 2, 3}, 1, 3, 5, []int32{1, 2, 3, 1, 2}}, // the period goes on
		{[]int32{1, 2, 9, 2, 1, 2}, 2, 2, 3, []int32{9, 2, 1}},
		{[]int32{1, 2, 9, 3, 2}, 2, 3, 3, nil},           // "3 2" and "9 3 2" never occurred before
		{[]int32{4, 4, 4}, 1, 3, 4, []int32{4, 4, 4, 4}}, // "4 4" at 0, and on
	} {
		got := promptLookup(slices.Clone(tc.tokens), tc.minN, tc.maxN, tc.k)[len(tc.tokens):]
		if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("promptLookup(%v, %d..%d, k=%d) drafts %v, want %v", tc.tokens, tc.minN, tc.maxN, tc.k, got, tc.want)
		}
	}
}

// promptLookup keeps its input, drafts at most k tokens, and every draft continues an
// earlier occurrence of the suffix it matched: the drafts are a run of the tokens.
func FuzzPromptLookup(f *testing.F) {
	f.Add([]byte{1, 2, 3, 1, 2}, uint8(1), uint8(3), uint8(4))
	f.Add([]byte{}, uint8(0), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, minN, maxN, k uint8) {
		tokens := make([]int32, len(raw))
		for i, b := range raw {
			tokens[i] = int32(b % 5)
		}
		orig := slices.Clone(tokens)
		got := promptLookup(tokens, int(minN%5), int(maxN%5), int(k%8))
		if !slices.Equal(got[:len(orig)], orig) {
			t.Fatalf("the tokens changed: %v → %v", orig, got[:len(orig)])
		}
		drafts := got[len(orig):]
		if len(drafts) != 0 && len(drafts) != int(k%8) {
			t.Fatalf("%d drafts, k is %d", len(drafts), k%8)
		}
		// Every draft continues an earlier occurrence: some i < len(orig) starts a run of
		// got that the drafts repeat, got[i+j] == drafts[j].
		if len(drafts) > 0 {
			found := false
			for i := 0; i < len(orig) && !found; i++ {
				found = slices.Equal(got[i:i+len(drafts)], drafts)
			}
			if !found {
				t.Fatalf("drafts %v continue no run of %v", drafts, orig)
			}
		}
	})
}

// specPrompts are prompts whose continuations quote them (the stories model retells) and
// some that do not.
var specPrompts = []string{
	"Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time, there was a little girl named Lily. She",
	"Tom had a red ball. Tom had a red ball. Tom had a red",
	"The cat sat",
	"One day, a little boy named Tim found a shiny stone in the garden. He",
	"Sue and Sam went to the park. Sue and Sam went to the",
	"Once upon a time",
}

// runSpec serves the requests at once on an engine with the given speculation and returns
// each one's tokens and the engine's metrics registry.
//
// A spec of Method "draft" names the draft model's fixture in Draft's place: draftName.
func runSpec(t *testing.T, name string, spec Speculation, reqs []*llm.Request) ([][]int32, *prometheus.Registry) {
	t.Helper()
	m, be := loadFixture(t, name, 2)
	if spec.Method == SpecDraft {
		dn := draftName[name]
		if dn == "" {
			dn = name // the model drafting for itself: its greedy drafts are all accepted
		}
		d, err := model.Load(fixtures.Model(t, dn), be)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		spec.Draft = d
	}
	reg := prometheus.NewRegistry()
	e, err := New(m, be, Config{KVBlocks: 512, Speculation: spec, Metrics: metrics.NewEngine(reg, "m")})
	if err != nil {
		t.Fatal(err)
	}
	runEngine(t, e)
	return generateAll(t, e, reqs), reg
}

// generateAll runs reqs on e at once and returns each one's tokens.
func generateAll(t *testing.T, e *Engine, reqs []*llm.Request) [][]int32 {
	t.Helper()
	out := make([][]int32, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		s, err := e.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); out[i], _ = collect(t, s) }()
	}
	wg.Wait()
	return out
}

// draftName is the draft model of each target in the tests: another file of its
// vocabulary (the same weights in another type, or another model of the vocabulary).
var draftName = map[string]string{
	"stories260K-f32.gguf":        "stories260K-q8_0.gguf",
	"rand-llama-tok512-q8_0.gguf": "rand-llama-tok512-f16.gguf",
	"rand-qwen2-tok512-f32.gguf":  "rand-llama-tok512-f32.gguf",
	"rand-qwen3-tok512-f32.gguf":  "rand-qwen3-tok512-f32.gguf",
}

// specFixtures are every fixture model (the vocabulary-only files aside).
var specFixtures = []string{
	"stories260K-f32.gguf", "stories260K-f16.gguf", "stories260K-q8_0.gguf",
	"rand-llama-tok512-f32.gguf", "rand-llama-tok512-f16.gguf", "rand-llama-tok512-bf16.gguf", "rand-llama-tok512-q8_0.gguf",
	"rand-llama256-tok512-q4_k_m.gguf", "rand-llama-llama3vocab-f32.gguf",
	"rand-qwen2-tok512-f32.gguf", "rand-qwen2-qwen2vocab-f32.gguf", "rand-qwen3-tok512-f32.gguf",
}

// unrelatedDraft are the targets whose draft is another model: its drafts may all fail.
var unrelatedDraft = map[string]bool{"rand-qwen2-tok512-f32.gguf": true}

// Speculative decoding gives the tokens plain decoding gives: greedy on every family of
// fixture models, and seeded sampling too (the sampler runs over the verify rows as over
// decode steps), with requests that speculate batched with ones that do not; and the
// drafts are accepted often enough on text that repeats to count.
func TestSpeculationSameTokens(t *testing.T) {
	for _, name := range specFixtures {
		t.Run(name, func(t *testing.T) {
			m, _ := loadFixture(t, name, 1)
			var reqs []*llm.Request
			for i, p := range specPrompts {
				prompt := m.Tokenizer.Encode(p, true, false)
				for j, sp := range []llm.SamplingParams{{}, {Temperature: 0.8, TopP: 0.95, Seed: uint64(i), HasSeed: true, Logprobs: true}} {
					reqs = append(reqs, &llm.Request{Prompt: prompt, MaxTokens: 48, Sampling: sp, IgnoreEOS: true, NoSpeculation: i == 2 && j == 0})
				}
			}
			plain, _ := runSpec(t, name, Speculation{}, reqs)
			for _, method := range []string{SpecNGram, SpecDraft} {
				spec, reg := runSpec(t, name, Speculation{Method: method, MaxBatch: 64, MinAcceptance: 1e-9}, reqs)
				for i := range reqs {
					if !slices.Equal(plain[i], spec[i]) {
						t.Errorf("%s: request %d (temperature %v): with speculation %v, without %v", method, i, reqs[i].Sampling.Temperature, spec[i], plain[i])
					}
				}
				drafted := testutil.ToFloat64(findCounter(t, reg, "tandem:spec_decode_num_draft_tokens_total"))
				accepted := testutil.ToFloat64(findCounter(t, reg, "tandem:spec_decode_num_accepted_tokens_total"))
				t.Logf("%s %s: %v drafted, %v accepted", name, method, drafted, accepted)
				if drafted == 0 || accepted == 0 && (method != SpecDraft || !unrelatedDraft[name]) {
					t.Errorf("%s: %v tokens drafted, %v accepted: speculation did not run", method, drafted, accepted)
				}
			}
		})
	}
}

// findCounter is the collector of the named metric in reg.
func findCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return gathered{name, mf.GetMetric()[0].GetCounter().GetValue()}
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// gathered is a gathered counter's value as a collector testutil can read.
type gathered struct {
	name string
	v    float64
}

func (g gathered) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc() }
func (g gathered) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(g.desc(), prometheus.CounterValue, g.v)
}
func (g gathered) desc() *prometheus.Desc { return prometheus.NewDesc(g.name, "", nil, nil) }

// Speculating under a scarce KV pool (drafts dropped for lack of blocks, preemptions)
// keeps the tokens.
func TestSpeculationUnderPreemption(t *testing.T) {
	m, _ := loadFixture(t, "stories260K-f32.gguf", 1)
	var reqs []*llm.Request
	for _, p := range specPrompts {
		reqs = append(reqs, &llm.Request{Prompt: m.Tokenizer.Encode(p, true, false), MaxTokens: 64, IgnoreEOS: true})
	}
	run := func(spec Speculation) [][]int32 {
		mm, be := loadFixture(t, "stories260K-f32.gguf", 1)
		if spec.Method == SpecDraft {
			d, err := model.Load(fixtures.Model(t, "stories260K-q8_0.gguf"), be)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			spec.Draft = d
		}
		e, err := New(mm, be, Config{KVBlocks: 24, BlockSize: 8, MaxBatchTokens: 32, Speculation: spec})
		if err != nil {
			t.Fatal(err)
		}
		runEngine(t, e)
		return generateAll(t, e, reqs)
	}
	plain := run(Speculation{})
	for _, method := range []string{SpecNGram, SpecDraft} {
		spec := run(Speculation{Method: method, Tokens: 8, MaxBatch: 64, MinAcceptance: 1e-9})
		for i := range reqs {
			if !slices.Equal(plain[i], spec[i]) {
				t.Errorf("%s: request %d: with speculation %v, without %v", method, i, spec[i], plain[i])
			}
		}
	}
}

func TestSpeculationConfig(t *testing.T) {
	for _, tc := range []struct {
		spec Speculation
		ok   bool
	}{
		{Speculation{}, true},
		{Speculation{Method: SpecNGram}, true},
		{Speculation{Method: "eagle"}, false},
		{Speculation{Method: SpecDraft}, false}, // no draft model
		{Speculation{Method: SpecNGram, Tokens: 100}, false},
		{Speculation{Method: SpecNGram, MinN: 4, MaxN: 2}, false},
		{Speculation{Method: SpecNGram, MinAcceptance: 2}, false},
	} {
		err := tc.spec.fill()
		if (err == nil) != tc.ok {
			t.Errorf("%+v: error %v, want ok %v", tc.spec, err, tc.ok)
		}
	}
}

// Speculating and adapting cost no allocations per token beyond plain decoding's: the
// drafts, the verify rows' picks and the batch's adapters reuse their buffers.
func TestSpeculationAndAdaptersAllocateNothingPerToken(t *testing.T) {
	m, be := loadFixture(t, "stories260K-f32.gguf", 1)
	paths := writeAdapters(t, m, 1)
	d, err := model.Load(fixtures.Model(t, "stories260K-q8_0.gguf"), be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	prompt := m.Tokenizer.Encode("Tom had a red ball. Tom had a red ball. Tom", true, false)
	perToken := func(spec Speculation, adapter string) float64 {
		e, err := New(m, be, Config{KVBlocks: 64, Speculation: spec, ServedName: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.LoadAdapter(context.Background(), "a0", paths[0]); err != nil {
			t.Fatal(err)
		}
		runEngine(t, e)
		run := func(n int) uint64 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 4 {
				s, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, Adapter: adapter})
				if err != nil {
					t.Fatal(err)
				}
				collect(t, s)
			}
			runtime.ReadMemStats(&after)
			return after.Mallocs - before.Mallocs
		}
		run(60) // warm up
		short, long := run(10), run(70)
		return (float64(long) - float64(short)) / (4 * 60)
	}
	plain := perToken(Speculation{}, "")
	for _, tc := range []struct {
		name    string
		spec    Speculation
		adapter string
	}{
		{"ngram", Speculation{Method: SpecNGram, MinAcceptance: 1e-9}, ""},
		{"draft+adapter", Speculation{Method: SpecDraft, Draft: d, MinAcceptance: 1e-9}, "a0"},
		{"adapter", Speculation{}, "a0"},
	} {
		got := perToken(tc.spec, tc.adapter)
		t.Logf("%s: %.2f allocations per token, plain %.2f", tc.name, got, plain)
		if got > plain+0.5 {
			t.Errorf("%s: %.2f allocations per token, plain decoding %.2f", tc.name, got, plain)
		}
	}
}

// A sequence whose drafts are seldom accepted stops drafting for a while: on text that does
// not repeat (a random model's), the default acceptance floor drafts far fewer tokens than
// no floor, with the same output.
func TestSpeculationPausesWhenItDoesNotPay(t *testing.T) {
	const name = "rand-llama-tok512-q8_0.gguf"
	m, _ := loadFixture(t, name, 1)
	var reqs []*llm.Request
	for _, p := range specPrompts {
		reqs = append(reqs, &llm.Request{Prompt: m.Tokenizer.Encode(p, true, false), MaxTokens: 100, IgnoreEOS: true})
	}
	always, regAlways := runSpec(t, name, Speculation{Method: SpecNGram, MaxBatch: 64, MinAcceptance: 1e-9}, reqs)
	paused, regPaused := runSpec(t, name, Speculation{Method: SpecNGram, MaxBatch: 64}, reqs)
	for i := range reqs {
		if !slices.Equal(always[i], paused[i]) {
			t.Errorf("request %d: %v with pauses, %v without", i, paused[i], always[i])
		}
	}
	a := testutil.ToFloat64(findCounter(t, regAlways, "tandem:spec_decode_num_draft_tokens_total"))
	p := testutil.ToFloat64(findCounter(t, regPaused, "tandem:spec_decode_num_draft_tokens_total"))
	t.Logf("%v tokens drafted without a floor, %v with", a, p)
	if p > 0.75*a {
		t.Errorf("%v tokens drafted with the acceptance floor, %v without: it did not pause", p, a)
	}
}

// A draft model of another vocabulary is refused.
func TestDraftModelOfAnotherVocabulary(t *testing.T) {
	m, be := loadFixture(t, "stories260K-f32.gguf", 1)
	for _, name := range []string{"rand-llama-llama3vocab-f32.gguf", "rand-qwen2-qwen2vocab-f32.gguf"} {
		d, err := model.Load(fixtures.Model(t, name), be)
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(m, be, Config{KVBlocks: 16, Speculation: Speculation{Method: SpecDraft, Draft: d}})
		d.Close()
		if err == nil || !strings.Contains(err.Error(), "vocabulary") {
			t.Errorf("%s drafting for stories260K: %v, want a vocabulary error", name, err)
		}
	}
}
