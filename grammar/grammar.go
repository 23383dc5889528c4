// Package grammar is constrained decoding: grammars over text (GBNF, regular expressions,
// choices, JSON Schema) compiled to byte automata, and a per-step mask of the tokens a
// vocabulary may produce next without leaving the grammar's language.
//
// The pieces, in the order they are used:
//
//   - A Grammar is a set of rules over Unicode text: literals, character classes, rule
//     references, sequences, alternatives and bounded or unbounded repetition. It is
//     written in a GBNF dialect (ParseGBNF, Grammar.String, which parse back to the same
//     grammar), or built from a JSON Schema (Builder.JSONSchema), a regular expression
//     (Regex) or a list of choices (Choice), or composed with a Builder.
//   - Compile turns a Grammar into a recursive transition network over bytes: one small
//     automaton per rule whose edges are byte ranges or calls of other rules. Left
//     recursion and rules that can never end are refused.
//   - A Vocab is a tokenizer's tokens as byte strings in a trie, built once per tokenizer.
//   - Bind pairs a compiled grammar with a vocabulary. For every automaton node it computes,
//     the first time the node is reached, which tokens the node accepts whatever rule
//     called it (context-independent), and for the rest which suffix must be checked
//     against the caller (context-dependent). It is safe for concurrent use.
//   - A Matcher is one sequence's position in the grammar: FillMask gives the tokens
//     allowed next, Accept advances by a token, Done says nothing may follow.
//
// The design follows xgrammar's (a pushdown automaton with an adaptive cache of
// context-independent token masks); docs/structured-outputs.md describes it.
package grammar

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrUnsupported wraps errors about a feature of a schema, regular expression or grammar
// that this package does not implement; the message names it.
var ErrUnsupported = errors.New("unsupported")

// op is the kind of an expression.
type op uint8

const (
	opEmpty  op = iota // the empty string
	opLit              // a literal string
	opClass            // one character of a set
	opRef              // a rule
	opSeq              // a sequence
	opAlt              // alternatives
	opRepeat           // sub{min,max}
)

// MaxCodePoint is the largest Unicode code point.
const MaxCodePoint = utf8.MaxRune

// expr is an immutable expression node; Exprs share them.
type expr struct {
	op       op
	lit      string // opLit
	ranges   []rune // opClass: sorted, disjoint, non-adjacent [lo, hi] pairs of code points
	ref      int    // opRef: rule index
	subs     []*expr
	min, max int // opRepeat; max < 0: unbounded
}

// Expr is a grammar expression. The zero Expr matches the empty string. Exprs are
// values: combining them never changes them.
type Expr struct{ e *expr }

var emptyExpr = &expr{op: opEmpty}

func (x Expr) node() *expr {
	if x.e == nil {
		return emptyExpr
	}
	return x.e
}

// Lit matches s exactly.
func Lit(s string) Expr {
	if s == "" {
		return Expr{}
	}
	return Expr{&expr{op: opLit, lit: s}}
}

// Class matches one code point in the ranges, given as [lo, hi] pairs (inclusive, in any
// order, possibly overlapping); negate matches one code point outside them. Surrogate
// code points are never matched (they have no UTF-8 form).
func Class(negate bool, ranges ...rune) Expr {
	return Expr{&expr{op: opClass, ranges: normRanges(ranges, negate)}}
}

// AnyChar matches any one code point.
func AnyChar() Expr { return Class(false, 0, MaxCodePoint) }

// Seq matches its parts one after the other.
func Seq(parts ...Expr) Expr {
	var subs []*expr
	for _, p := range parts {
		n := p.node()
		switch n.op {
		case opEmpty:
		case opSeq:
			subs = append(subs, n.subs...)
		default:
			subs = append(subs, n)
		}
	}
	switch len(subs) {
	case 0:
		return Expr{}
	case 1:
		return Expr{subs[0]}
	}
	return Expr{&expr{op: opSeq, subs: subs}}
}

// Alt matches any one of its alternatives.
func Alt(alts ...Expr) Expr {
	var subs []*expr
	for _, a := range alts {
		n := a.node()
		if n.op == opAlt {
			subs = append(subs, n.subs...)
		} else {
			subs = append(subs, n)
		}
	}
	if len(subs) == 1 {
		return Expr{subs[0]}
	}
	return Expr{&expr{op: opAlt, subs: subs}}
}

