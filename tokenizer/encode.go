package tokenizer

import (
	"slices"
	"strings"
)

// frag is a piece of the input: either raw text [lo,hi) or a special token.
type frag struct {
	tok    int32 // nullToken for raw text
	lo, hi int
}

// partition splits text on special tokens like llama.cpp's tokenizer_st_partition:
// special tokens are tried longest first, each splitting every remaining raw fragment
// at all its occurrences. Control and unknown tokens are only matched when parseSpecial.
func (t *Tokenizer) partition(text string, parseSpecial bool) []frag {
	if text == "" {
		return nil
	}
	frags := []frag{{tok: nullToken, lo: 0, hi: len(text)}}
	var next []frag
	for _, id := range t.specials {
		if !parseSpecial && t.attrs[id]&(attrControl|attrUnknown) != 0 {
			continue
		}
		st := t.text(id)
		if !strings.Contains(text, st) {
			continue
		}
		next = next[:0]
		for _, f := range frags {
			if f.tok != nullToken {
				next = append(next, f)
				continue
			}
			lo := f.lo
			for {
				k := strings.Index(text[lo:f.hi], st)
				if k < 0 {
					break
				}
				if k > 0 {
					next = append(next, frag{tok: nullToken, lo: lo, hi: lo + k})
				}
				next = append(next, frag{tok: id})
				lo += k + len(st)
			}
			if lo < f.hi {
				next = append(next, frag{tok: nullToken, lo: lo, hi: f.hi})
			}
		}
		frags, next = next, frags
	}
	return frags
}

// Encode tokenizes text like llama_tokenize. With addSpecial, BOS (and EOS) are added
// when the vocab asks for them; with parseSpecial, the text of control tokens is
// matched as those tokens (user-defined tokens always are).
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) []int32 {
	out, _ := t.encode(text, addSpecial, parseSpecial, 0)
	return out
}

// EncodeLimit is Encode for input of unknown size: it reports false, and returns no
// tokens, as soon as the text is known to encode to more than limit tokens (limit ≤ 0:
// no limit). The work and memory it spends are bounded by the limit, not by the text:
// a text longer than limit times the longest token's bytes is refused before any
// tokenizing, and tokenizing stops once the output passes the limit.
func (t *Tokenizer) EncodeLimit(text string, addSpecial, parseSpecial bool, limit int) ([]int32, bool) {
	if limit > 0 && t.maxTokenBytes > 0 && len(text)/t.maxTokenBytes > limit {
		return nil, false
	}
	return t.encode(text, addSpecial, parseSpecial, limit)
}

// MaxTokenBytes is the most bytes of input one token can stand for (0 when some input
// bytes may map to no token at all, so that no such bound holds).
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

func (t *Tokenizer) encode(text string, addSpecial, parseSpecial bool, limit int) ([]int32, bool) {
	size := len(text)/3 + 2
	if limit > 0 {
		size = min(size, limit+2)
	}
	out := make([]int32, 0, size)
	over := func() bool { return limit > 0 && len(out) > limit }
	if addSpecial && t.addBOS && t.bos != nullToken {
		out = append(out, t.bos)
	}
	frags := t.partition(text, parseSpecial)
	switch t.kind {
	case kindSPM:
		prevSpecial := true
		for _, f := range frags {
			if over() {
				return nil, false
			}
			if f.tok != nullToken {
				out = append(out, f.tok)
				prevSpecial = true
				continue
			}
			s := text[f.lo:f.hi]
			if t.addSpacePrefix && prevSpecial {
				s = " " + s
			}
			s = strings.ReplaceAll(s, " ", "\u2581")
			if t.spmMerges {
				out = t.bpeMerge(s, out, true)
			} else {
				out = t.spmTokenize(s, out)
			}
			prevSpecial = false
		}
	case kindBPE:
		for _, f := range frags {
			if over() {
				return nil, false
			}
			if f.tok != nullToken {
				out = append(out, f.tok)
				continue
			}
			out = t.bpeTokenize(text[f.lo:f.hi], out, limit)
		}
	}
	if addSpecial && t.addEOS && t.eos != nullToken {
		out = append(out, t.eos)
	}
	if over() {
		return nil, false
	}
	return out, true
}

// symbol is a run of bytes [start, start+n) of the text being merged, in a linked list.
type symbol struct {
	start, n   int
	prev, next int
	id         int32 // BPE: the token whose text the run is, or nullToken
}

type bigram struct {
	left, right int
	score       float32 // SPM: higher first
	rank        int32   // BPE: lower first
	size        int
}

// bigramHeap is a binary heap of bigrams ordered by less (no interface boxing).
type bigramHeap struct {
	items []bigram
	less  func(a, b *bigram) bool
}

func spmLess(a, b *bigram) bool {
	if a.score != b.score {
		return a.score > b.score
	}
	return a.left < b.left
}

func bpeLess(a, b *bigram) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.left < b.left
}

