package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"tandem/grammar"
	"tandem/internal/schematest"
	"tandem/llm"
	"tandem/model"
)

// startFixtureEngine runs an engine on a fixture model until the test ends.
func startFixtureEngine(t *testing.T, file string) (*Engine, *model.Model) {
	t.Helper()
	m, be := loadFixture(t, file, 0)
	e, err := New(m, be, Config{KVBlocks: 512})
	if err != nil {
		t.Fatal(err)
	}
	runEngine(t, e)
	return e, m
}

// schemaConstraint is the constraint of a JSON Schema.
func schemaConstraint(t *testing.T, schema []byte) llm.Constraint {
	t.Helper()
	g, err := grammar.JSONSchema(schema)
	if err != nil {
		t.Fatal(err)
	}
	return llm.Constraint{Grammar: g.String()}
}

// text is the bytes of ids, end-of-generation tokens left out.
func text(m *model.Model, ids []int32) []byte {
	var out []byte
	for _, id := range ids {
		if !m.Tokenizer.IsEOG(id) {
			out = append(out, m.Tokenizer.Piece(id)...)
		}
	}
	return out
}

// Every output of the schema test set is valid, greedy and sampled, with random-weight
// models (which never write JSON by chance) over the full Llama 3 and Qwen vocabularies.
func TestConstrainedOutputsValidate(t *testing.T) {
	for _, file := range []string{"rand-qwen2-qwen2vocab-f32.gguf", "rand-llama-llama3vocab-f32.gguf"} {
		e, m := startFixtureEngine(t, file)
		prompt := m.Tokenizer.Encode("Write JSON:", true, false)
		for _, tc := range schematest.Cases() {
			c := schemaConstraint(t, tc.Schema)
			samplings := map[string]llm.SamplingParams{
				"greedy":  {},
				"sampled": {Temperature: 1, TopP: 0.95, Seed: 11, HasSeed: true},
				"hot":     {Temperature: 1.5, Seed: 12, HasSeed: true},
			}
			for name, sp := range samplings {
				t.Run(fmt.Sprintf("%s/%s/%s", file, tc.Name, name), func(t *testing.T) {
					st, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, Sampling: sp, MaxTokens: tc.MaxTokens, Constraint: c})
					if err != nil {
						t.Fatal(err)
					}
					ids, last := collect(t, st)
					out := text(m, ids)
					if last.Finish != llm.FinishStop {
						t.Fatalf("finish %q after %d tokens: %q", last.Finish, len(ids), out)
					}
					if err := schematest.Validate(out, tc.Schema); err != nil {
						t.Errorf("%q: %v", out, err)
					}
				})
			}
		}
	}
}

// A constrained sequence's tokens are the same alone and in a batch with others, and a
// constrained request resumed from its own first tokens continues exactly.
func TestConstrainedBatchInvariantAndResumed(t *testing.T) {
	e, m := startFixtureEngine(t, "rand-qwen2-qwen2vocab-f32.gguf")
	cases := schematest.Cases()
	prompt := m.Tokenizer.Encode("Data:", true, false)
	sp := llm.SamplingParams{Temperature: 1, Seed: 5, HasSeed: true}
	req := func(i int) *llm.Request {
		return &llm.Request{Prompt: prompt, Sampling: sp, MaxTokens: cases[i].MaxTokens, Constraint: schemaConstraint(t, cases[i].Schema)}
	}
	run := func(r *llm.Request) []int32 {
		st, err := e.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := collect(t, st)
		return ids
	}
	alone := make([][]int32, len(cases))
	for i := range cases {
		alone[i] = run(req(i))
	}
	together := make([][]int32, len(cases))
	var wg sync.WaitGroup
	for i := range cases {
		wg.Add(1)
		go func() { defer wg.Done(); together[i] = run(req(i)) }()
	}
	wg.Wait()
	for i := range cases {
		if !slices.Equal(alone[i], together[i]) {
			t.Errorf("%s: alone %q, in a batch %q", cases[i].Name, text(m, alone[i]), text(m, together[i]))
		}
	}
	full := alone[0]
	for _, k := range []int{1, len(full) / 2, len(full) - 1} {
		r := req(0)
		r.Prompt = append(slices.Clone(prompt), full[:k]...)
		r.Resumed = k
		if got := run(r); !slices.Equal(got, full[k:]) {
			t.Errorf("resumed after %d: %q, want %q", k, text(m, got), text(m, full[k:]))
		}
	}
	// A resumed tail the grammar refuses is refused.
	r := req(0)
	bad := m.Tokenizer.Encode("[1]", false, false)
	r.Prompt, r.Resumed = append(slices.Clone(prompt), bad...), len(bad)
	if _, err := e.Generate(context.Background(), r); !errors.Is(err, llm.ErrInvalid) {
		t.Errorf("resumed tokens outside the grammar: %v, want ErrInvalid", err)
	}
	// So is a grammar that does not parse.
	if _, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, Constraint: llm.Constraint{Grammar: "root ::= ("}}); !errors.Is(err, llm.ErrInvalid) {
		t.Errorf("bad grammar: %v, want ErrInvalid", err)
	}
}