// Repeat matches x between min and max times; max < 0 means no upper bound.
func Repeat(x Expr, min, max int) Expr {
	if min < 0 {
		min = 0
	}
	if max >= 0 && max < min {
		max = min
	}
	if max == 0 {
		return Expr{}
	}
	if min == 1 && max == 1 {
		return x
	}
	return Expr{&expr{op: opRepeat, subs: []*expr{x.node()}, min: min, max: max}}
}

// Opt matches x or nothing.
func Opt(x Expr) Expr { return Repeat(x, 0, 1) }

// Star matches x any number of times.
func Star(x Expr) Expr { return Repeat(x, 0, -1) }

// Plus matches x one or more times.
func Plus(x Expr) Expr { return Repeat(x, 1, -1) }

// Grammar is a set of named rules over Unicode text; rule 0 is the root, whose language
// the grammar is. A Grammar is immutable.
type Grammar struct {
	names []string
	rules []*expr
}

// Builder assembles a Grammar from rules. Rule names are made unique and valid for
// GBNF as they are defined.
type Builder struct {
	names   []string
	rules   []*expr // nil: declared, not yet defined
	byName  map[string]int
	json    *jsonRules      // JSON's shared rules, made on first use (schema.go)
	without map[string]Expr // TextWithout's rules by stop text
}

// NewBuilder returns an empty Builder. Its first rule will be "root".
func NewBuilder() *Builder {
	b := &Builder{byName: map[string]int{}}
	b.names = append(b.names, "root")
	b.rules = append(b.rules, nil)
	b.byName["root"] = 0
	return b
}

// Declare reserves a rule named after name and returns a reference to it, to be defined
// later with Define (for recursive rules).
func (b *Builder) Declare(name string) Expr {
	name = b.unique(ruleName(name))
	b.byName[name] = len(b.rules)
	b.names = append(b.names, name)
	b.rules = append(b.rules, nil)
	return Expr{&expr{op: opRef, ref: len(b.rules) - 1}}
}

// Define sets the body of a rule from Declare.
func (b *Builder) Define(ref Expr, body Expr) {
	n := ref.node()
	if n.op != opRef || n.ref <= 0 || n.ref >= len(b.rules) {
		panic("grammar: Define of an expression that is not a declared rule")
	}
	b.rules[n.ref] = body.node()
}

// Rule defines a rule named after name with body x and returns a reference to it.
func (b *Builder) Rule(name string, x Expr) Expr {
	r := b.Declare(name)
	b.Define(r, x)
	return r
}

// Build returns the grammar whose root is x.
func (b *Builder) Build(x Expr) (*Grammar, error) {
	b.rules[0] = x.node()
	for i, r := range b.rules {
		if r == nil {
			return nil, fmt.Errorf("grammar: rule %s is declared but not defined", b.names[i])
		}
	}
	g := &Grammar{names: slices.Clone(b.names), rules: slices.Clone(b.rules)}
	return g, nil
}

func (b *Builder) unique(name string) string {
	if _, taken := b.byName[name]; !taken {
		return name
	}
	for i := 2; ; i++ {
		n := name + "-" + strconv.Itoa(i)
		if _, taken := b.byName[n]; !taken {
			return n
		}
	}
}

// ruleName maps s to a GBNF rule name: letters, digits and dashes.
func ruleName(s string) string {
	var sb strings.Builder
	dash := false
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		switch {
		case ok:
			sb.WriteRune(r)
			dash = false
		case !dash && sb.Len() > 0:
			sb.WriteByte('-')
			dash = true
		}
	}
	n := strings.TrimSuffix(sb.String(), "-")
	if n == "" || n == "root" {
		n = "r"
	}
	if len(n) > 48 {
		n = n[:48]
	}
	return n
}

// normRanges sorts and merges [lo, hi] pairs, clamps them to valid code points, and
// complements them when negate is set.
func normRanges(in []rune, negate bool) []rune {
	type rr struct{ lo, hi rune }
	var rs []rr
	for i := 0; i+1 < len(in); i += 2 {
		lo, hi := in[i], in[i+1]
		if lo > hi {
			lo, hi = hi, lo
		}
		lo, hi = max(lo, 0), min(hi, MaxCodePoint)
		if lo > hi {
			continue
		}
		rs = append(rs, rr{lo, hi})
	}
	slices.SortFunc(rs, func(a, b rr) int { return int(a.lo - b.lo) })
	var out []rune
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1]+1 {
			out[n-1] = max(out[n-1], r.hi)
			continue
		}
		out = append(out, r.lo, r.hi)
	}
	if negate {
		var comp []rune
		next := rune(0)
		for i := 0; i < len(out); i += 2 {
			if out[i] > next {
				comp = append(comp, next, out[i]-1)
			}
			next = out[i+1] + 1
		}
		if next <= MaxCodePoint {
			comp = append(comp, next, MaxCodePoint)
		}
		out = comp
	}
	return out
}

