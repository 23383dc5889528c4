package grammar_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"tandem/gguf"
	"tandem/grammar"
	"tandem/internal/fixtures"
	"tandem/internal/schematest"
	"tandem/tokenizer"
)

var (
	vocabMu    sync.Mutex
	vocabCache = map[string]*grammar.Vocab{}
)

// fixtureVocab loads a fixture model's tokenizer and builds its grammar vocabulary once.
func fixtureVocab(t testing.TB, file string) (*grammar.Vocab, *tokenizer.Tokenizer) {
	t.Helper()
	f, err := gguf.Open(fixtures.Model(t, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	vocabMu.Lock()
	defer vocabMu.Unlock()
	if v, ok := vocabCache[file]; ok {
		return v, tk
	}
	v := grammar.NewVocab(tk.VocabSize(), tk.Piece, tk.EOGTokens())
	vocabCache[file] = v
	return v, tk
}

func compileSchema(t testing.TB, schema []byte) *grammar.Compiled {
	t.Helper()
	g, err := grammar.JSONSchema(schema)
	if err != nil {
		t.Fatalf("JSONSchema(%s): %v", schema, err)
	}
	c, err := grammar.Compile(g)
	if err != nil {
		t.Fatalf("Compile: %v\n%s", err, g)
	}
	// The printed grammar is the grammar.
	g2, err := grammar.ParseGBNF(g.String())
	if err != nil || g2.String() != g.String() {
		t.Fatalf("the printed grammar does not parse back to itself (%v):\n%s", err, g)
	}
	return c
}

// The validator and the grammar agree on the test set's examples.
func TestSchemaSetExamples(t *testing.T) {
	for _, tc := range schematest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			c := compileSchema(t, tc.Schema)
			v := grammar.NewVocab(1, func(int32) []byte { return nil }, []int32{0})
			accepts := func(text []byte) bool {
				m := grammar.Bind(c, v).NewMatcher()
				return m.AcceptText(string(text)) == nil && m.CanEnd()
			}
			for _, ex := range tc.Valid {
				if err := schematest.Validate(ex, tc.Schema); err != nil {
					t.Errorf("validator refuses valid %s: %v", ex, err)
				}
				var compact bytes.Buffer
				json.Compact(&compact, ex)
				for _, text := range [][]byte{ex, compact.Bytes()} {
					if !accepts(text) {
						t.Errorf("grammar refuses valid %s", text)
					}
				}
			}
			for _, ex := range tc.Invalid {
				if schematest.Validate(ex, tc.Schema) == nil {
					t.Errorf("validator accepts invalid %s", ex)
				}
				if accepts(ex) {
					t.Errorf("grammar accepts invalid %s", ex)
				}
			}
		})
	}
}

// generate samples a sentence of the grammar token by token from the mask: uniformly
// among the allowed tokens, ending on an end-of-generation token when one is drawn.
func generate(t *testing.T, b *grammar.Bound, rng *rand.Rand, maxSteps int) ([]byte, bool) {
	t.Helper()
	v := b.Vocab()
	m := b.NewMatcher()
	mask := make([]uint64, v.MaskWords())
	var out []byte
	var allowed []int32
	for range maxSteps {
		if m.Done() {
			return out, true
		}
		m.FillMask(mask)
		allowed = allowed[:0]
		for w, word := range mask {
			for word != 0 {
				bit := word & -word
				id := int32(w*64) + int32(bitsTrailing(bit))
				allowed = append(allowed, id)
				word &^= bit
			}
		}
		if len(allowed) == 0 {
			t.Fatalf("no token allowed after %q", out)
		}
		id := allowed[rng.IntN(len(allowed))]
		if err := m.Accept(id); err != nil {
			t.Fatalf("Accept of an allowed token %d after %q: %v", id, out, err)
		}
		if v.IsEOG(id) {
			return out, true
		}
		out = append(out, v.Token(id)...)
	}
	return out, m.Done()
}