// The grammar ends generation with "stop" when its text is complete, and an
// end-of-generation token is allowed exactly where the text may end.
func TestConstraintEndsGeneration(t *testing.T) {
	e, m := startFixtureEngine(t, "rand-qwen2-qwen2vocab-f32.gguf")
	prompt := m.Tokenizer.Encode("Answer:", true, false)
	for _, tc := range []struct {
		grammar string
		want    []string
	}{
		{`root ::= "yes" | "no"`, []string{"yes", "no"}},
		{`root ::= "a" "b"? "c"`, []string{"ac", "abc"}},
	} {
		for seed := range uint64(4) {
			st, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: 50,
				Sampling: llm.SamplingParams{Temperature: 1, Seed: seed, HasSeed: true}, Constraint: llm.Constraint{Grammar: tc.grammar}})
			if err != nil {
				t.Fatal(err)
			}
			ids, last := collect(t, st)
			if got := string(text(m, ids)); !slices.Contains(tc.want, got) || last.Finish != llm.FinishStop {
				t.Errorf("%s seed %d: %q (%s)", tc.grammar, seed, got, last.Finish)
			}
		}
	}
	// Where the text may end or go on, the sampler may choose end-of-generation.
	g, _ := grammar.ParseGBNF(`root ::= [a-z]{1,3}`)
	cg, _ := grammar.Compile(g)
	v := grammar.NewVocab(m.Config.VocabSize, m.Tokenizer.Piece, m.Tokenizer.EOGTokens())
	s := newSampler(llm.SamplingParams{}, m.Config.VocabSize, nil, nil, grammar.Bind(cg, v))
	logits := make([]float32, m.Config.VocabSize)
	eos := m.Tokenizer.EOS()
	logits[eos] = 10
	if got := s.Sample(slices.Clone(logits)); got.ID == eos {
		t.Fatal("end of generation allowed before any letter")
	}
	if s.constraintDone() {
		t.Fatal("done after one token")
	}
	if got := s.Sample(slices.Clone(logits)); got.ID != eos || !s.constraintDone() {
		t.Errorf("after a letter the favoured end of generation was not taken: %d (done %v)", got.ID, s.constraintDone())
	}
}