// String writes g in the GBNF dialect that ParseGBNF reads: the root rule first, one
// rule per line. ParseGBNF(g.String()) is g.
func (g *Grammar) String() string {
	var sb strings.Builder
	for i, r := range g.rules {
		sb.WriteString(g.names[i])
		sb.WriteString(" ::= ")
		g.writeExpr(&sb, r, 0)
		sb.WriteByte('\n')
	}
	return sb.String()
}

// Precedence levels for printing: alternatives < sequences < postfix atoms.
const (
	precAlt = iota
	precSeq
	precAtom
)

func (g *Grammar) writeExpr(sb *strings.Builder, e *expr, prec int) {
	switch e.op {
	case opEmpty:
		sb.WriteString(`""`)
	case opLit:
		writeLit(sb, e.lit)
	case opClass:
		writeClass(sb, e.ranges)
	case opRef:
		sb.WriteString(g.names[e.ref])
	case opSeq:
		if prec > precSeq {
			sb.WriteByte('(')
		}
		for i, s := range e.subs {
			if i > 0 {
				sb.WriteByte(' ')
			}
			g.writeExpr(sb, s, precAtom)
		}
		if prec > precSeq {
			sb.WriteByte(')')
		}
	case opAlt:
		if prec > precAlt {
			sb.WriteByte('(')
		}
		for i, s := range e.subs {
			if i > 0 {
				sb.WriteString(" | ")
			}
			g.writeExpr(sb, s, precSeq)
		}
		if prec > precAlt {
			sb.WriteByte(')')
		}
	case opRepeat:
		if sub := e.subs[0]; sub.op == opRepeat || sub.op == opEmpty {
			sb.WriteByte('(')
			g.writeExpr(sb, sub, precAlt)
			sb.WriteByte(')')
		} else {
			g.writeExpr(sb, sub, precAtom)
		}
		switch {
		case e.min == 0 && e.max == 1:
			sb.WriteByte('?')
		case e.min == 0 && e.max < 0:
			sb.WriteByte('*')
		case e.min == 1 && e.max < 0:
			sb.WriteByte('+')
		case e.max < 0:
			fmt.Fprintf(sb, "{%d,}", e.min)
		case e.min == e.max:
			fmt.Fprintf(sb, "{%d}", e.min)
		default:
			fmt.Fprintf(sb, "{%d,%d}", e.min, e.max)
		}
	}
}

func writeLit(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for _, r := range s {
		writeChar(sb, r, '"')
	}
	sb.WriteByte('"')
}

func writeClass(sb *strings.Builder, ranges []rune) {
	sb.WriteByte('[')
	for i := 0; i < len(ranges); i += 2 {
		writeChar(sb, ranges[i], ']')
		if ranges[i+1] != ranges[i] {
			sb.WriteByte('-')
			writeChar(sb, ranges[i+1], ']')
		}
	}
	sb.WriteByte(']')
}

// writeChar writes r escaped for a literal (quote '"') or a class (quote ']').
func writeChar(sb *strings.Builder, r rune, quote rune) {
	switch {
	case r == '\\' || r == quote || (quote == ']' && (r == '-' || r == '^' || r == '[')):
		sb.WriteByte('\\')
		sb.WriteRune(r)
	case r == '\n':
		sb.WriteString(`\n`)
	case r == '\r':
		sb.WriteString(`\r`)
	case r == '\t':
		sb.WriteString(`\t`)
	case r < 0x20 || r == 0x7f:
		fmt.Fprintf(sb, `\x%02X`, r)
	case r > 0xFFFF:
		fmt.Fprintf(sb, `\U%08X`, r)
	case r >= 0x80 && (!utf8.ValidRune(r) || !strconv.IsPrint(r)):
		fmt.Fprintf(sb, `\u%04X`, r)
	default:
		sb.WriteRune(r)
	}
}
