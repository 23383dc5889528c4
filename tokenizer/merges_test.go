package tokenizer

import "testing"

func TestMergeTable(t *testing.T) {
	lines := []string{"a b", "ab c", "a b", "x", "", " y z", "Ġ Ġ", "ĠĠ ĠĠ"}
	m := newMergeTable(lines, func(s string) int { // the GGUF split
		for i := 1; i < len(s); i++ {
			if s[i] == ' ' {
				return i
			}
		}
		return -1
	})
	for _, tc := range []struct {
		a, b string
		rank int32
		ok   bool
	}{
		{"a", "b", 0, true}, // the first of two lines wins
		{"ab", "c", 1, true},
		{" y", "z", 5, true}, // a symbol that starts with a space
		{"Ġ", "Ġ", 6, true},
		{"ĠĠ", "ĠĠ", 7, true},
		{"b", "a", 0, false},
		{"a", "bc", 0, false},
		{"x", "", 0, false},
		{"", "", 0, false},
		{"", "y z", 0, false},
	} {
		r, ok := m.rank(tc.a, tc.b)
		if ok != tc.ok || (ok && r != tc.rank) {
			t.Errorf("rank(%q, %q) = %d, %v; want %d, %v", tc.a, tc.b, r, ok, tc.rank, tc.ok)
		}
	}
	// Pairs whose hash an earlier pair took are found through the clash map.
	m.clash = map[pairKey]int32{{"q", "r"}: 3}
	if r, ok := m.rank("q", "r"); !ok || r != 3 {
		t.Errorf("a clashing pair: %d, %v", r, ok)
	}
	if _, ok := (*mergeTable)(nil).rank("a", "b"); ok {
		t.Error("a nil table has merges")
	}
}

func TestVocabIndex(t *testing.T) {
	tokens := []string{"a", "b", "ab", "a", "", "Ġthe"}
	v := newVocabIndex(tokens)
	for id := range tokens {
		v.add(int32(id))
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
	v.clash = map[string]int32{"zz": 3}
	if id, ok := v.id("zz"); !ok || id != 3 {
		t.Errorf("a clashing text: %d, %v", id, ok)
	}
}
