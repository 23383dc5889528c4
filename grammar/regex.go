package grammar

import (
	"fmt"
	"regexp/syntax"
	"strings"
	"unicode"
)

// MaxRegexBytes bounds a regular expression's source.
const MaxRegexBytes = 64 << 10

// Regex returns the grammar of the texts that pattern matches as a whole (as vLLM's
// guided_regex and JSON Schema's pattern are used for generation: leading ^ and
// trailing $ are implied). The syntax is RE2's (Go's regexp/syntax, Perl flags): no
// lookaround, no backreferences; \b and anchors other than at the ends are refused.
func Regex(pattern string) (*Grammar, error) {
	x, err := regexExpr(pattern, rawChars)
	if err != nil {
		return nil, err
	}
	return NewBuilder().Build(x)
}

// charEncoder writes a set of code points (sorted [lo, hi] pairs) as an expression: as
// themselves, or as they appear inside a JSON string.
type charEncoder func(ranges []rune) Expr

func rawChars(ranges []rune) Expr { return Expr{&expr{op: opClass, ranges: ranges}} }

// regexExpr converts pattern to an expression, each character written by enc.
func regexExpr(pattern string, enc charEncoder) (Expr, error) {
	if len(pattern) > MaxRegexBytes {
		return Expr{}, fmt.Errorf("grammar: regular expression of %d bytes (at most %d)", len(pattern), MaxRegexBytes)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return Expr{}, fmt.Errorf("grammar: regular expression %q: %w: %w", pattern, err, ErrUnsupported)
	}
	x, err := (&regexConv{enc: enc, pattern: pattern}).conv(re, true, true)
	if err != nil {
		return Expr{}, err
	}
	return x, nil
}

type regexConv struct {
	enc     charEncoder
	pattern string
}

func (c *regexConv) unsupported(what string) error {
	return fmt.Errorf("grammar: regular expression %q: %s is not supported: %w", c.pattern, what, ErrUnsupported)
}

// conv converts re; atStart and atEnd say whether it lies at the start or the end of the
// whole pattern, where anchors are allowed (and mean nothing, the match being whole).
func (c *regexConv) conv(re *syntax.Regexp, atStart, atEnd bool) (Expr, error) {
	switch re.Op {
	case syntax.OpNoMatch:
		return Expr{}, c.unsupported("a part that matches nothing")
	case syntax.OpEmptyMatch:
		return Expr{}, nil
	case syntax.OpLiteral:
		parts := make([]Expr, 0, len(re.Rune))
		for _, r := range re.Rune {
			if re.Flags&syntax.FoldCase != 0 {
				parts = append(parts, c.enc(foldRanges(r)))
			} else {
				parts = append(parts, c.enc([]rune{r, r}))
			}
		}
		return mergeLits(parts), nil
	case syntax.OpCharClass:
		rs := normRanges(re.Rune, false)
		if len(rs) == 0 {
			return Expr{}, c.unsupported("an empty character class")
		}
		return c.enc(rs), nil
	case syntax.OpAnyCharNotNL:
		return c.enc([]rune{0, '\n' - 1, '\n' + 1, MaxCodePoint}), nil
	case syntax.OpAnyChar:
		return c.enc([]rune{0, MaxCodePoint}), nil
	case syntax.OpBeginLine, syntax.OpBeginText:
		if !atStart {
			return Expr{}, c.unsupported("^ other than at the start")
		}
		return Expr{}, nil
	case syntax.OpEndLine, syntax.OpEndText:
		if !atEnd {
			return Expr{}, c.unsupported("$ other than at the end")
		}
		return Expr{}, nil
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return Expr{}, c.unsupported(`\b and \B`)
	case syntax.OpCapture:
		return c.conv(re.Sub[0], atStart, atEnd)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		sub, err := c.conv(re.Sub[0], false, false)
		if err != nil {
			return Expr{}, err
		}
		switch re.Op {
		case syntax.OpStar:
			return Star(sub), nil
		case syntax.OpPlus:
			return Plus(sub), nil
		case syntax.OpQuest:
			return Opt(sub), nil
		}
		if re.Max > MaxRepeat || re.Min > MaxRepeat {
			return Expr{}, c.unsupported(fmt.Sprintf("a repetition count over %d", MaxRepeat))
		}
		return Repeat(sub, re.Min, re.Max), nil
	case syntax.OpConcat:
		parts := make([]Expr, 0, len(re.Sub))
		for i, s := range re.Sub {
			x, err := c.conv(s, atStart && i == 0, atEnd && i == len(re.Sub)-1)
			if err != nil {
				return Expr{}, err
			}
			parts = append(parts, x)
		}
		return mergeLits(parts), nil
	case syntax.OpAlternate:
		alts := make([]Expr, 0, len(re.Sub))
		for _, s := range re.Sub {
			x, err := c.conv(s, atStart, atEnd)
			if err != nil {
				return Expr{}, err
			}
			alts = append(alts, x)
		}
		return Alt(alts...), nil
	}
	return Expr{}, c.unsupported(fmt.Sprintf("the operator %v", re.Op))
}

// foldRanges is the case-folding orbit of r as ranges.
func foldRanges(r rune) []rune {
	rs := []rune{r, r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rs = append(rs, f, f)
	}
	return normRanges(rs, false)
}

// mergeLits joins runs of one-character classes and literals into literals.
func mergeLits(parts []Expr) Expr {
	var out []Expr
	var run strings.Builder
	flush := func() {
		if run.Len() > 0 {
			out = append(out, Lit(run.String()))
			run.Reset()
		}
	}
	for _, p := range parts {
		n := p.node()
		switch {
		case n.op == opLit:
			run.WriteString(n.lit)
		case n.op == opClass && len(n.ranges) == 2 && n.ranges[0] == n.ranges[1] && !(n.ranges[0] >= 0xD800 && n.ranges[0] <= 0xDFFF):
			run.WriteRune(n.ranges[0])
		default:
			flush()
			out = append(out, p)
		}
	}
	flush()
	return Seq(out...)
}

// jsonChars writes a set of code points as they appear inside a JSON string: plain,
// except the quote, the backslash and control characters, which are escaped (one
// canonical escape each).
func jsonChars(ranges []rune) Expr {
	var alts []Expr
	plain := subtractRanges(ranges, []rune{0, 0x1F, '"', '"', '\\', '\\'})
	if len(plain) > 0 {
		alts = append(alts, Expr{&expr{op: opClass, ranges: plain}})
	}
	for i := 0; i < len(ranges); i += 2 {
		for r := ranges[i]; r <= ranges[i+1] && r <= '\\'; r++ {
			if r < 0x20 || r == '"' || r == '\\' {
				alts = append(alts, Lit(jsonEscape(r)))
			}
		}
	}
	return Alt(alts...)
}

func jsonEscape(r rune) string {
	switch r {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	}
	return fmt.Sprintf(`\u%04x`, r)
}

// subtractRanges returns a − b for normalised range lists.
func subtractRanges(a, b []rune) []rune {
	nb := normRanges(b, true) // the complement of b
	var out []rune
	for i := 0; i < len(a); i += 2 {
		for j := 0; j < len(nb); j += 2 {
			lo, hi := max(a[i], nb[j]), min(a[i+1], nb[j+1])
			if lo <= hi {
				out = append(out, lo, hi)
			}
		}
	}
	return normRanges(out, false)
}
