package grammar

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// Any text either fails to parse or parses to a grammar whose printed form parses back
// to itself; compiling it succeeds or fails cleanly, and a matcher reads any bytes.
func FuzzParseGBNF(f *testing.F) {
	for _, s := range []string{
		`root ::= "a" | [b-d]+ x?` + "\nx ::= (\"(\" x \")\")*",
		"root ::= [^\"\\\\]{2,5} . \"\\u00e9\"",
		"root ::= r\nr ::= \"x\" r | \"\"",
		"root ::= root \"a\" | \"b\"",
		"root ::= \"a\"{0}\n# c\n",
	} {
		f.Add(s, "abc(()))")
	}
	f.Fuzz(func(t *testing.T, src, input string) {
		if len(src) > 4096 {
			return
		}
		g, err := ParseGBNF(src)
		if err != nil {
			return
		}
		out := g.String()
		g2, err := ParseGBNF(out)
		if err != nil {
			t.Fatalf("%q printed as %q, which does not parse: %v", src, out, err)
		}
		if g2.String() != out {
			t.Fatalf("%q: printed %q, then %q", src, out, g2.String())
		}
		c, err := Compile(g)
		if err != nil {
			return
		}
		v, _ := byteVocab()
		m := Bind(c, v).NewMatcher()
		for i := 0; i < len(input) && i < 64; i++ {
			if m.Accept(int32(input[i])) != nil {
				break
			}
		}
	})
}

// A regular expression compiles to a grammar that matches exactly what Go's regexp
// matches as a whole, or is refused.
func FuzzRegex(f *testing.F) {
	for _, s := range []string{`[a-c]+x?`, `(ab|cd){1,3}`, `\d{2}-\w+`, `^(?i)abc$`, `a.b`, `[^a-z]*`, `(a|)+`, `\p{Greek}+`} {
		f.Add(s, "ab")
	}
	f.Fuzz(func(t *testing.T, pattern, input string) {
		if len(pattern) > 256 || !utf8.ValidString(input) || !utf8.ValidString(pattern) {
			return
		}
		g, err := Regex(pattern)
		if err != nil {
			return
		}
		c, err := Compile(g)
		if err != nil {
			return
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			t.Fatalf("we accept %q, Go's regexp does not: %v", pattern, err)
		}
		if strings.ContainsAny(pattern, "^$") {
			return // anchors inside alternatives mean more to Go's regexp than to a whole match
		}
		re.Longest() // the leftmost-longest match is the whole text when a whole match exists
		whole := func(s string) bool {
			loc := re.FindStringIndex(s)
			return loc != nil && loc[0] == 0 && loc[1] == len(s)
		}
		for _, s := range []string{input, "", "a", "ab", "abc", "x"} {
			if got, want := matches(c, s), whole(s); got != want {
				t.Fatalf("%q on %q: grammar %v, regexp %v", pattern, s, got, want)
			}
		}
	})
}

// Any schema is refused with an error or compiles, and its grammar prints and parses back.
func FuzzJSONSchema(f *testing.F) {
	for _, s := range []string{
		`{"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 99}}, "required": ["a"]}`,
		`{"type": "array", "items": {"enum": ["x", 1, null]}, "minItems": 1, "maxItems": 3}`,
		`{"anyOf": [{"type": "string", "pattern": "^[a-z]{2}$"}, {"$ref": "#/$defs/n"}], "$defs": {"n": {"type": "number", "exclusiveMinimum": 0}}}`,
		`{"type": ["string", "null"], "maxLength": 3}`,
		`true`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, schema string) {
		if len(schema) > 4096 {
			return
		}
		g, err := JSONSchema([]byte(schema))
		if err != nil {
			return
		}
		out := g.String()
		g2, err := ParseGBNF(out)
		if err != nil || g2.String() != out {
			t.Fatalf("%s: the printed grammar does not parse back (%v):\n%s", schema, err, out)
		}
		if _, err := Compile(g); err != nil && !strings.Contains(err.Error(), "automaton nodes") && !strings.Contains(err.Error(), "can never end") &&
			!strings.Contains(err.Error(), "left-recursive") {
			t.Fatalf("%s: the grammar does not compile: %v", schema, err)
		}
	})
}
