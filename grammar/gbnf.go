package grammar

// The GBNF dialect (llama.cpp's grammar format, a subset with its common extensions):
//
//	rule      name ::= alternatives        a rule ends at a newline outside parentheses,
//	                                       unless the next line goes on with "|"
//	root                                   the rule the grammar's language is
//	"text"    a literal                    escapes \n \r \t \\ \" \[ \] \- \^ \/ \xHH \uHHHH \UHHHHHHHH
//	[a-z_]    a character class            [^...] negated; the same escapes
//	.         any character
//	name      a rule reference             letters, digits, '-' and '_'
//	( ... )   grouping
//	x* x+ x?  repetition                   x{m} x{m,} x{m,n} x{,n}
//	# ...     a comment to the end of the line
//
// Characters are Unicode code points; the grammar matches their UTF-8 encoding.

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on what ParseGBNF accepts, so that no text makes it or Compile take unbounded
// time or memory.
const (
	MaxGrammarBytes = 1 << 20 // source text
	MaxRepeat       = 10000   // the largest m or n in x{m,n}
	maxDepth        = 200     // nesting of parentheses
)

// ParseGBNF parses a grammar in the GBNF dialect above.
func ParseGBNF(src string) (*Grammar, error) {
	if len(src) > MaxGrammarBytes {
		return nil, fmt.Errorf("grammar: %d bytes of grammar text (at most %d)", len(src), MaxGrammarBytes)
	}
	if !utf8.ValidString(src) {
		return nil, fmt.Errorf("grammar: the grammar text is not valid UTF-8")
	}
	p := &gbnfParser{src: src, byName: map[string]int{}}
	g, err := p.parse()
	if err != nil {
		return nil, err
	}
	return g, nil
}

type gbnfParser struct {
	src     string
	pos     int
	names   []string
	rules   []*expr
	defined []bool
	byName  map[string]int
	used    []int // position of the first reference of each rule, for errors
	order   []int // rules other than the root, in the order they are defined
	depth   int
}

type gbnfError struct {
	line, col int
	msg       string
}

func (e *gbnfError) Error() string {
	return fmt.Sprintf("grammar: line %d, column %d: %s", e.line, e.col, e.msg)
}

func (p *gbnfParser) errAt(pos int, format string, args ...any) error {
	line := 1 + strings.Count(p.src[:pos], "\n")
	col := pos - strings.LastIndexByte(p.src[:pos], '\n')
	return &gbnfError{line: line, col: col, msg: fmt.Sprintf(format, args...)}
}

// ruleIndex returns the index of the rule named name, adding it if new.
func (p *gbnfParser) ruleIndex(name string, at int) int {
	if i, ok := p.byName[name]; ok {
		return i
	}
	i := len(p.names)
	p.byName[name] = i
	p.names = append(p.names, name)
	p.rules = append(p.rules, nil)
	p.defined = append(p.defined, false)
	p.used = append(p.used, at)
	return i
}

func (p *gbnfParser) parse() (*Grammar, error) {
	p.ruleIndex("root", 0)
	for {
		p.skipSpace(true)
		if p.pos >= len(p.src) {
			break
		}
		start := p.pos
		name := p.name()
		if name == "" {
			return nil, p.errAt(p.pos, "expected a rule name, found %q", p.peekText())
		}
		p.skipSpace(false)
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return nil, p.errAt(p.pos, "expected ::= after the rule name %q", name)
		}
		p.pos += 3
		i := p.ruleIndex(name, start)
		if p.defined[i] {
			return nil, p.errAt(start, "rule %q is defined twice", name)
		}
		p.skipSpace(true)
		body, err := p.alternatives(false)
		if err != nil {
			return nil, err
		}
		p.rules[i], p.defined[i] = body.node(), true
		if i != 0 {
			p.order = append(p.order, i)
		}
		p.skipSpace(false)
		if p.pos < len(p.src) && p.src[p.pos] != '\n' {
			return nil, p.errAt(p.pos, "unexpected %q", p.peekText())
		}
	}
	for i, ok := range p.defined {
		if !ok {
			if i == 0 {
				return nil, fmt.Errorf("grammar: no root rule (the grammar's language is the rule named root)")
			}
			return nil, p.errAt(p.used[i], "rule %q is used but not defined", p.names[i])
		}
	}
	// Number the rules in the order they are defined, the root first, so that printing
	// writes them back in that order.
	order := append([]int{0}, p.order...)
	perm := make([]int, len(p.names))
	for newIdx, old := range order {
		perm[old] = newIdx
	}
	g := &Grammar{names: make([]string, len(order)), rules: make([]*expr, len(order))}
	memo := map[*expr]*expr{}
	for newIdx, old := range order {
		g.names[newIdx] = p.names[old]
		g.rules[newIdx] = renumber(p.rules[old], perm, memo)
	}
	return g, nil
}

