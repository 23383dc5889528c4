package tokenizer

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// vocabTexts returns the vocabulary's texts by id.
func vocabTexts(tk *Tokenizer) []string {
	out := make([]string, tk.VocabSize())
	for id := range out {
		out[id] = tk.TokenText(int32(id))
	}
	return out
}

// mergePairs returns a BPE tokenizer's merges by rank, each pair once (at
// the rank of its first line).
func mergePairs(tk *Tokenizer) [][2]string {
	type ranked struct {
		r    int32
		a, b string
	}
	var all []ranked
	m := tk.merges
	for _, e := range m.slots {
		if e != 0 {
			a, b := int32(e>>(64-mergeIDBits)), int32(e>>mergeRankBits&maxMergeID)
			all = append(all, ranked{int32(e&mergeRankMask) - 1, tk.TokenText(a), tk.TokenText(b)})
		}
	}
	for k, r := range m.other {
		all = append(all, ranked{r, k.a, k.b})
	}
	slices.SortFunc(all, func(x, y ranked) int { return cmp.Compare(x.r, y.r) })
	out := make([][2]string, len(all))
	for i, x := range all {
		out[i] = [2]string{x.a, x.b}
	}
	return out
}

func testVocab(tokens []string) (*Tokenizer, *vocabIndex) {
	t := &Tokenizer{tokens: newStringTable(tokens, nil)}
	v := newVocabIndex(t, len(tokens))
	for id := range tokens {
		v.add(int32(id))
	}
	return t, v
}

func TestMergeTable(t *testing.T) {
	_, vocab := testVocab([]string{"a", "b", "ab", "c", "abc", "Ġ", "ĠĠ", "y", " y", "q", "r"})
	lines := []string{"a b", "ab c", "a b", "x", "", " y z", "Ġ Ġ", "ĠĠ ĠĠ", "q r", "y ", "r q", "q r"}
	m := newMergeTable(lines, func(s string) int { // the GGUF split
		for i := 1; i < len(s); i++ {
			if s[i] == ' ' {
				return i
			}
		}
		return -1
	}, vocab)
	for _, tc := range []struct {
		a, b string
		rank int32
		ok   bool
	}{
		{"a", "b", 0, true}, // the first of two lines wins
		{"ab", "c", 1, true},
		{" y", "z", 5, true}, // a symbol that starts with a space; z is no token
		{"Ġ", "Ġ", 6, true},
		{"ĠĠ", "ĠĠ", 7, true}, // the result is no token
		{"q", "r", 8, true},
		{"r", "q", 10, true},
		{"b", "a", 0, false},
		{"a", "bc", 0, false},
		{"x", "", 0, false},
		{"y", "", 0, false},
		{"", "", 0, false},
		{"", "y z", 0, false},
		{"z", "y", 0, false},
	} {
		r, ok := m.rank(vocab.lookup(tc.a), vocab.lookup(tc.b), tc.a, tc.b)
		if ok != tc.ok || (ok && r != tc.rank) {
			t.Errorf("rank(%q, %q) = %d, %v; want %d, %v", tc.a, tc.b, r, ok, tc.rank, tc.ok)
		}
	}
	if len(m.other) != 1 {
		t.Errorf("%d merges kept by their texts, want 1 (\" y z\"): %v", len(m.other), m.other)
	}
	if _, ok := (*mergeTable)(nil).rank(0, 1, "a", "b"); ok {
		t.Error("a nil table has merges")
	}
}

func TestVocabIndex(t *testing.T) {
	tokens := []string{"a", "b", "ab", "a", "", "Ġthe"}
	tk := &Tokenizer{tokens: newStringTable(tokens, nil)}
	v := newVocabIndex(tk, len(tokens))
	for id := range tokens {
		prev, dup := v.add(int32(id))
		if wantDup := id == 3; dup != wantDup || (dup && prev != 0) {
			t.Errorf("add(%d) = %d, %v", id, prev, dup)
		}
	}
	for _, tc := range []struct {
		s  string
		id int32
		ok bool
	}{
		{"a", 0, true}, // the first id of a text wins
		{"b", 1, true},
		{"ab", 2, true},
		{"", 4, true},
		{"Ġthe", 5, true},
		{"abc", 0, false},
		{"Ġ", 0, false},
	} {
		id, ok := v.id(tc.s)
		if ok != tc.ok || (ok && id != tc.id) {
			t.Errorf("id(%q) = %d, %v; want %d, %v", tc.s, id, ok, tc.id, tc.ok)
		}
	}
	if got := tk.text(5); got != "Ġthe" {
		t.Errorf("text 5 = %q", got)
	}
}

