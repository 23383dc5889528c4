package grammar

import (
	"cmp"
	"fmt"
	"slices"
)

// MaxNodes bounds the automaton Compile builds (repetitions are expanded, so x{0,5000}
// costs 5000 copies of x).
const MaxNodes = 200_000

type byteEdge struct {
	lo, hi byte
	to     int32
}

type callEdge struct {
	rule int32
	ret  int32 // where the caller goes on once the rule ends
}

// gnode is a node of a rule's automaton, with its epsilon closure folded in.
type gnode struct {
	bytes []byteEdge // sorted by lo
	calls []callEdge
	final bool // the rule may end here
	tail  bool // final and nothing else: a call returning here needs no frame
	rule  int32
}

// Compiled is a grammar as a recursive transition network over bytes: one automaton per
// rule, whose edges consume a byte in a range or call another rule. It is immutable.
type Compiled struct {
	g     *Grammar
	nodes []gnode
	start []int32 // each rule's first node
}

// Compile builds g's automata. It refuses grammars with left recursion (a rule that can
// reach itself before reading anything, which a pushdown parser cannot run), rules that
// can never end, empty character classes, and automata over MaxNodes nodes.
func Compile(g *Grammar) (*Compiled, error) {
	c := &Compiled{g: g, start: make([]int32, len(g.rules))}
	for r := range g.rules {
		if err := c.compileRule(int32(r)); err != nil {
			return nil, err
		}
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return c, nil
}

// ruleEnd is the node after rule r's last: a rule's nodes are contiguous.
func (c *Compiled) ruleEnd(r int32) int32 {
	if int(r)+1 < len(c.start) {
		return c.start[r+1]
	}
	return int32(len(c.nodes))
}

// Grammar returns the grammar c was compiled from.
func (c *Compiled) Grammar() *Grammar { return c.g }

// enfa is one rule's automaton with epsilon edges, as built from its expression.
type enfa struct {
	eps   [][]int32
	bytes [][]byteEdge
	calls [][]callEdge
	total int // nodes of the whole grammar so far, for MaxNodes
	rule  string
}

func (a *enfa) state() (int32, error) {
	if a.total+len(a.eps) >= MaxNodes {
		return 0, fmt.Errorf("grammar: the grammar needs more than %d automaton nodes (a repetition count or the schema is too large)", MaxNodes)
	}
	a.eps = append(a.eps, nil)
	a.bytes = append(a.bytes, nil)
	a.calls = append(a.calls, nil)
	return int32(len(a.eps) - 1), nil
}

// build adds the automaton of e from state from and returns its end state.
func (a *enfa) build(e *expr, from int32) (int32, error) {
	switch e.op {
	case opEmpty:
		return from, nil
	case opLit:
		cur := from
		for i := 0; i < len(e.lit); i++ {
			s, err := a.state()
			if err != nil {
				return 0, err
			}
			a.bytes[cur] = append(a.bytes[cur], byteEdge{e.lit[i], e.lit[i], s})
			cur = s
		}
		return cur, nil
	case opClass:
		to, err := a.state()
		if err != nil {
			return 0, err
		}
		any := false
		for i := 0; i+1 < len(e.ranges) && err == nil; i += 2 {
			utf8Sequences(e.ranges[i], e.ranges[i+1], func(seq []byteRange) {
				if err != nil {
					return
				}
				any = true
				cur := from
				for k, br := range seq {
					next := to
					if k < len(seq)-1 {
						if next, err = a.state(); err != nil {
							return
						}
					}
					a.bytes[cur] = append(a.bytes[cur], byteEdge{br.lo, br.hi, next})
					cur = next
				}
			})
		}
		if err != nil {
			return 0, err
		}
		if !any {
			return 0, fmt.Errorf("grammar: rule %s: a character class matches no character", a.rule)
		}
		return to, nil
	case opRef:
		to, err := a.state()
		if err != nil {
			return 0, err
		}
		a.calls[from] = append(a.calls[from], callEdge{int32(e.ref), to})
		return to, nil
	case opSeq:
		cur := from
		for _, s := range e.subs {
			var err error
			if cur, err = a.build(s, cur); err != nil {
				return 0, err
			}
		}
		return cur, nil
	case opAlt:
		to, err := a.state()
		if err != nil {
			return 0, err
		}
		for _, s := range e.subs {
			in, err := a.state()
			if err != nil {
				return 0, err
			}
			a.eps[from] = append(a.eps[from], in)
			end, err := a.build(s, in)
			if err != nil {
				return 0, err
			}
			a.eps[end] = append(a.eps[end], to)
		}
		return to, nil
	case opRepeat:
		sub := e.subs[0]
		cur := from
		var err error
		for range e.min {
			if cur, err = a.build(sub, cur); err != nil {
				return 0, err
			}
		}
		if e.max < 0 {
			loop, err := a.state()
			if err != nil {
				return 0, err
			}
			a.eps[cur] = append(a.eps[cur], loop)
			end, err := a.build(sub, loop)
			if err != nil {
				return 0, err
			}
			a.eps[end] = append(a.eps[end], loop)
			return loop, nil
		}
		// (x (x (x)?)?)?: each optional copy only after the one before, so that there is
		// one way to match each count.
		to, err := a.state()
		if err != nil {
			return 0, err
		}
		for range e.max - e.min {
			a.eps[cur] = append(a.eps[cur], to)
			if cur, err = a.build(sub, cur); err != nil {
				return 0, err
			}
		}
		a.eps[cur] = append(a.eps[cur], to)
		return to, nil
	}
	panic("grammar: unknown expression")
}

// compileRule builds rule r's automaton, removes its epsilon edges and appends its nodes.
func (c *Compiled) compileRule(r int32) error {
	a := &enfa{total: len(c.nodes), rule: c.g.names[r]}
	start, err := a.state()
	if err != nil {
		return err
	}
	accept, err := a.build(c.g.rules[r], start)
	if err != nil {
		return err
	}
	// Epsilon closures, then the nodes reachable from the start by edges that read or call.
	n := len(a.eps)
	closure := func(s int32, seen []bool, out []int32) []int32 {
		stack := []int32{s}
		seen[s] = true
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			out = append(out, x)
			for _, y := range a.eps[x] {
				if !seen[y] {
					seen[y] = true
					stack = append(stack, y)
				}
			}
		}
		return out
	}
	id := make([]int32, n) // eNFA state → global node, -1 until numbered
	for i := range id {
		id[i] = -1
	}
	base := int32(len(c.nodes))
	order := []int32{start}
	id[start] = base
	seen := make([]bool, n)
	var members []int32
	for k := 0; k < len(order); k++ {
		s := order[k]
		members = closure(s, seen, members[:0])
		nd := gnode{rule: r}
		for _, m := range members {
			seen[m] = false
			nd.bytes = append(nd.bytes, a.bytes[m]...)
			nd.calls = append(nd.calls, a.calls[m]...)
			nd.final = nd.final || m == accept
		}
		for i := range nd.bytes {
			t := nd.bytes[i].to
			if id[t] < 0 {
				id[t] = base + int32(len(order))
				order = append(order, t)
			}
			nd.bytes[i].to = id[t]
		}
		for i := range nd.calls {
			t := nd.calls[i].ret
			if id[t] < 0 {
				id[t] = base + int32(len(order))
				order = append(order, t)
			}
			nd.calls[i].ret = id[t]
		}
		c.nodes = append(c.nodes, nd)
	}
	c.start[r] = base
	return nil
}