// renumber rewrites the rule references of e by perm.
func renumber(e *expr, perm []int, memo map[*expr]*expr) *expr {
	if x, ok := memo[e]; ok {
		return x
	}
	out := e
	switch e.op {
	case opRef:
		out = &expr{op: opRef, ref: perm[e.ref]}
	case opSeq, opAlt, opRepeat:
		c := *e
		c.subs = make([]*expr, len(e.subs))
		for i, s := range e.subs {
			c.subs[i] = renumber(s, perm, memo)
		}
		out = &c
	}
	memo[e] = out
	return out
}

func (p *gbnfParser) peekText() string {
	s := p.src[p.pos:]
	if len(s) > 12 {
		s = s[:12]
	}
	return s
}

// skipSpace skips blanks and comments, and newlines too when newlines is set.
func (p *gbnfParser) skipSpace(newlines bool) {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t' || c == '\r':
			p.pos++
		case c == '\n' && newlines:
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// continuesWithBar reports whether, past blanks, comments and newlines, the next
// character is '|' (a rule going on with another alternative on the next line), and if
// so moves there.
func (p *gbnfParser) continuesWithBar() bool {
	save := p.pos
	p.skipSpace(true)
	if p.pos < len(p.src) && p.src[p.pos] == '|' {
		return true
	}
	p.pos = save
	return false
}

func (p *gbnfParser) alternatives(nested bool) (Expr, error) {
	var alts []Expr
	for {
		seq, err := p.sequence(nested)
		if err != nil {
			return Expr{}, err
		}
		alts = append(alts, seq)
		p.skipSpace(nested)
		if p.pos < len(p.src) && p.src[p.pos] == '|' || !nested && p.continuesWithBar() {
			p.pos++
			p.skipSpace(true)
			continue
		}
		break
	}
	return Alt(alts...), nil
}

func (p *gbnfParser) sequence(nested bool) (Expr, error) {
	var parts []Expr
	for {
		p.skipSpace(nested)
		if p.pos >= len(p.src) {
			break
		}
		c := p.src[p.pos]
		if c == '|' || c == ')' || c == '\n' {
			break
		}
		// A new rule begins on this line: "name ::=" (only after a newline, at top level).
		start := p.pos
		var atom Expr
		switch {
		case c == '"':
			s, err := p.literal()
			if err != nil {
				return Expr{}, err
			}
			atom = Lit(s)
		case c == '[':
			cls, err := p.class()
			if err != nil {
				return Expr{}, err
			}
			atom = cls
		case c == '.':
			p.pos++
			atom = AnyChar()
		case c == '(':
			p.pos++
			p.depth++
			if p.depth > maxDepth {
				return Expr{}, p.errAt(start, "parentheses nested more than %d deep", maxDepth)
			}
			p.skipSpace(true)
			inner, err := p.alternatives(true)
			if err != nil {
				return Expr{}, err
			}
			p.skipSpace(true)
			if p.pos >= len(p.src) || p.src[p.pos] != ')' {
				return Expr{}, p.errAt(start, "unclosed (")
			}
			p.pos++
			p.depth--
			atom = inner
		case isNameByte(c):
			name := p.name()
			save := p.pos
			p.skipSpace(false)
			if strings.HasPrefix(p.src[p.pos:], "::=") {
				return Expr{}, p.errAt(start, "rule %q begins in the middle of a line (put each rule on its own line)", name)
			}
			p.pos = save
			atom = Expr{&expr{op: opRef, ref: p.ruleIndex(name, start)}}
		default:
			r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
			return Expr{}, p.errAt(p.pos, "unexpected %q", r)
		}
		atom, err := p.postfix(atom)
		if err != nil {
			return Expr{}, err
		}
		if p.pos < len(p.src) && strings.IndexByte("*+?{", p.src[p.pos]) >= 0 {
			return Expr{}, p.errAt(p.pos, "a repetition of a repetition needs parentheses")
		}
		parts = append(parts, atom)
	}
	return Seq(parts...), nil
}

// postfix applies a repetition operator following atom, if any.
func (p *gbnfParser) postfix(atom Expr) (Expr, error) {
	if p.pos >= len(p.src) {
		return atom, nil
	}
	rep := func(min, max int) Expr {
		// Keep the node distinct from atom even for {1}, so that the caller sees an operator.
		return Expr{&expr{op: opRepeat, subs: []*expr{atom.node()}, min: min, max: max}}
	}
	switch p.src[p.pos] {
	case '*':
		p.pos++
		return rep(0, -1), nil
	case '+':
		p.pos++
		return rep(1, -1), nil
	case '?':
		p.pos++
		return rep(0, 1), nil
	case '{':
		start := p.pos
		p.pos++
		p.skipSpace(false)
		num := func() (int, bool, error) {
			s := p.pos
			for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
				p.pos++
			}
			if s == p.pos {
				return 0, false, nil
			}
			n, err := strconv.Atoi(p.src[s:p.pos])
			if err != nil || n > MaxRepeat {
				return 0, false, p.errAt(s, "repetition count %s is over %d", p.src[s:p.pos], MaxRepeat)
			}
			return n, true, nil
		}
		lo, hasLo, err := num()
		if err != nil {
			return Expr{}, err
		}
		p.skipSpace(false)
		hi, hasHi := lo, hasLo
		if p.pos < len(p.src) && p.src[p.pos] == ',' {
			p.pos++
			p.skipSpace(false)
			if hi, hasHi, err = num(); err != nil {
				return Expr{}, err
			}
			if !hasHi {
				hi = -1
			}
			p.skipSpace(false)
		} else if !hasLo {
			return Expr{}, p.errAt(start, "expected a count in {}")
		}
		if p.pos >= len(p.src) || p.src[p.pos] != '}' {
			return Expr{}, p.errAt(start, "unclosed {")
		}
		p.pos++
		if hasHi && hi < lo {
			return Expr{}, p.errAt(start, "repetition {%d,%d}: the maximum is below the minimum", lo, hi)
		}
		x := rep(lo, hi)
		if hi == 0 {
			x = Expr{&expr{op: opRepeat, subs: []*expr{atom.node()}, min: 0, max: 0}}
		}
		return x, nil
	}
	return atom, nil
}

