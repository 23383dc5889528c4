package grammar

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// mustGBNF parses and compiles src.
func mustGBNF(t testing.TB, src string) *Compiled {
	t.Helper()
	g, err := ParseGBNF(src)
	if err != nil {
		t.Fatalf("ParseGBNF(%q): %v", src, err)
	}
	c, err := Compile(g)
	if err != nil {
		t.Fatalf("Compile(%q): %v", src, err)
	}
	return c
}

// byteVocab is a vocabulary of every single byte plus the given multi-byte tokens, and
// one end-of-generation token (the last id).
func byteVocab(extra ...string) (*Vocab, []string) {
	toks := make([]string, 0, 257+len(extra))
	for b := range 256 {
		toks = append(toks, string([]byte{byte(b)}))
	}
	toks = append(toks, extra...)
	toks = append(toks, "") // EOG
	eog := int32(len(toks) - 1)
	return NewVocab(len(toks), func(id int32) []byte { return []byte(toks[id]) }, []int32{eog}), toks
}

// matches reports whether the grammar accepts s as a whole.
func matches(c *Compiled, s string) bool {
	v, _ := byteVocab()
	m := Bind(c, v).NewMatcher()
	return m.AcceptText(s) == nil && m.CanEnd()
}

func TestParseAndMatch(t *testing.T) {
	cases := []struct {
		src     string
		yes, no []string
	}{
		{`root ::= "a" | "b" "c"`, []string{"a", "bc"}, []string{"", "b", "ab", "bcc"}},
		{`root ::= [a-c]+ "!"?`, []string{"a", "abc!", "cc"}, []string{"", "!", "ad", "a!!"}},
		{`root ::= [^a-c]`, []string{"d", "é", "😀", "\x00"}, []string{"a", "", "dd"}},
		{"root ::= x{2,3}\nx ::= \"ab\"", []string{"abab", "ababab"}, []string{"ab", "abababab"}},
		{`root ::= "x"{3}`, []string{"xxx"}, []string{"xx", "xxxx"}},
		{`root ::= "x"{2,}`, []string{"xx", "xxxxx"}, []string{"x"}},
		{`root ::= "x"{,2}`, []string{"", "x", "xx"}, []string{"xxx"}},
		{`root ::= . .`, []string{"ab", "éa", "😀😀"}, []string{"a", "abc"}},
		{"root ::= list\nlist ::= item (\",\" item)*\nitem ::= [0-9]+", []string{"1", "1,22,333"}, []string{"", "1,", ",1"}},
		// Right recursion (tail calls) and nested recursion.
		{"root ::= \"a\" root | \"b\"", []string{"b", "aaab"}, []string{"a", "ba"}},
		{"root ::= \"(\" root \")\" | \"\"", []string{"", "()", "((()))"}, []string{"(", "())", ")("}},
		// Alternatives continued on the next line, comments, escapes.
		{"root ::= \"a\" # first\n  | \"\\n\" | [\\]\\-]\n", []string{"a", "\n", "]", "-"}, []string{"b", "\\"}},
		{`root ::= "\x41\u00e9\U0001F600"`, []string{"Aé😀"}, []string{"A"}},
		{"root ::= (\n  \"a\"\n  | \"b\"\n)+", []string{"ab", "ba"}, []string{""}},
	}
	for _, tc := range cases {
		c := mustGBNF(t, tc.src)
		for _, s := range tc.yes {
			if !matches(c, s) {
				t.Errorf("%q should match %q", tc.src, s)
			}
		}
		for _, s := range tc.no {
			if matches(c, s) {
				t.Errorf("%q should not match %q", tc.src, s)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{`root ::= "a`, "unterminated string"},
		{`root ::= [a-`, "unterminated character class"},
		{`root ::= x`, `rule "x" is used but not defined`},
		{`x ::= "a"`, "no root rule"},
		{"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
		{`root ::= "a"{3,2}`, "maximum is below the minimum"},
		{`root ::= "a"{99999}`, "over 10000"},
		{`root ::= ("a"`, "unclosed ("},
		{`root ::= "a"**`, "repetition of a repetition"},
		{`root ::= "\q"`, `unknown escape \q`},
		{`root ::= [z-a]`, "reversed"},
		{"root ::= @", "unexpected"},
		{"root ::= \"a\" x ::= \"b\"", "middle of a line"},
	}
	for _, tc := range cases {
		_, err := ParseGBNF(tc.src)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseGBNF(%q) = %v, want an error with %q", tc.src, err, tc.want)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{"root ::= root \"a\" | \"b\"", "left-recursive"},
		{"root ::= x\nx ::= \"y\"? root | \"z\"", "left-recursive"},
		{"root ::= \"a\" root", "can never end"},
		{`root ::= [^\x00-\U0010FFFF]`, "matches no character"},
		{`root ::= ("abcdefgh"{1000}){1000}`, "automaton nodes"},
	}
	for _, tc := range cases {
		g, err := ParseGBNF(tc.src)
		if err != nil {
			t.Fatalf("ParseGBNF(%q): %v", tc.src, err)
		}
		_, err = Compile(g)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Compile(%q) = %v, want an error with %q", tc.src, err, tc.want)
		}
	}
	g, _ := ParseGBNF("root ::= root \"a\" | \"b\"")
	if _, err := Compile(g); !errors.Is(err, ErrUnsupported) {
		t.Errorf("left recursion: %v does not wrap ErrUnsupported", err)
	}
}

// The printed form parses back to the same grammar.
func TestStringRoundTrip(t *testing.T) {
	srcs := []string{
		`root ::= "a" | "b" "c"`,
		"root ::= (\"x\" | y)* [^\"\\\\\\n]{2,5} \"\\u00e9\\t\"\ny ::= \"\" | \"(\" y \")\"",
		`root ::= ("a"?)+ ("b"{0})`,
		`root ::= [\]\-\^a-z] . "\x7f\x00"`,
	}
	for _, src := range srcs {
		g, err := ParseGBNF(src)
		if err != nil {
			t.Fatal(err)
		}
		out := g.String()
		g2, err := ParseGBNF(out)
		if err != nil {
			t.Fatalf("%q printed as %q, which does not parse: %v", src, out, err)
		}
		if out2 := g2.String(); out2 != out {
			t.Errorf("%q: printed %q, then %q", src, out, out2)
		}
	}
}

// bruteMask is the mask computed the slow way: every token tried from a fresh matcher
// that has read prefix.
func bruteMask(b *Bound, prefix []int32) []uint64 {
	mask := make([]uint64, b.v.MaskWords())
	for id := range int32(b.v.Size()) {
		m := b.NewMatcher()
		ok := true
		for _, p := range prefix {
			if m.Accept(p) != nil {
				ok = false
				break
			}
		}
		if ok && m.Accept(id) == nil {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	return mask
}

func maskIDs(mask []uint64, n int) []int32 {
	var out []int32
	for id := range int32(n) {
		if mask[id>>6]&(1<<(id&63)) != 0 {
			out = append(out, id)
		}
	}
	return out
}

// FillMask agrees with trying every token, along random walks through the grammar.
func TestMaskMatchesBruteForce(t *testing.T) {
	grammars := []string{
		`root ::= "{" ws "\"a\"" ws ":" ws num ws "}"` + "\nws ::= [ \\n]*\nnum ::= \"-\"? [0-9]+ (\".\" [0-9]+)?",
		"root ::= item (\",\" item)*\nitem ::= \"\\\"\" [a-c]* \"\\\"\" | [0-9]+",
		"root ::= \"(\" root \")\" root | \"\"",
		`root ::= [a-z]{2,4} ("," [a-z]{2,4}){0,3}`,
		`root ::= "é" [^a]? "😀"+`,
	}
	extra := []string{"ab", "abc", "\",\"", "\"a", "a\"", "\",", "12", "1.", ".5", "{\"", "\":", ": ", "},", "()", "((", "))", ")(", "é😀", "😀😀", "\xf0\x9f", "\x98\x80", ",ab", "abc,d", "\"}", "{ \"a\": 1}"}
	v, toks := byteVocab(extra...)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, src := range grammars {
		b := Bind(mustGBNF(t, src), v)
		for walk := range 8 {
			m := b.NewMatcher()
			var prefix []int32
			for step := range 12 {
				mask := make([]uint64, v.MaskWords())
				m.FillMask(mask)
				want := bruteMask(b, prefix)
				if !slices.Equal(mask, want) {
					t.Fatalf("%q walk %d step %d after %q: mask %q, want %q", src, walk, step, tokText(toks, prefix),
						tokList(toks, maskIDs(mask, v.Size())), tokList(toks, maskIDs(want, v.Size())))
				}
				ids := maskIDs(mask, v.Size())
				if len(ids) == 0 {
					break
				}
				id := ids[rng.IntN(len(ids))]
				if err := m.Accept(id); err != nil {
					t.Fatalf("%q: Accept(%q) of an allowed token: %v", src, toks[id], err)
				}
				prefix = append(prefix, id)
				if m.Done() {
					break
				}
			}
		}
	}
}

func tokText(toks []string, ids []int32) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(toks[id])
	}
	return sb.String()
}

func tokList(toks []string, ids []int32) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		if toks[id] == "" {
			out[i] = "<eog>"
		} else {
			out[i] = toks[id]
		}
	}
	return out
}