// TestIndexesFull fills the open-addressing tables at every size up to a
// few hundred: every key is found, and no lookup runs without end.
func TestIndexesFull(t *testing.T) {
	for n := 0; n < 300; n++ {
		tokens := make([]string, n)
		for i := range tokens {
			tokens[i] = string(rune('a'+i%26)) + string(rune('A'+i/26))
		}
		_, v := testVocab(tokens)
		var lines []string
		for i := 1; i < n; i++ {
			lines = append(lines, tokens[i-1]+" "+tokens[i])
		}
		m := newMergeTable(lines, func(s string) int { return 2 }, v)
		for i, s := range tokens {
			if id, ok := v.id(s); !ok || id != int32(i) {
				t.Fatalf("n=%d: id(%q) = %d, %v", n, s, id, ok)
			}
			if i > 0 {
				if r, ok := m.rank(int32(i-1), int32(i), tokens[i-1], s); !ok || r != int32(i-1) {
					t.Fatalf("n=%d: rank of merge %d = %d, %v", n, i-1, r, ok)
				}
			}
		}
		if _, ok := v.id("zz"); ok {
			t.Fatalf("n=%d: found a text that is no token", n)
		}
		if _, ok := m.rank(0, 0, "", ""); ok && n > 0 {
			t.Fatalf("n=%d: found a merge that is none", n)
		}
	}
}

// TestMergeTableMatchesStringKeys holds the table to llama.cpp's: ranks keyed
// by the pair of strings, the first line of a pair winning, whether or not
// the sides and the result are tokens.
func TestMergeTableMatchesStringKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "Ġ", "é"}
	word := func() string {
		var s strings.Builder
		for range 1 + rng.IntN(3) {
			s.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return s.String()
	}
	for round := range 50 {
		seen := map[string]bool{}
		var tokens []string
		for range rng.IntN(40) {
			if w := word(); !seen[w] {
				seen[w] = true
				tokens = append(tokens, w)
			}
		}
		_, vocab := testVocab(tokens)
		var lines []string
		want := map[pairKey]int32{}
		for i := range rng.IntN(60) {
			a, b := word(), word()
			lines = append(lines, a+" "+b)
			if _, ok := want[pairKey{a, b}]; !ok {
				want[pairKey{a, b}] = int32(i)
			}
		}
		m := newMergeTable(lines, func(s string) int { return strings.IndexByte(s[1:], ' ') + 1 }, vocab)
		for range 400 {
			a, b := word(), word()
			r, ok := m.rank(vocab.lookup(a), vocab.lookup(b), a, b)
			wr, wok := want[pairKey{a, b}]
			if ok != wok || r != wr {
				t.Fatalf("round %d: rank(%q, %q) = %d, %v; want %d, %v", round, a, b, r, ok, wr, wok)
			}
		}
	}
}

// TestMergeTableLargeIDs: merges of ids too large for a slot are found by
// their strings.
func TestMergeTableLargeIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a vocabulary of 2M tokens")
	}
	n := maxMergeID + 3
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = strconv.Itoa(i)
	}
	_, vocab := testVocab(tokens)
	big, big2 := strconv.Itoa(maxMergeID+1), strconv.Itoa(maxMergeID+2)
	lines := []string{"0 1", big + " 1", "1 " + big2, big + " 1", "0 1", "2 3"}
	m := newMergeTable(lines, func(s string) int { return strings.IndexByte(s, ' ') }, vocab)
	for _, tc := range []struct {
		a, b string
		rank int32
		ok   bool
	}{
		{"0", "1", 0, true},
		{big, "1", 1, true}, // the first of two lines wins
		{"1", big2, 2, true},
		{"2", "3", 5, true},
		{"1", big, 0, false},
		{big2, big, 0, false},
	} {
		r, ok := m.rank(vocab.lookup(tc.a), vocab.lookup(tc.b), tc.a, tc.b)
		if ok != tc.ok || (ok && r != tc.rank) {
			t.Errorf("rank(%q, %q) = %d, %v; want %d, %v", tc.a, tc.b, r, ok, tc.rank, tc.ok)
		}
	}
	if len(m.other) != 2 {
		t.Errorf("%d merges kept by their strings, want 2", len(m.other))
	}
}