func bitsTrailing(x uint64) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

// Every text sampled from the mask over the real 152k Qwen and 128k Llama 3 vocabularies
// is valid under its schema.
func TestSchemaSetSampledValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("samples with the full vocabularies")
	}
	for _, file := range []string{"rand-qwen2-qwen2vocab-f32.gguf", "rand-llama-llama3vocab-f32.gguf"} {
		v, _ := fixtureVocab(t, file)
		for _, tc := range schematest.Cases() {
			t.Run(file+"/"+tc.Name, func(t *testing.T) {
				b := grammar.Bind(compileSchema(t, tc.Schema), v)
				rng := rand.New(rand.NewPCG(7, uint64(len(tc.Name))))
				for range 5 {
					out, done := generate(t, b, rng, 2000)
					if !done {
						t.Fatalf("not finished after 2000 tokens: %q", out)
					}
					if err := schematest.Validate(out, tc.Schema); err != nil {
						t.Errorf("sampled %q: %v", out, err)
					}
				}
			})
		}
	}
}

func TestSchemaErrors(t *testing.T) {
	cases := []struct {
		schema, want string
		unsupported  bool
	}{
		{`{"type": "object", "not": {}}`, `"not" is not supported`, true},
		{`{"type": "integer", "multipleOf": 3}`, `"multipleOf" is not supported`, true},
		{`{"type": "array", "uniqueItems": true}`, `"uniqueItems" is not supported`, true},
		{`{"type": "object", "patternProperties": {"a": {}}}`, `"patternProperties"`, true},
		{`{"type": "string", "format": "email"}`, `format "email" is not supported`, true},
		{`{"type": "number", "minimum": 0.5}`, "not an integer", true},
		{`{"allOf": [{"type": "string"}, {"maxLength": 3}]}`, "allOf with more than one", true},
		{`{"$ref": "https://example.com/s.json"}`, "only local references", true},
		{`{"type": "string", "pattern": "(?=a)"}`, "regular expression", true},
		{`{"type": "string", "pattern": "a\\bb"}`, `\b`, true},
		{`{"type": "string", "pattern": "[a-z]+", "maxLength": 3}`, "pattern together with", true},
		{`{"type": "object", "properties": {"a": {"type": "integer", "if": {}}}}`, `#/properties/a: the keyword "if"`, true},
		{`{"type": "wat"}`, `unknown type "wat"`, false},
		{`{"$ref": "#/$defs/missing"}`, "points to nothing", false},
		{`false`, "allows no value", false},
		{`{"type": "array", "minItems": 3, "maxItems": 2}`, "below minItems", false},
		{`{"type": "integer", "minimum": 5, "maximum": 4}`, "no integer", false},
		{`{"type": "string", "maxLength": 100000}`, "more than 10000", true},
		{`[1, 2]`, "must be an object or a boolean", false},
		{`{"type": "object"`, "json schema", false},
	}
	for _, tc := range cases {
		_, err := grammar.JSONSchema([]byte(tc.schema))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("JSONSchema(%s) = %v, want an error with %q", tc.schema, err, tc.want)
			continue
		}
		if errors.Is(err, grammar.ErrUnsupported) != tc.unsupported {
			t.Errorf("JSONSchema(%s): errors.Is(ErrUnsupported) = %v, want %v", tc.schema, !tc.unsupported, tc.unsupported)
		}
	}
}

