package tokenizer

import (
	"hash/maphash"
	"math/bits"
)

// mergeTable gives the BPE rank of a pair of adjacent symbols. It keeps
// 32-bit hashes of the pairs in the map and the pairs themselves only once,
// as the merge lines they come from, checked on every hit: a map keyed by
// the two strings costs about five times as much (15 MiB for a 150k-merge
// vocabulary, resident for the life of the model).
type mergeTable struct {
	seed   maphash.Seed
	byHash map[uint32]int32 // hash of a pair → rank of its first merge
	lines  []string         // by rank: the merge's line, "a b"
	splits []uint32         // by rank: where the space between a and b is
	// clash holds the pairs whose hash an earlier, different pair has
	// (a few in a large vocabulary).
	clash map[pairKey]int32
}

// newMergeTable indexes lines by rank; split returns where a line's space
// between its two symbols is, or −1 to leave the line out. The first of
// several lines of one pair wins.
func newMergeTable(lines []string, split func(string) int) *mergeTable {
	m := &mergeTable{seed: maphash.MakeSeed(), byHash: make(map[uint32]int32, len(lines)), lines: lines, splits: make([]uint32, len(lines))}
	for i, line := range lines {
		s := split(line)
		if s < 0 {
			continue
		}
		m.splits[i] = uint32(s)
		a, b := line[:s], line[s+1:]
		h := m.hash(a, b)
		r, taken := m.byHash[h]
		switch {
		case !taken:
			m.byHash[h] = int32(i)
		case m.is(r, a, b):
			// a later duplicate: the first rank stands
		default:
			if m.clash == nil {
				m.clash = make(map[pairKey]int32)
			}
			if _, ok := m.clash[pairKey{a, b}]; !ok {
				m.clash[pairKey{a, b}] = int32(i)
			}
		}
	}
	return m
}

func (m *mergeTable) hash(a, b string) uint32 {
	h := maphash.String(m.seed, a) ^ bits.RotateLeft64(maphash.String(m.seed, b), 29)
	return uint32(h ^ h>>32)
}

// is reports whether merge r is the pair (a, b).
func (m *mergeTable) is(r int32, a, b string) bool {
	line, s := m.lines[r], int(m.splits[r])
	return len(line) == len(a)+1+len(b) && s == len(a) && line[:s] == a && line[s+1:] == b
}

// rank returns the rank of the merge of a and b, if there is one.
func (m *mergeTable) rank(a, b string) (int32, bool) {
	if m == nil {
		return 0, false
	}
	if r, ok := m.byHash[m.hash(a, b)]; ok && m.is(r, a, b) {
		return r, true
	}
	if m.clash != nil {
		r, ok := m.clash[pairKey{a, b}]
		return r, ok
	}
	return 0, false
}

// vocabIndex finds a token's id by its text, as a map from text to id
// would, keeping 32-bit hashes in the map and the texts only once, in the
// vocabulary (a third of the map's size for a 150k-token vocabulary).
type vocabIndex struct {
	seed   maphash.Seed
	byHash map[uint32]int32 // hash of a text → the first id with it
	tokens []string         // by id, the vocabulary
	clash  map[string]int32 // texts whose hash an earlier, different text has
}

func newVocabIndex(tokens []string) *vocabIndex {
	return &vocabIndex{seed: maphash.MakeSeed(), byHash: make(map[uint32]int32, len(tokens)), tokens: tokens}
}

func (v *vocabIndex) hash(s string) uint32 {
	h := maphash.String(v.seed, s)
	return uint32(h ^ h>>32)
}

// add indexes id under its text, tokens[id], unless the text has an id.
func (v *vocabIndex) add(id int32) {
	s := v.tokens[id]
	h := v.hash(s)
	prev, taken := v.byHash[h]
	switch {
	case !taken:
		v.byHash[h] = id
	case v.tokens[prev] == s:
	default:
		if v.clash == nil {
			v.clash = make(map[string]int32)
		}
		if _, ok := v.clash[s]; !ok {
			v.clash[s] = id
		}
	}
}

// id returns the id of the token whose text is s.
func (v *vocabIndex) id(s string) (int32, bool) {
	if v == nil {
		return 0, false
	}
	if id, ok := v.byHash[v.hash(s)]; ok && v.tokens[id] == s {
		return id, true
	}
	if v.clash != nil {
		id, ok := v.clash[s]
		return id, ok
	}
	return 0, false
}
