package grammar_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"tandem/grammar"
	"tandem/internal/schematest"
)

// benchGrammars are the grammars of the mask benchmarks: a schema of the test set, any
// JSON object (long free strings), and a regular expression.
func benchGrammars(b *testing.B) map[string]*grammar.Grammar {
	out := map[string]*grammar.Grammar{}
	for _, tc := range schematest.Cases() {
		if tc.Name == "nested_object" || tc.Name == "numbers" {
			g, err := grammar.JSONSchema(tc.Schema)
			if err != nil {
				b.Fatal(err)
			}
			out["schema-"+tc.Name] = g
		}
	}
	out["json-object"] = grammar.JSONObject()
	g, err := grammar.Regex(`[A-Z][a-z]{2,12}( [a-z]{1,10}){3,12}\.`)
	if err != nil {
		b.Fatal(err)
	}
	out["regex"] = g
	return out
}

// sampleTokens draws a sentence of b's grammar token by token.
func sampleTokens(b *testing.B, bd *grammar.Bound, rng *rand.Rand, max int) []int32 {
	v := bd.Vocab()
	m := bd.NewMatcher()
	mask := make([]uint64, v.MaskWords())
	var ids, allowed []int32
	for len(ids) < max && !m.Done() {
		m.FillMask(mask)
		allowed = allowed[:0]
		for id := range int32(v.Size()) {
			if mask[id>>6]&(1<<(id&63)) != 0 && !v.IsEOG(id) {
				allowed = append(allowed, id)
			}
		}
		if len(allowed) == 0 {
			break
		}
		id := allowed[rng.IntN(len(allowed))]
		if err := m.Accept(id); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// BenchmarkMaskQwen measures, for the 152k-token Qwen vocabulary, the time of one decode
// step's grammar work, FillMask and Accept, along sampled sentences once the node masks
// are cached (ns/token), and the one-off cost of computing them (cold-ms).
func BenchmarkMaskQwen(b *testing.B) {
	v, _ := fixtureVocab(b, "rand-qwen2-qwen2vocab-f32.gguf")
	for name, g := range benchGrammars(b) {
		b.Run(name, func(b *testing.B) {
			c, err := grammar.Compile(g)
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			var seqs [][]int32
			tokens := 0
			sampler := grammar.Bind(c, v)
			for range 8 {
				s := sampleTokens(b, sampler, rng, 300)
				seqs = append(seqs, s)
				tokens += len(s)
			}
			// The first pass over the sentences with a new binding computes every mask.
			mask := make([]uint64, v.MaskWords())
			bd := grammar.Bind(c, v)
			t0 := time.Now()
			for _, s := range seqs {
				m := bd.NewMatcher()
				for _, id := range s {
					m.FillMask(mask)
					if err := m.Accept(id); err != nil {
						b.Fatal(err)
					}
				}
			}
			cold := time.Since(t0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, s := range seqs {
					m := bd.NewMatcher()
					for _, id := range s {
						m.FillMask(mask)
						if err := m.Accept(id); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
			b.ReportMetric(float64(cold.Milliseconds()), "cold-ms")
		})
	}
}

// BenchmarkVocabQwen is the one-off cost of the 152k-token vocabulary trie.
func BenchmarkVocabQwen(b *testing.B) {
	_, tk := fixtureVocab(b, "rand-qwen2-qwen2vocab-f32.gguf")
	eog := tk.EOGTokens()
	for b.Loop() {
		grammar.NewVocab(tk.VocabSize(), tk.Piece, eog)
	}
}