// A recursive $ref (a tree) generates trees; sampling is steered to finish by a small
// vocabulary that makes closing likely.
func TestSchemaRecursiveRef(t *testing.T) {
	schema := []byte(`{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
		"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"], "additionalProperties": false}},
		"$ref": "#/$defs/node"}`)
	c := compileSchema(t, schema)
	v := grammar.NewVocab(1, func(int32) []byte { return nil }, []int32{0})
	for _, text := range []string{`{"v": 1}`, `{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}`} {
		m := grammar.Bind(c, v).NewMatcher()
		if err := m.AcceptText(text); err != nil || !m.CanEnd() {
			t.Errorf("%s refused: %v", text, err)
		}
		if err := schematest.Validate([]byte(text), schema); err != nil {
			t.Errorf("validator: %v", err)
		}
	}
	m := grammar.Bind(c, v).NewMatcher()
	if m.AcceptText(`{"v": 1, "kids": [{"v": 2}, {"v": 3}, {"v": 4}]}`) == nil && m.CanEnd() {
		t.Error("three kids accepted with maxItems 2")
	}
}

func TestIntegerRanges(t *testing.T) {
	v := grammar.NewVocab(1, func(int32) []byte { return nil }, []int32{0})
	cases := []struct {
		schema string
		lo, hi int
	}{
		{`{"type": "integer", "minimum": -123, "maximum": 45}`, -123, 45},
		{`{"type": "integer", "minimum": 7, "maximum": 7}`, 7, 7},
		{`{"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 101}`, 10, 100},
		{`{"type": "integer", "minimum": -20, "maximum": -10}`, -20, -10},
		{`{"type": "integer", "minimum": 2.5, "maximum": 19.5}`, 3, 19},
		{`{"type": "integer", "minimum": 0, "maximum": 1234}`, 0, 1234},
	}
	for _, tc := range cases {
		c := compileSchema(t, []byte(tc.schema))
		b := grammar.Bind(c, v)
		for x := tc.lo - 150; x <= tc.hi+150; x++ {
			m := b.NewMatcher()
			ok := m.AcceptText(itoa(x)) == nil && m.CanEnd()
			if ok != (x >= tc.lo && x <= tc.hi) {
				t.Errorf("%s: %d accepted = %v", tc.schema, x, ok)
			}
		}
		for _, bad := range []string{"-0", "007", "+5", "1e2"} {
			m := b.NewMatcher()
			if m.AcceptText(bad) == nil && m.CanEnd() {
				t.Errorf("%s: %q accepted", tc.schema, bad)
			}
		}
	}
}

func itoa(x int) string {
	b, _ := json.Marshal(x)
	return string(b)
}

func TestNumberRanges(t *testing.T) {
	v := grammar.NewVocab(1, func(int32) []byte { return nil }, []int32{0})
	cases := []struct {
		schema  string
		yes, no []string
	}{
		{`{"type": "number", "minimum": 0, "maximum": 1}`, []string{"0", "0.5", "1", "1.000", "0.999"}, []string{"-0.1", "1.01", "2", "-1"}},
		{`{"type": "number", "exclusiveMinimum": -40, "exclusiveMaximum": 60}`, []string{"-39.9", "0", "59.99", "-0.5"}, []string{"-40", "60", "60.0", "-40.0", "-41"}},
		{`{"type": "number", "minimum": -5}`, []string{"-5", "-4.5", "0", "123456.7"}, []string{"-5.1", "-6"}},
		{`{"type": "number", "maximum": -2}`, []string{"-2", "-2.0", "-3.5", "-1000"}, []string{"-1.9", "0", "2"}},
		{`{"type": "number", "exclusiveMinimum": 0}`, []string{"0.1", "5", "0.001"}, []string{"0", "0.0", "-1"}},
	}
	for _, tc := range cases {
		b := grammar.Bind(compileSchema(t, []byte(tc.schema)), v)
		for _, s := range tc.yes {
			m := b.NewMatcher()
			if err := m.AcceptText(s); err != nil || !m.CanEnd() {
				t.Errorf("%s: %s refused (%v)", tc.schema, s, err)
			}
		}
		for _, s := range tc.no {
			m := b.NewMatcher()
			if m.AcceptText(s) == nil && m.CanEnd() {
				t.Errorf("%s: %s accepted", tc.schema, s)
			}
		}
	}
}