// check normalises the edges, and refuses left recursion and rules that never end.
func (c *Compiled) check() error {
	for i := range c.nodes {
		nd := &c.nodes[i]
		nd.bytes = mergeByteEdges(nd.bytes)
		slices.SortFunc(nd.calls, func(a, b callEdge) int { return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.ret, b.ret)) })
		nd.calls = slices.Compact(nd.calls)
	}
	nr := len(c.start)
	names := c.g.names

	// Productive: can derive some finite string.
	prodNode := make([]bool, len(c.nodes))
	prodRule := make([]bool, nr)
	for changed := true; changed; {
		changed = false
		for i := range c.nodes {
			if prodNode[i] {
				continue
			}
			nd := &c.nodes[i]
			ok := nd.final
			for _, e := range nd.bytes {
				ok = ok || prodNode[e.to]
			}
			for _, e := range nd.calls {
				ok = ok || prodRule[e.rule] && prodNode[e.ret]
			}
			if ok {
				prodNode[i], changed = true, true
				if int32(i) == c.start[nd.rule] {
					prodRule[nd.rule] = true
				}
			}
		}
	}
	// Rules reachable from the root.
	reach := make([]bool, nr)
	reach[0] = true
	work := []int32{0}
	for len(work) > 0 {
		r := work[len(work)-1]
		work = work[:len(work)-1]
		for i := c.start[r]; i < c.ruleEnd(r); i++ {
			for _, e := range c.nodes[i].calls {
				if !reach[e.rule] {
					reach[e.rule] = true
					work = append(work, e.rule)
				}
			}
		}
	}
	for r := range nr {
		if reach[r] && !prodRule[r] {
			return fmt.Errorf("grammar: rule %s can never end: every way through it needs itself again", names[r])
		}
	}
	// Drop the edges of productive rules that lead where nothing ends.
	for i := range c.nodes {
		nd := &c.nodes[i]
		nd.bytes = slices.DeleteFunc(nd.bytes, func(e byteEdge) bool { return !prodNode[e.to] })
		nd.calls = slices.DeleteFunc(nd.calls, func(e callEdge) bool { return !prodRule[e.rule] || !prodNode[e.ret] })
		nd.tail = nd.final && len(nd.bytes) == 0 && len(nd.calls) == 0
	}

	// Nullable rules, then the calls each rule can make before reading a byte.
	nullable := make([]bool, nr)
	nullFrom := func(n int32, seen map[int32]bool) bool {
		var walk func(int32) bool
		walk = func(n int32) bool {
			if seen[n] {
				return false
			}
			seen[n] = true
			nd := &c.nodes[n]
			if nd.final {
				return true
			}
			for _, e := range nd.calls {
				if nullable[e.rule] && walk(e.ret) {
					return true
				}
			}
			return false
		}
		return walk(n)
	}
	for changed := true; changed; {
		changed = false
		for r := range nr {
			if !nullable[r] && nullFrom(c.start[r], map[int32]bool{}) {
				nullable[r], changed = true, true
			}
		}
	}
	left := make([][]int32, nr)
	for r := range nr {
		seen := map[int32]bool{}
		var walk func(int32)
		walk = func(n int32) {
			if seen[n] {
				return
			}
			seen[n] = true
			for _, e := range c.nodes[n].calls {
				left[r] = append(left[r], e.rule)
				if nullable[e.rule] {
					walk(e.ret)
				}
			}
		}
		walk(c.start[r])
	}
	color := make([]uint8, nr) // 0 new, 1 on the path, 2 done
	var cycle func(int32) int32
	cycle = func(r int32) int32 {
		color[r] = 1
		for _, s := range left[r] {
			switch color[s] {
			case 1:
				return s
			case 0:
				if x := cycle(s); x >= 0 {
					return x
				}
			}
		}
		color[r] = 2
		return -1
	}
	for r := range int32(nr) {
		if reach[r] && color[r] == 0 {
			if x := cycle(r); x >= 0 {
				return fmt.Errorf("grammar: rule %s is left-recursive (it can reach itself before reading anything); write the repetition with * or + instead: %w", names[x], ErrUnsupported)
			}
		}
	}
	return nil
}

// mergeByteEdges sorts edges and merges those that go to the same node with touching
// or overlapping ranges.
func mergeByteEdges(es []byteEdge) []byteEdge {
	slices.SortFunc(es, func(a, b byteEdge) int { return cmp.Or(cmp.Compare(a.to, b.to), cmp.Compare(a.lo, b.lo)) })
	out := es[:0]
	for _, e := range es {
		if n := len(out); n > 0 && out[n-1].to == e.to && int(e.lo) <= int(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, e.hi)
			continue
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b byteEdge) int { return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.to, b.to)) })
	return slices.Clip(out)
}