// Greedy sampling under a grammar picks the best allowed token; when every allowed
// token's logit is −Inf it picks uniformly among the allowed ones, never another.
func TestSamplerMask(t *testing.T) {
	toks := []string{"a", "b", "c", "{", "}", ""}
	v := grammar.NewVocab(len(toks), func(id int32) []byte { return []byte(toks[id]) }, []int32{5})
	g, _ := grammar.ParseGBNF(`root ::= "{" [ab]+ "}"`)
	cg, _ := grammar.Compile(g)
	b := grammar.Bind(cg, v)
	s := newSampler(llm.SamplingParams{Logprobs: true}, len(toks), nil, nil, b)
	got := s.Sample([]float32{5, 1, 9, 2, 8, 7})
	if got.ID != 3 {
		t.Fatalf("first token %d, want { (3), the only allowed", got.ID)
	}
	if got.Logprob != 0 {
		t.Errorf("logprob of the only allowed token %v, want 0", got.Logprob)
	}
	if got := s.Sample([]float32{5, 1, 9, 2, 8, 7}); got.ID != 0 {
		t.Errorf("second token %d, want a (0): c is best but not allowed", got.ID)
	}
	ninf := float32(math.Inf(-1))
	for seed := range uint64(20) {
		s := newSampler(llm.SamplingParams{Temperature: 1, Seed: seed, HasSeed: true}, len(toks), nil, nil, b)
		if got := s.Sample([]float32{ninf, ninf, 1, ninf, ninf, 3}); got.ID != 3 {
			t.Fatalf("seed %d: %d with every allowed logit -Inf, want { (3)", seed, got.ID)
		}
		got := s.Sample([]float32{ninf, ninf, 1, ninf, ninf, 3})
		if got.ID != 0 && got.ID != 1 {
			t.Fatalf("seed %d: %d, want a or b", seed, got.ID)
		}
	}
}

// BenchmarkSampleConstrained is one greedy or sampled step under a grammar over the
// 152k-token Qwen vocabulary, masks cached (the grammar's part of a decode step):
// compare with BenchmarkSample's unconstrained figures.
func BenchmarkSampleConstrained(b *testing.B) {
	m, _ := loadFixture(b, "rand-qwen2-qwen2vocab-f32.gguf", 1)
	n := m.Config.VocabSize
	v := grammar.NewVocab(n, m.Tokenizer.Piece, m.Tokenizer.EOGTokens())
	logits := randLogits(1, n, 2)
	for _, tc := range schematest.Cases()[:1] {
		g, err := grammar.JSONSchema(tc.Schema)
		if err != nil {
			b.Fatal(err)
		}
		cg, err := grammar.Compile(g)
		if err != nil {
			b.Fatal(err)
		}
		bd := grammar.Bind(cg, v)
		for _, sc := range []struct {
			name string
			p    SamplingParams
		}{{"greedy", SamplingParams{}}, {"topp0.95_T0.8", SamplingParams{Temperature: 0.8, TopP: 0.95}}} {
			b.Run(tc.Name+"/"+sc.name, func(b *testing.B) {
				buf := make([]float32, n)
				s := newSampler(seeded(sc.p, 1), n, nil, nil, bd)
				for range 2000 { // fill the mask cache along the walks the benchmark takes
					copy(buf, logits)
					s.Sample(buf)
					if s.constraintDone() {
						s = newSampler(seeded(sc.p, 1), n, nil, nil, bd)
					}
				}
				b.ResetTimer()
				for b.Loop() {
					copy(buf, logits)
					s.Sample(buf)
					if s.constraintDone() {
						s = newSampler(seeded(sc.p, 1), n, nil, nil, bd)
					}
				}
			})
		}
	}
}

// A grammar the vocabulary cannot spell allows no token: the sampler reports it (the
// engine then ends the sequence with the error and counts it) rather than pick one.
func TestSamplerMaskDeadEnd(t *testing.T) {
	toks := []string{"a", "b", ""}
	v := grammar.NewVocab(len(toks), func(id int32) []byte { return []byte(toks[id]) }, []int32{2})
	g, _ := grammar.ParseGBNF(`root ::= "a" "c"`)
	cg, _ := grammar.Compile(g)
	s := newSampler(llm.SamplingParams{}, len(toks), nil, nil, grammar.Bind(cg, v))
	if got := s.Sample([]float32{0, 1, 2}); got.ID != 0 || s.constraintErr() != nil {
		t.Fatalf("first token %d (%v), want a", got.ID, s.constraintErr())
	}
	s.Sample([]float32{0, 1, 2})
	if err := s.constraintErr(); err == nil || !strings.Contains(err.Error(), "allows no token") {
		t.Errorf("dead end: %v", err)
	}
}
