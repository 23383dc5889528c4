package tokenizer

import "sort"

// A byte-level BPE vocabulary's texts are, for nearly all tokens, the
// byte-level spelling of the bytes they stand for (their pieces, which the
// tokenizer keeps anyway): "Ġthe" is " the". Once built, such a tokenizer
// keeps only the other texts (control and user-defined tokens, texts that do
// not spell their piece), and spells the rest from the pieces when asked:
// 1.9 MiB less heap for the Qwen2 vocabulary.

// attrKeptText marks, in a compacted tokenizer, the tokens whose texts are
// kept rather than spelled from their pieces.
const attrKeptText uint8 = 1 << 7

// byteSpelling is byteToUnicode as at most two bytes and a length (filled
// in with it).
var byteSpelling [256]struct {
	b [2]byte
	n uint8
}

// spellsBytes reports whether s is the byte-level spelling of p.
func spellsBytes(s string, p []byte) bool {
	if len(s) < len(p) || len(s) > 2*len(p) {
		return false
	}
	for _, c := range p {
		u := &byteSpelling[c]
		if u.n == 1 {
			if len(s) < 1 || s[0] != u.b[0] {
				return false
			}
			s = s[1:]
			continue
		}
		if len(s) < 2 || s[0] != u.b[0] || s[1] != u.b[1] {
			return false
		}
		s = s[2:]
	}
	return len(s) == 0
}

// text returns id's vocabulary text (id in range).
func (t *Tokenizer) text(id int32) string {
	if !t.compact {
		return t.tokens.at(id)
	}
	if t.attrs[id]&attrKeptText != 0 {
		return t.tokens.at(t.keptIndex(id))
	}
	p := t.Piece(id)
	b := make([]byte, 0, 2*len(p))
	for _, c := range p {
		u := &byteSpelling[c]
		b = append(b, u.b[:u.n]...)
	}
	return string(b)
}

// textIs reports whether id's vocabulary text is s, spelling nothing.
func (t *Tokenizer) textIs(id int32, s string) bool {
	if !t.compact {
		return t.tokens.at(id) == s
	}
	if t.attrs[id]&attrKeptText != 0 {
		return t.tokens.at(t.keptIndex(id)) == s
	}
	return spellsBytes(s, t.Piece(id))
}

func (t *Tokenizer) keptIndex(id int32) int32 {
	return int32(sort.Search(len(t.kept), func(i int) bool { return t.kept[i] >= id }))
}

// compactTexts drops the texts a byte-level BPE vocabulary can spell from
// its pieces; it runs last, once the attributes and pieces are final.
func (t *Tokenizer) compactTexts() {
	if t.kind != kindBPE || t.compact {
		return
	}
	var keep []string
	t.kept = nil
	for id := range int32(len(t.attrs)) {
		s := t.tokens.at(id)
		if t.attrs[id] == attrNormal && spellsBytes(s, t.Piece(id)) {
			continue
		}
		t.attrs[id] |= attrKeptText
		t.kept = append(t.kept, id)
		keep = append(keep, s)
	}
	t.tokens = newStringTable(keep, nil)
	t.compact = true
}