func TestMatcherDone(t *testing.T) {
	v, toks := byteVocab("ab")
	eog := int32(len(toks) - 1)
	b := Bind(mustGBNF(t, `root ::= "ab" "c"?`), v)
	m := b.NewMatcher()
	if m.Accept(eog) == nil {
		t.Fatal("end of generation accepted at the start")
	}
	if err := m.Accept(256); err != nil { // "ab"
		t.Fatal(err)
	}
	if !m.CanEnd() || m.Done() {
		t.Fatalf("after ab: CanEnd %v Done %v, want true false", m.CanEnd(), m.Done())
	}
	mask := make([]uint64, v.MaskWords())
	m.FillMask(mask)
	if got := tokList(toks, maskIDs(mask, v.Size())); !slices.Equal(got, []string{"c", "<eog>"}) {
		t.Errorf("mask after ab: %q", got)
	}
	if err := m.Accept('c'); err != nil {
		t.Fatal(err)
	}
	if !m.Done() {
		t.Error("not done after abc")
	}
	if m.Accept('c') == nil {
		t.Error("a token accepted after the end")
	}
}

func TestTextWithoutAndThrough(t *testing.T) {
	for _, stop := range []string{"</think>", "aab", "<tool_call>", "éé"} {
		b := NewBuilder()
		without, err := b.Build(b.TextWithout(stop))
		if err != nil {
			t.Fatal(err)
		}
		b = NewBuilder()
		through, err := b.Build(b.TextThrough(stop))
		if err != nil {
			t.Fatal(err)
		}
		cw, err := Compile(without)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := Compile(through)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(len(stop))))
		alphabet := []rune(stop + "xy")
		for range 300 {
			var sb strings.Builder
			for range rng.IntN(14) {
				sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
			}
			s := sb.String()
			if got, want := matches(cw, s), !strings.Contains(s, stop); got != want {
				t.Errorf("without %q: %q matched %v, want %v", stop, s, got, want)
			}
			want := strings.Contains(s, stop) && strings.Index(s, stop)+len(stop) == len(s)
			if got := matches(ct, s); got != want {
				t.Errorf("through %q: %q matched %v, want %v", stop, s, got, want)
			}
		}
		// Inclusion keeps the language.
		b2 := NewBuilder()
		g2, err := b2.Build(Seq(Lit("["), b2.Include(through), Lit("]")))
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Compile(g2)
		if err != nil {
			t.Fatal(err)
		}
		if !matches(c2, "[x"+stop+"]") || matches(c2, "[x"+stop+stop+"]") {
			t.Errorf("%q: the included grammar does not keep the language", stop)
		}
	}
}
