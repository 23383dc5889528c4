package grammar

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// TextWithout returns an expression for any text that does not contain stop (free text
// where a marker such as "<tool_call>" may not appear): the states of a
// Knuth–Morris–Pratt automaton for stop, one rule each, every rule a tail call of the
// next, so that text of any length runs in constant stack.
func (b *Builder) TextWithout(stop string) Expr { return b.kmpText(stop, false) }

// TextThrough returns an expression for any text in which stop occurs once, at its end
// (free text up to and including a marker such as "</think>").
func (b *Builder) TextThrough(stop string) Expr { return b.kmpText(stop, true) }

func (b *Builder) kmpText(stop string, through bool) Expr {
	if stop == "" || !utf8.ValidString(stop) {
		panic("grammar: TextWithout and TextThrough need a non-empty UTF-8 stop text")
	}
	key := fmt.Sprint(through, stop)
	if x, ok := b.without[key]; ok {
		return x
	}
	pat := []rune(stop)
	n := len(pat)
	// fail[i]: the longest proper border of pat[:i].
	fail := make([]int, n+1)
	for i := 1; i < n; i++ {
		k := fail[i]
		for k > 0 && pat[i] != pat[k] {
			k = fail[k]
		}
		if pat[i] == pat[k] {
			k++
		}
		fail[i+1] = k
	}
	next := func(state int, r rune) int {
		for state > 0 && pat[state] != r {
			state = fail[state]
		}
		if pat[state] == r {
			state++
		}
		return state
	}
	var chars []rune // the distinct characters of stop
	for _, r := range pat {
		if !slices.Contains(chars, r) {
			chars = append(chars, r)
		}
	}
	slices.Sort(chars)
	others := make([]rune, 0, 2*len(chars))
	for _, r := range chars {
		others = append(others, r, r)
	}
	name := "text-without"
	if through {
		name = "text-through"
	}
	rules := make([]Expr, n)
	for i := range n {
		rules[i] = b.Declare(fmt.Sprintf("%s-%d", name, i))
	}
	for i := range n {
		var alts []Expr
		if !through {
			alts = append(alts, Expr{}) // the text may end anywhere
		}
		alts = append(alts, Seq(Class(true, others...), rules[0]))
		for _, r := range chars {
			switch s := next(i, r); {
			case s < n:
				alts = append(alts, Seq(Lit(string(r)), rules[s]))
			case through:
				alts = append(alts, Lit(string(r))) // stop complete: the text ends
			}
		}
		b.Define(rules[i], Alt(alts...))
	}
	if b.without == nil {
		b.without = map[string]Expr{}
	}
	b.without[key] = rules[0]
	return rules[0]
}

// Include adds g's rules to b and returns a reference to its root.
func (b *Builder) Include(g *Grammar) Expr {
	refs := make([]Expr, len(g.rules))
	for i := range g.rules {
		refs[i] = b.Declare(g.names[i])
	}
	perm := make([]int, len(g.rules))
	for i, r := range refs {
		perm[i] = r.node().ref
	}
	memo := map[*expr]*expr{}
	for i, body := range g.rules {
		b.Define(refs[i], Expr{renumber(body, perm, memo)})
	}
	return refs[0]
}

// Choice returns the grammar of exactly one of options.
func Choice(options []string) (*Grammar, error) {
	if len(options) == 0 {
		return nil, fmt.Errorf("grammar: a choice needs at least one option")
	}
	alts := make([]Expr, len(options))
	for i, o := range options {
		if !utf8.ValidString(o) {
			return nil, fmt.Errorf("grammar: choice %d is not valid UTF-8", i)
		}
		alts[i] = Lit(o)
	}
	return NewBuilder().Build(Alt(alts...))
}

// Regex returns an expression for the texts pattern matches as a whole (see Regex).
func (b *Builder) Regex(pattern string) (Expr, error) { return regexExpr(pattern, rawChars) }

// AnyJSONObject returns an expression for any JSON object.
func (b *Builder) AnyJSONObject() Expr { return b.jsonCommon().object }
