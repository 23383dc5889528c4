package tokenizer

import (
	"hash/maphash"
	"math/bits"
	"strings"
)

// The vocabulary and its merges stay on the heap for the life of a model, so
// they are kept in a few flat arrays rather than as one string (one object
// and a 16-byte header) per token and per merge, and maps keyed by them: for
// the Qwen2 vocabulary that is 15.7 MiB down to 6.7 MiB (4.8 MiB with
// compactTexts), and the garbage collector may keep up to twice the live heap
// resident.

// stringTable holds n strings back to back in one string: string i is
// data[end[i-1]:end[i]].
type stringTable struct {
	data string
	end  []uint32
}

func newStringTable(ss []string, name func(i int) string) stringTable {
	total := 0
	for i, s := range ss {
		if s == "" && name != nil {
			s = name(i)
		}
		total += len(s)
	}
	var b strings.Builder
	b.Grow(total)
	end := make([]uint32, len(ss))
	for i, s := range ss {
		if s == "" && name != nil {
			s = name(i)
		}
		b.WriteString(s)
		end[i] = uint32(b.Len())
	}
	return stringTable{data: b.String(), end: end}
}

func (st *stringTable) len() int { return len(st.end) }

func (st *stringTable) at(i int32) string {
	start := uint32(0)
	if i > 0 {
		start = st.end[i-1]
	}
	return st.data[start:st.end[i]]
}

// openSlots returns the slot count for n keys of an open-addressing table:
// a power of two at most two-thirds full.
func openSlots(n int) int {
	return 1 << bits.Len(uint(n+n/2))
}

// vocabIndex finds a token's id by its text, as a map from text to id would,
// in an open-addressing table of ids (linear probing) whose keys are the
// tokenizer's texts themselves (Tokenizer.textIs, which spells nothing): 4
// bytes a slot instead of a map entry and a string header per token.
type vocabIndex struct {
	seed  maphash.Seed
	t     *Tokenizer // the texts
	slots []uint32   // id+1, 0 when empty
	mask  uint32
}

// newVocabIndex returns an empty index for n of t's texts.
func newVocabIndex(t *Tokenizer, n int) *vocabIndex {
	n = openSlots(n)
	return &vocabIndex{seed: maphash.MakeSeed(), t: t, slots: make([]uint32, n), mask: uint32(n - 1)}
}

// add indexes id under its text unless the text has an id already, which
// it returns.
func (v *vocabIndex) add(id int32) (prev int32, dup bool) {
	s := v.t.text(id)
	for i := uint32(maphash.String(v.seed, s)) & v.mask; ; i = (i + 1) & v.mask {
		e := v.slots[i]
		if e == 0 {
			v.slots[i] = uint32(id) + 1
			return 0, false
		}
		if v.t.textIs(int32(e-1), s) {
			return int32(e - 1), true
		}
	}
}

// id returns the id of the token whose text is s.
func (v *vocabIndex) id(s string) (int32, bool) {
	if v == nil {
		return 0, false
	}
	for i := uint32(maphash.String(v.seed, s)) & v.mask; ; i = (i + 1) & v.mask {
		e := v.slots[i]
		if e == 0 {
			return 0, false
		}
		if v.t.textIs(int32(e-1), s) {
			return int32(e - 1), true
		}
	}
}

// lookup is id with nullToken for a text that is no token.
func (v *vocabIndex) lookup(s string) int32 {
	if id, ok := v.id(s); ok {
		return id
	}
	return nullToken
}

type pairKey struct{ a, b string }

// mergeTable gives the BPE rank of a pair of adjacent symbols. Merges of two
// vocabulary tokens (all of them in real vocabularies) are keyed by the pair
// of token ids, in an open-addressing table of ranks checked against the
// pair each rank stands for; the merge lines need not be kept. A merge with
// a side that is no token can still apply (llama.cpp keys its ranks by the
// two strings, and a merge's result need not be a token), so those few are
// kept by their strings in a map.
type mergeTable struct {
	seed        uint64
	slots       []uint32 // rank+1, 0 when empty
	shift       uint     // 64 − log2(len(slots))
	left, right []int32  // by rank: the pair, or −1 for a rank not in slots
	other       map[pairKey]int32
}

// newMergeTable indexes lines by rank; split returns where a line's space
// between its two symbols is, or −1 to leave the line out. The first of
// several lines of one pair wins.
func newMergeTable(lines []string, split func(string) int, vocab *vocabIndex) *mergeTable {
	n := openSlots(len(lines))
	m := &mergeTable{
		seed: uint64(new(maphash.Hash).Sum64()), slots: make([]uint32, n), shift: uint(64 - bits.TrailingZeros(uint(n))),
		left: make([]int32, len(lines)), right: make([]int32, len(lines)),
	}
	for i, line := range lines {
		m.left[i], m.right[i] = nullToken, nullToken
		s := split(line)
		if s < 0 || s+1 >= len(line) {
			continue // a symbol is never empty: such a merge cannot apply
		}
		a, b := line[:s], line[s+1:]
		ia, okA := vocab.id(a)
		ib, okB := vocab.id(b)
		if !okA || !okB {
			k := pairKey{strings.Clone(a), strings.Clone(b)}
			if m.other == nil {
				m.other = make(map[pairKey]int32)
			}
			if _, ok := m.other[k]; !ok {
				m.other[k] = int32(i)
			}
			continue
		}
		for j := m.hash(ia, ib); ; j = (j + 1) & uint64(n-1) {
			e := m.slots[j]
			if e == 0 {
				m.slots[j] = uint32(i) + 1
				m.left[i], m.right[i] = ia, ib
				break
			}
			if m.left[e-1] == ia && m.right[e-1] == ib {
				break // a later duplicate: the first rank stands
			}
		}
	}
	return m
}

func (m *mergeTable) hash(a, b int32) uint64 {
	x := (uint64(uint32(a))<<32 | uint64(uint32(b))) ^ m.seed
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x >> m.shift
}

// rank returns the rank of the merge of the adjacent symbols a and b, given
// their texts and their token ids (nullToken for a text that is no token).
func (m *mergeTable) rank(ia, ib int32, a, b string) (int32, bool) {
	if m == nil {
		return 0, false
	}
	if ia < 0 || ib < 0 {
		if m.other == nil {
			return 0, false
		}
		r, ok := m.other[pairKey{a, b}]
		return r, ok
	}
	mask := uint64(len(m.slots) - 1)
	for j := m.hash(ia, ib); ; j = (j + 1) & mask {
		e := m.slots[j]
		if e == 0 {
			return 0, false
		}
		if m.left[e-1] == ia && m.right[e-1] == ib {
			return int32(e - 1), true
		}
	}
}
