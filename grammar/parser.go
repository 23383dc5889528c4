package grammar

// The parser runs a Compiled grammar as a nondeterministic pushdown automaton: its state
// is a set of configurations, each a node with byte edges and the stack of return points
// below it. Reading a byte follows the matching edges of every configuration, then takes
// the closure: calls push a return point and enter the callee, a rule's end pops one (a
// tail call pushes nothing, so right recursion runs in constant stack). The set stays
// small for the grammars built here (JSON, regular expressions), which are close to
// deterministic.

// frame is a return point: where the caller goes on, and the stack below it.
type frame struct{ ret, parent int32 }

// stacks holds the parse stacks of one parse. Equal stacks are one entry (hash-consed),
// so configurations compare by stack id. Stack 0 is the bottom: the empty stack.
type stacks struct {
	frames []frame
	index  map[frame]int32
	added  []frame // frames added since the oldest live mark, for rollback
	marks  int
}

func newStacks() stacks {
	return stacks{frames: []frame{{-1, -1}}, index: map[frame]int32{}}
}

func (s *stacks) push(ret, parent int32) int32 {
	f := frame{ret, parent}
	if id, ok := s.index[f]; ok {
		return id
	}
	id := int32(len(s.frames))
	s.frames = append(s.frames, f)
	s.index[f] = id
	if s.marks > 0 {
		s.added = append(s.added, f)
	}
	return id
}

// mark starts recording pushes; rollback(mark) forgets the stacks pushed since, which
// no configuration still in use may hold.
func (s *stacks) mark() int {
	s.marks++
	return len(s.frames)
}

func (s *stacks) rollback(m int) {
	for _, f := range s.added[len(s.added)-(len(s.frames)-m):] {
		delete(s.index, f)
	}
	s.added = s.added[:len(s.added)-(len(s.frames)-m)]
	s.frames = s.frames[:m]
	s.marks--
}

// reset empties s, keeping its memory.
func (s *stacks) reset() {
	s.frames = s.frames[:1]
	clear(s.index)
	s.added = s.added[:0]
	s.marks = 0
}

type config struct{ node, stack int32 }

// pstate is a parser state: the configurations at nodes with byte edges, and whether the
// bottom rule may end here. For a Matcher the bottom rule is the root, so end means the
// text may end; in a mask walk it is the node's own rule, whose caller is unknown.
type pstate struct {
	cfgs []config
	end  bool
}

func (s pstate) alive() bool { return len(s.cfgs) > 0 || s.end }

// parser is the working memory of one parse.
type parser struct {
	c       *Compiled
	st      stacks
	work    []config
	visited []config
	seen    map[config]struct{} // the visited set once it grows past linear search
}

func newParser(c *Compiled) *parser {
	return &parser{c: c, st: newStacks(), seen: map[config]struct{}{}}
}

const linearVisited = 24

// visit reports whether x is new in this step's visited set, and adds it.
func (p *parser) visit(x config) bool {
	if len(p.visited) < linearVisited {
		for _, v := range p.visited {
			if v == x {
				return false
			}
		}
		p.visited = append(p.visited, x)
		if len(p.visited) == linearVisited {
			for _, v := range p.visited {
				p.seen[v] = struct{}{}
			}
		}
		return true
	}
	if _, ok := p.seen[x]; ok {
		return false
	}
	p.seen[x] = struct{}{}
	p.visited = append(p.visited, x)
	return true
}

func (p *parser) resetVisited() {
	if len(p.visited) >= linearVisited {
		clear(p.seen)
	}
	p.visited = p.visited[:0]
}

// closure appends to out the configurations with byte edges reachable from x without
// reading, and reports whether the bottom rule can end on the way.
func (p *parser) closure(x config, out []config) ([]config, bool) {
	nodes := p.c.nodes
	end := false
	p.work = append(p.work[:0], x)
	for len(p.work) > 0 {
		x := p.work[len(p.work)-1]
		p.work = p.work[:len(p.work)-1]
		if !p.visit(x) {
			continue
		}
		nd := &nodes[x.node]
		if len(nd.bytes) > 0 {
			out = append(out, x)
		}
		for _, e := range nd.calls {
			st := x.stack
			if !nodes[e.ret].tail {
				st = p.st.push(e.ret, st)
			}
			p.work = append(p.work, config{p.c.start[e.rule], st})
		}
		if nd.final {
			if x.stack == 0 {
				end = true
			} else {
				f := p.st.frames[x.stack]
				p.work = append(p.work, config{f.ret, f.parent})
			}
		}
	}
	return out, end
}

// start is the closure of the root rule's start.
func (p *parser) start(out []config) pstate {
	p.resetVisited()
	cfgs, end := p.closure(config{p.c.start[0], 0}, out[:0])
	return pstate{cfgs, end}
}

// pop is the state after the top frame of stack returns: the closure of its return point.
func (p *parser) pop(stack int32, out []config) pstate {
	p.resetVisited()
	f := p.st.frames[stack]
	cfgs, end := p.closure(config{f.ret, f.parent}, out[:0])
	return pstate{cfgs, end}
}

// step reads byte b in state in and returns the next state, built in out's memory.
func (p *parser) step(in pstate, b byte, out []config) pstate {
	p.resetVisited()
	out = out[:0]
	end := false
	nodes := p.c.nodes
	for _, x := range in.cfgs {
		for _, e := range nodes[x.node].bytes {
			if e.lo > b {
				break
			}
			if b <= e.hi {
				var e2 bool
				out, e2 = p.closure(config{e.to, x.stack}, out)
				end = end || e2
			}
		}
	}
	return pstate{out, end}
}
