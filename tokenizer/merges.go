package tokenizer

import (
	"hash/maphash"
	"math/bits"
	"strings"
)

// The vocabulary and its merges stay on the heap for the life of a model, so
// they are kept in a few flat arrays rather than as one string (one object
// and a 16-byte header) per token and per merge, and maps keyed by them: for
// the Qwen2 vocabulary that is 15.7 MiB down to 3.7 MiB (with compactTexts),
// and the garbage collector may keep up to twice the live heap resident.

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
// three quarters full at most, as the slots of one probe sequence share
// cache lines.
func openSlots(n int) int {
	return n + n/3 + 1
}

// slotOf maps a 64-bit hash to one of n slots.
func slotOf(h uint64, n int) int {
	j, _ := bits.Mul64(h, uint64(n))
	return int(j)
}

// vocabIndex finds a token's id by its text, as a map from text to id would,
// in an open-addressing table of ids (linear probing) whose keys are the
// tokenizer's texts themselves (Tokenizer.textIs, which spells nothing): 4
// bytes a slot instead of a map entry and a string header per token. The
// bits of a slot that the ids leave free hold bits of the text's hash, so
// that a probe seldom compares a text that is not the one sought.
type vocabIndex struct {
	seed    maphash.Seed
	t       *Tokenizer // the texts
	slots   []uint32   // tag | id+1, 0 when empty
	tagMask uint32
}

// newVocabIndex returns an empty index for n of t's texts.
func newVocabIndex(t *Tokenizer, n int) *vocabIndex {
	return &vocabIndex{seed: maphash.MakeSeed(), t: t, slots: make([]uint32, openSlots(n)), tagMask: ^uint32(0) << bits.Len(uint(n))}
}

// probe returns where s's probe sequence starts and its tag.
func (v *vocabIndex) probe(s string) (int, uint32) {
	h := maphash.String(v.seed, s)
	return slotOf(h, len(v.slots)), uint32(h) & v.tagMask
}

// add indexes id under its text unless the text has an id already, which
// it returns.
func (v *vocabIndex) add(id int32) (prev int32, dup bool) {
	s := v.t.text(id)
	j, tag := v.probe(s)
	for {
		e := v.slots[j]
		if e == 0 {
			v.slots[j] = tag | uint32(id+1)
			return 0, false
		}
		if e&v.tagMask == tag && v.t.textIs(int32(e&^v.tagMask)-1, s) {
			return int32(e&^v.tagMask) - 1, true
		}
		if j++; j == len(v.slots) {
			j = 0
		}
	}
}

// id returns the id of the token whose text is s.
func (v *vocabIndex) id(s string) (int32, bool) {
	if v == nil {
		return 0, false
	}
	j, tag := v.probe(s)
	for {
		e := v.slots[j]
		if e == 0 {
			return 0, false
		}
		if e&v.tagMask == tag && v.t.textIs(int32(e&^v.tagMask)-1, s) {
			return int32(e&^v.tagMask) - 1, true
		}
		if j++; j == len(v.slots) {
			j = 0
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
// of token ids, in an open-addressing table whose slots hold the pair and its
// rank in one word; the merge lines need not be kept. A merge with a side
// that is no token can still apply (llama.cpp keys its ranks by the two
// strings, and a merge's result need not be a token), so those few are kept
// by their strings in a map, as are any whose ids or rank do not fit a slot.
type mergeTable struct {
	seed  uint64
	slots []uint64 // a<<43 | b<<22 | rank+1, 0 when empty
	other map[pairKey]int32
}

const (
	mergeIDBits   = 21 // token ids below 2M (Hugging Face vocabularies are)
	mergeRankBits = 64 - 2*mergeIDBits
	mergeRankMask = 1<<mergeRankBits - 1
	maxMergeID    = 1<<mergeIDBits - 1
	maxMergeRank  = mergeRankMask - 1 // rank+1 fits
)

// newMergeTable indexes lines by rank; split returns where a line's space
// between its two symbols is, or −1 to leave the line out. The first of
// several lines of one pair wins.
func newMergeTable(lines []string, split func(string) int, vocab *vocabIndex) *mergeTable {
	m := &mergeTable{seed: maphash.Comparable(maphash.MakeSeed(), 0), slots: make([]uint64, openSlots(len(lines)))}
	for i, line := range lines {
		s := split(line)
		if s < 0 || s+1 >= len(line) {
			continue // a symbol is never empty: such a merge cannot apply
		}
		a, b := line[:s], line[s+1:]
		ia, okA := vocab.id(a)
		ib, okB := vocab.id(b)
		if okA && okB && ia <= maxMergeID && ib <= maxMergeID {
			key := m.key(ia, ib)
			j, found := m.find(key)
			if found {
				continue // a later duplicate: the first rank stands
			}
			if i <= maxMergeRank {
				m.slots[j] = key | uint64(i+1)
				continue
			}
		}
		k := pairKey{strings.Clone(a), strings.Clone(b)}
		if m.other == nil {
			m.other = make(map[pairKey]int32)
		}
		if _, ok := m.other[k]; !ok {
			m.other[k] = int32(i)
		}
	}
	return m
}

func (m *mergeTable) key(a, b int32) uint64 {
	return uint64(a)<<(64-mergeIDBits) | uint64(b)<<mergeRankBits
}

// find returns the slot of key, or the empty slot where it would go.
func (m *mergeTable) find(key uint64) (int, bool) {
	x := key ^ m.seed
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	for j := slotOf(x, len(m.slots)); ; {
		e := m.slots[j]
		if e == 0 {
			return j, false
		}
		if e&^mergeRankMask == key {
			return j, true
		}
		if j++; j == len(m.slots) {
			j = 0
		}
	}
}

// rank returns the rank of the merge of the adjacent symbols a and b, given
// their texts and their token ids (nullToken for a text that is no token).
func (m *mergeTable) rank(ia, ib int32, a, b string) (int32, bool) {
	if m == nil {
		return 0, false
	}
	if ia >= 0 && ib >= 0 && ia <= maxMergeID && ib <= maxMergeID {
		if j, ok := m.find(m.key(ia, ib)); ok {
			return int32(m.slots[j]&mergeRankMask) - 1, true
		}
	}
	if m.other == nil {
		return 0, false
	}
	r, ok := m.other[pairKey{a, b}]
	return r, ok
}
