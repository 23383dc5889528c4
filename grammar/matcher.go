package grammar

import (
	"errors"
	"fmt"
)

// ErrRejected is returned by Matcher.Accept for a token the grammar does not allow there.
var ErrRejected = errors.New("grammar: token not allowed here")

// Matcher is one sequence's position in a grammar. It is not safe for concurrent use.
type Matcher struct {
	b      *Bound
	p      *parser
	cur    pstate
	curBuf []config    // cur's memory
	bufs   [2][]config // Accept's working states
	done   bool        // an end-of-generation token was accepted

	// FillMask's scratch.
	keys       []maskKey
	parents    []parentState
	parentBufs [][]config // the parents' memory, reused
	sfxBufs    [][]config
	sfxStates  []pstate
}

type parentState struct {
	stack int32
	st    pstate
}

// NewMatcher returns a matcher at the start of the grammar.
func (b *Bound) NewMatcher() *Matcher {
	m := &Matcher{b: b, p: newParser(b.c)}
	m.cur = m.p.start(nil)
	m.curBuf = m.cur.cfgs
	return m
}

// CanEnd reports whether the text so far is a whole sentence of the grammar.
func (m *Matcher) CanEnd() bool { return m.cur.end }

// Done reports whether nothing may follow: an end-of-generation token was accepted, or
// the text is complete and no byte can extend it.
func (m *Matcher) Done() bool { return m.done || (m.cur.end && len(m.cur.cfgs) == 0) }

// Accept advances by token id. An end-of-generation token is accepted where the grammar
// may end, and then the matcher is done.
func (m *Matcher) Accept(id int32) error {
	v := m.b.v
	if m.done {
		return fmt.Errorf("%w: token %d after the end", ErrRejected, id)
	}
	if v.IsEOG(id) {
		if !m.cur.end {
			return fmt.Errorf("%w: end of generation (token %d) before the grammar is complete", ErrRejected, id)
		}
		m.done = true
		return nil
	}
	tok := v.Token(id)
	if len(tok) == 0 {
		return fmt.Errorf("%w: token %d stands for no text", ErrRejected, id)
	}
	if err := m.advance(tok); err != nil {
		return fmt.Errorf("%w: token %d (%q)", err, id, tok)
	}
	return nil
}

// AcceptText advances by the bytes of s, as if a token stood for them.
func (m *Matcher) AcceptText(s string) error {
	if m.done {
		return fmt.Errorf("%w: text after the end", ErrRejected)
	}
	if err := m.advance([]byte(s)); err != nil {
		return fmt.Errorf("%w: %q", err, s)
	}
	return nil
}

func (m *Matcher) advance(tok []byte) error {
	st := m.cur
	for i, c := range tok {
		if len(st.cfgs) == 0 {
			return fmt.Errorf("%w (at byte %d)", ErrRejected, i)
		}
		st = m.p.step(st, c, m.bufs[i&1])
		m.bufs[i&1] = st.cfgs
	}
	if !st.alive() {
		return ErrRejected
	}
	m.cur = pstate{cfgs: append(m.curBuf[:0], st.cfgs...), end: st.end}
	m.curBuf = m.cur.cfgs
	return nil
}

// FillMask sets in mask (Vocab.MaskWords words) the bits of the tokens that Accept would
// take now, and clears the others.
func (m *Matcher) FillMask(mask []uint64) {
	clear(mask)
	if m.Done() {
		return
	}
	b := m.b
	m.keys = m.keys[:0]
	for _, x := range m.cur.cfgs {
		k := m.keyOf(x)
		seen := false
		for _, y := range m.keys {
			if y == k {
				seen = true
				break
			}
		}
		if !seen {
			m.keys = append(m.keys, k)
			b.nodeMask(k).or(mask)
		}
	}
	// Context-dependent tokens: their remainder once the key's return point's rule has
	// ended too, read from the state below. At the bottom nothing follows.
	m.parents = m.parents[:0]
	mark := m.p.st.mark()
	for _, x := range m.cur.cfgs {
		nm := b.nodeMask(m.keyOf(x))
		if len(nm.sfx.nodes) <= 1 || x.stack == 0 {
			continue
		}
		below := m.p.st.frames[x.stack].parent
		if below == 0 {
			continue
		}
		var parent pstate
		found := false
		for _, ps := range m.parents {
			if ps.stack == below {
				parent, found = ps.st, true
				break
			}
		}
		if !found {
			k := len(m.parents)
			for len(m.parentBufs) <= k {
				m.parentBufs = append(m.parentBufs, nil)
			}
			parent = m.p.pop(below, m.parentBufs[k])
			m.parentBufs[k] = parent.cfgs
			m.parents = append(m.parents, parentState{below, parent})
		}
		m.walkSuffixes(&nm.sfx, parent, mask)
	}
	m.p.st.rollback(mark)
	if m.cur.end {
		setBits(mask, b.v.eog)
	}
}

// keyOf is the mask key of configuration x.
func (m *Matcher) keyOf(x config) maskKey {
	if x.stack == 0 {
		return maskKey{x.node, -1}
	}
	return maskKey{x.node, m.p.st.frames[x.stack].ret}
}

// walkSuffixes sets the bits of the tokens whose remainder in t can be read from state
// from.
func (m *Matcher) walkSuffixes(t *trie, from pstate, mask []uint64) {
	maxDepth := t.maxDepth
	for len(m.sfxBufs) <= maxDepth {
		m.sfxBufs = append(m.sfxBufs, nil)
	}
	for len(m.sfxStates) <= maxDepth {
		m.sfxStates = append(m.sfxStates, pstate{})
	}
	states := m.sfxStates
	states[0] = from
	for i := int32(1); i < int32(len(t.nodes)); {
		tn := &t.nodes[i]
		d := int(tn.depth)
		if len(states[d-1].cfgs) == 0 {
			i = tn.next
			continue
		}
		st := m.p.step(states[d-1], tn.b, m.sfxBufs[d])
		m.sfxBufs[d], states[d] = st.cfgs, st
		if !st.alive() {
			i = tn.next
			continue
		}
		if tn.lo < tn.hi {
			setBits(mask, t.ids[tn.lo:tn.hi])
		}
		i++
	}
}
