package grammar

import (
	"bytes"
	"slices"
)

// Vocab is a tokenizer's vocabulary as the grammar sees it: each token's bytes, in a
// trie, and the end-of-generation tokens. Build it once per tokenizer; it is immutable
// and shared by every grammar bound to it.
type Vocab struct {
	size  int
	data  []byte
	off   []uint32 // token id's bytes are data[off[id]:off[id+1]]
	eog   []int32  // sorted
	isEOG []uint64 // bitset
	trie  trie
}

// trie is a byte trie in preorder: node i's children follow it, each followed by its own
// subtree; next is the index just past a node's subtree. Node 0 is the root.
type trie struct {
	nodes    []trieNode
	ids      []int32 // the values of the keys ending at each node, ids[lo:hi]
	maxDepth int     // the longest key
}

type trieNode struct {
	b      byte
	depth  uint16 // key bytes up to and including this node's (the root: 0)
	next   int32
	lo, hi int32
}

// maxTokenBytes bounds the token length a Vocab keeps in its trie; longer tokens (none in
// real vocabularies) are never allowed.
const maxTokenBytes = 1 << 12

// NewVocab builds the vocabulary of size tokens: piece(id) is the bytes token id stands
// for (empty for control tokens, which a grammar never allows), eog the tokens that end
// generation, allowed exactly where the grammar may end.
func NewVocab(size int, piece func(id int32) []byte, eog []int32) *Vocab {
	v := &Vocab{size: size, off: make([]uint32, size+1), isEOG: make([]uint64, (size+63)/64)}
	for _, id := range eog {
		if id >= 0 && int(id) < size && !v.IsEOG(id) {
			v.isEOG[id>>6] |= 1 << (id & 63)
			v.eog = append(v.eog, id)
		}
	}
	slices.Sort(v.eog)
	var keys [][]byte
	var vals []int32
	for id := range int32(size) {
		p := piece(id)
		if !v.IsEOG(id) {
			v.data = append(v.data, p...)
		}
		v.off[id+1] = uint32(len(v.data))
		if len(p) > 0 && len(p) <= maxTokenBytes && !v.IsEOG(id) {
			keys = append(keys, v.data[v.off[id]:v.off[id+1]])
			vals = append(vals, id)
		}
	}
	v.trie = buildTrie(keys, vals)
	return v
}

// Size is the number of token ids, the length of a mask in bits.
func (v *Vocab) Size() int { return v.size }

// MaskWords is the length of a mask in 64-bit words.
func (v *Vocab) MaskWords() int { return (v.size + 63) / 64 }

// IsEOG reports whether id ends generation.
func (v *Vocab) IsEOG(id int32) bool {
	return id >= 0 && int(id) < v.size && v.isEOG[id>>6]&(1<<(id&63)) != 0
}

// Token returns the bytes of id.
func (v *Vocab) Token(id int32) []byte {
	if id < 0 || int(id) >= v.size {
		return nil
	}
	return v.data[v.off[id]:v.off[id+1]]
}

// buildTrie builds the trie of keys (with their values), which it sorts.
func buildTrie(keys [][]byte, vals []int32) trie {
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return bytes.Compare(keys[a], keys[b]) })
	t := trie{nodes: []trieNode{{}}}
	path := []int32{0} // path[d] is the node at depth d on the current key's path
	var prev []byte
	for _, k := range order {
		key := keys[k]
		common := 0
		for common < len(prev) && common < len(key) && prev[common] == key[common] {
			common++
		}
		// Close the nodes of the previous key below the common prefix.
		for d := len(path) - 1; d > common; d-- {
			t.nodes[path[d]].next = int32(len(t.nodes))
		}
		path = path[:common+1]
		for d := common; d < len(key); d++ {
			path = append(path, int32(len(t.nodes)))
			t.nodes = append(t.nodes, trieNode{b: key[d], depth: uint16(d + 1), lo: int32(len(t.ids)), hi: int32(len(t.ids))})
		}
		t.maxDepth = max(t.maxDepth, len(key))
		last := &t.nodes[path[len(path)-1]]
		if last.hi != int32(len(t.ids)) { // a key equal to an earlier one whose node has children since
			last.lo = int32(len(t.ids))
		}
		t.ids = append(t.ids, vals[k])
		last.hi = int32(len(t.ids))
		prev = key
	}
	for _, n := range path {
		t.nodes[n].next = int32(len(t.nodes))
	}
	return t
}
