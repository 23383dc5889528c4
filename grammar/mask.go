package grammar

import (
	"math/bits"
	"sync"
)

// Bound is a compiled grammar bound to a vocabulary: the matchers of many sequences
// share it and its cache of token masks. It is safe for concurrent use.
type Bound struct {
	c *Compiled
	v *Vocab

	masks sync.Map   // maskKey → *nodeMask, filled on first need
	mu    sync.Mutex // guards the walk
	walk  *parser
	bufs  [][]config // per trie depth
	pops  []bool     // per trie depth: the node's rule ended there
	npops []int32    // per trie depth: pops strictly before it on the path
}

// Bind binds c to v.
func Bind(c *Compiled, v *Vocab) *Bound {
	return &Bound{c: c, v: v}
}

// maskKey is what a cached mask depends on: a node, and where its rule returns (-1: it
// is the root's, nothing follows). With the return point known, a node in a small rule
// (one character of a string) is computed in its caller's context (the string's): the
// tokens that end the string are the only ones left to check at run time.
type maskKey struct{ node, ret int32 }

// Vocab returns the vocabulary b masks.
func (b *Bound) Vocab() *Vocab { return b.v }

// nodeMask is what a node allows whatever its caller: the tokens that can be read
// entirely from it without its rule returning (or returning exactly at the token's end),
// and, for the tokens that need its rule to return and then go on in the caller, those
// remainders (suffixes) in a trie, to be read from the caller's state at run time.
type nodeMask struct {
	dense  []uint64 // accepted tokens as a bitset, or nil
	sparse []int32  // accepted tokens as a list when few
	sfx    trie     // remainders of the context-dependent tokens; ids are the tokens
}

func (m *nodeMask) or(mask []uint64) {
	if m.dense != nil {
		for i, w := range m.dense {
			mask[i] |= w
		}
		return
	}
	for _, id := range m.sparse {
		mask[id>>6] |= 1 << (id & 63)
	}
}

// nodeMask returns the mask for key, computing it the first time.
func (b *Bound) nodeMask(key maskKey) *nodeMask {
	if m, ok := b.masks.Load(key); ok {
		return m.(*nodeMask)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if m, ok := b.masks.Load(key); ok {
		return m.(*nodeMask)
	}
	m := b.computeMask(key)
	b.masks.Store(key, m)
	return m
}

// Warm computes the masks of the configurations a new matcher starts at, so that a
// first FillMask does not pay for them.
func (b *Bound) Warm() {
	m := b.NewMatcher()
	for _, x := range m.cur.cfgs {
		b.nodeMask(m.keyOf(x))
	}
}

// computeMask walks the vocabulary trie from the key's node, returning to the key's
// return point, with an unknown caller below. Along each
// path it keeps the parse state after the path's bytes, and where the node's rule ended
// (popped to the unknown caller). A token is accepted when the state after all its
// bytes is alive (the rule may also end exactly there); otherwise, if the rule ended
// part way, the token's remainders after each such point are context-dependent. Pops
// before the first byte are left out: a matcher's state already holds the caller's
// configurations for them.
func (b *Bound) computeMask(key maskKey) *nodeMask {
	if b.walk == nil {
		b.walk = newParser(b.c)
	}
	p := b.walk
	p.st.reset()
	var stack int32
	if key.ret >= 0 {
		stack = p.st.push(key.ret, 0)
	}
	t := &b.v.trie
	maxDepth := t.maxDepth
	for len(b.bufs) <= maxDepth {
		b.bufs = append(b.bufs, nil)
		b.pops = append(b.pops, false)
		b.npops = append(b.npops, 0)
	}
	states := make([]pstate, maxDepth+1)
	states[0] = pstate{cfgs: append(b.bufs[0][:0], config{key.node, stack})}
	b.bufs[0] = states[0].cfgs

	var accepted []int32
	var sfxKeys [][]byte
	var sfxIDs []int32
	for i := int32(1); i < int32(len(t.nodes)); {
		tn := &t.nodes[i]
		d := int(tn.depth)
		st := p.step(states[d-1], tn.b, b.bufs[d])
		b.bufs[d], states[d] = st.cfgs, st
		b.pops[d] = st.end
		b.npops[d] = b.npops[d-1]
		if d > 1 && b.pops[d-1] {
			b.npops[d]++
		}
		if tn.lo < tn.hi {
			switch {
			case st.alive():
				accepted = append(accepted, t.ids[tn.lo:tn.hi]...)
			case b.npops[d] > 0:
				for _, id := range t.ids[tn.lo:tn.hi] {
					tok := b.v.Token(id)
					for k := 1; k < d; k++ {
						if b.pops[k] {
							sfxKeys = append(sfxKeys, tok[k:])
							sfxIDs = append(sfxIDs, id)
						}
					}
				}
			}
		}
		if len(st.cfgs) > 0 || st.end || b.npops[d] > 0 {
			i++
		} else {
			i = tn.next
		}
	}
	m := &nodeMask{sfx: buildTrie(sfxKeys, sfxIDs)}
	if words := b.v.MaskWords(); len(accepted) > words*2 {
		m.dense = make([]uint64, words)
		for _, id := range accepted {
			m.dense[id>>6] |= 1 << (id & 63)
		}
	} else {
		m.sparse = accepted
	}
	p.st.reset()
	return m
}

// setBits sets the bits of ids in mask.
func setBits(mask []uint64, ids []int32) {
	for _, id := range ids {
		mask[id>>6] |= 1 << (id & 63)
	}
}

// CountMask returns how many bits of mask are set.
func CountMask(mask []uint64) int {
	n := 0
	for _, w := range mask {
		n += bits.OnesCount64(w)
	}
	return n
}