// literal parses "..." and returns its text.
func (p *gbnfParser) literal() (string, error) {
	start := p.pos
	p.pos++ // "
	var sb strings.Builder
	for {
		if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
			return "", p.errAt(start, "unterminated string literal")
		}
		if p.src[p.pos] == '"' {
			p.pos++
			return sb.String(), nil
		}
		r, err := p.char()
		if err != nil {
			return "", err
		}
		if r >= 0xD800 && r <= 0xDFFF {
			return "", p.errAt(start, "a literal cannot hold the surrogate code point U+%04X", r)
		}
		sb.WriteRune(r)
	}
}

// class parses [...].
func (p *gbnfParser) class() (Expr, error) {
	start := p.pos
	p.pos++ // [
	negate := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		negate = true
		p.pos++
	}
	var ranges []rune
	for {
		if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
			return Expr{}, p.errAt(start, "unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		lo, err := p.char()
		if err != nil {
			return Expr{}, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return Expr{}, err
			}
			if hi < lo {
				return Expr{}, p.errAt(start, "character range %q-%q is reversed", lo, hi)
			}
		}
		ranges = append(ranges, lo, hi)
	}
	return Class(negate, ranges...), nil
}

// char reads one character of a literal or class, with its escapes.
func (p *gbnfParser) char() (rune, error) {
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		p.pos += n
		return r, nil
	}
	start := p.pos
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errAt(start, "a backslash ends the text")
	}
	c := p.src[p.pos]
	p.pos++
	hex := func(n int) (rune, error) {
		if p.pos+n > len(p.src) {
			return 0, p.errAt(start, "incomplete \\%c escape", c)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil {
			return 0, p.errAt(start, "bad \\%c escape %q", c, p.src[start:p.pos+n])
		}
		p.pos += n
		if v > MaxCodePoint {
			return 0, p.errAt(start, "escape %q is beyond U+10FFFF", p.src[start:p.pos])
		}
		return rune(v), nil
	}
	switch c {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case '\\', '"', '[', ']', '-', '^', '/', '.', '|', '(', ')', '*', '+', '?', '{', '}', '#', ' ', '\'':
		return rune(c), nil
	case 'x':
		return hex(2)
	case 'u':
		return hex(4)
	case 'U':
		return hex(8)
	}
	return 0, p.errAt(start, "unknown escape \\%c", c)
}