func (h *bigramHeap) push(b bigram) {
	h.items = append(h.items, b)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(&h.items[i], &h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *bigramHeap) pop() bigram {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items = h.items[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && h.less(&h.items[l], &h.items[m]) {
			m = l
		}
		if r < last && h.less(&h.items[r], &h.items[m]) {
			m = r
		}
		if m == i {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}

func splitSymbols(text string) []symbol {
	syms := make([]symbol, 0, len(text))
	for off := 0; off < len(text); {
		n := min(utf8Len(text[off]), len(text)-off)
		syms = append(syms, symbol{start: off, n: n, prev: len(syms) - 1, next: len(syms) + 1})
		off += n
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

// spmTokenize is llama.cpp's SentencePiece tokenizer: greedily merge the adjacent pair
// whose concatenation is the highest-scoring token, then fall back to byte tokens.
func (t *Tokenizer) spmTokenize(text string, out []int32) []int32 {
	syms := splitSymbols(text)
	q := bigramHeap{items: make([]bigram, 0, len(syms)), less: spmLess}
	tryAdd := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		s := text[syms[l].start : syms[l].start+syms[l].n+syms[r].n]
		id, ok := t.tokenToID.id(s)
		if !ok {
			return
		}
		q.push(bigram{left: l, right: r, score: t.scores[id], size: len(s)})
	}
	for i := 1; i < len(syms); i++ {
		tryAdd(i-1, i)
	}
	for len(q.items) > 0 {
		b := q.pop()
		ls, rs := &syms[b.left], &syms[b.right]
		if ls.n == 0 || rs.n == 0 || ls.n+rs.n != b.size {
			continue
		}
		ls.n += rs.n
		rs.n = 0
		ls.next = rs.next
		if rs.next >= 0 {
			syms[rs.next].prev = b.left
		}
		tryAdd(ls.prev, b.left)
		tryAdd(b.left, ls.next)
	}
	for i := 0; i != -1 && len(syms) > 0; i = syms[i].next {
		s := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := t.tokenToID.id(s); ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(s); j++ {
			if id := t.byteTok[s[j]]; id != nullToken {
				out = append(out, id)
			} else if t.unk != nullToken {
				out = append(out, t.unk)
			}
		}
	}
	return out
}

// bpeTokenize pre-tokenizes text into words, maps bytes to the byte-level alphabet,
// and merges each word by BPE rank.
func (t *Tokenizer) bpeTokenize(text string, out []int32, limit int) []int32 {
	var enc strings.Builder
	for _, w := range t.pre.split(text) {
		if limit > 0 && len(out) > limit {
			return out
		}
		enc.Reset()
		for i := 0; i < len(w); i++ {
			enc.WriteString(byteToUnicode[w[i]])
		}
		out = t.bpeWord(enc.String(), out)
	}
	return out
}

// maxCachedWord is the longest word (in bytes) the word cache takes.
const maxCachedWord = 64

func (t *Tokenizer) bpeWord(word string, out []int32) []int32 {
	if t.ignoreMerges {
		if id, ok := t.tokenToID.id(word); ok {
			return append(out, id)
		}
	}
	if len(word) > maxCachedWord {
		return t.bpeMerge(word, out, false)
	}
	if ids, ok := t.wordCache.load(word); ok {
		return append(out, ids...)
	}
	start := len(out)
	out = t.bpeMerge(word, out, false)
	t.wordCache.store(word, slices.Clone(out[start:]))
	return out
}

// bpeMerge merges word by BPE rank. Symbols left without a token fall back to
// per-byte tokens: <0xXX> tokens (or unk) when byteFallback, else single-byte texts.
func (t *Tokenizer) bpeMerge(word string, out []int32, byteFallback bool) []int32 {
	syms := splitSymbols(word)
	q := bigramHeap{items: make([]bigram, 0, len(syms)), less: bpeLess}
	text := func(i int) string { return word[syms[i].start : syms[i].start+syms[i].n] }
	for i := range syms {
		syms[i].id = t.tokenToID.lookup(text(i))
	}
	tryAdd := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		rank, ok := t.merges.rank(syms[l].id, syms[r].id, text(l), text(r))
		if !ok {
			return
		}
		q.push(bigram{left: l, right: r, rank: rank, size: syms[l].n + syms[r].n})
	}
	for i := 1; i < len(syms); i++ {
		tryAdd(i-1, i)
	}
	for len(q.items) > 0 {
		b := q.pop()
		ls, rs := &syms[b.left], &syms[b.right]
		if ls.n == 0 || rs.n == 0 || ls.next != b.right || ls.n+rs.n != b.size {
			continue
		}
		ls.n += rs.n
		rs.n = 0
		ls.next = rs.next
		if rs.next >= 0 {
			syms[rs.next].prev = b.left
		}
		ls.id = t.tokenToID.lookup(text(b.left))
		tryAdd(ls.prev, b.left)
		tryAdd(b.left, ls.next)
	}
	for i := 0; i != -1 && len(syms) > 0; i = syms[i].next {
		if id := syms[i].id; id != nullToken {
			out = append(out, id)
			continue
		}
		s := text(i)
		for j := 0; j < len(s); j++ {
			if byteFallback {
				if id := t.byteTok[s[j]]; id != nullToken {
					out = append(out, id)
				} else if t.unk != nullToken {
					out = append(out, t.unk)
				}
			} else if id, ok := t.tokenToID.id(s[j : j+1]); ok {
				out = append(out, id)
			}
		}
	}
	return out
}
