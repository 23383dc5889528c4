package tokenizer

// Pre-tokenizers: hand-written scanners equivalent to the regular expressions
// llama.cpp applies before BPE. Each pass splits every span produced by the
// previous pass into smaller spans of code points.

type span struct{ lo, hi int }

type splitPass func(s *scanText, lo, hi int, out []span) []span

type scanText struct {
	cpts  []rune
	flags []uint8
}

func newScanText(text string) *scanText {
	st := &scanText{cpts: make([]rune, 0, len(text)), flags: make([]uint8, 0, len(text))}
	for i := 0; i < len(text); {
		c, n := decodeCpt(text, i)
		i += n
		st.cpts = append(st.cpts, c)
		st.flags = append(st.flags, cptFlags(c))
	}
	return st
}

// fragment is a view of one span: positions outside [lo,hi) read as "no code point".
type fragment struct {
	s      *scanText
	lo, hi int
	prev   int
	out    []span
}

func (f *fragment) flags(p int) uint8 {
	if p >= f.lo && p < f.hi {
		return f.s.flags[p]
	}
	return 0
}

func (f *fragment) cpt(p int) rune {
	if p >= f.lo && p < f.hi {
		return f.s.cpts[p]
	}
	return -1
}

func (f *fragment) add(end int) int {
	n := end - f.prev
	if n > 0 {
		f.out = append(f.out, span{f.prev, end})
	}
	f.prev = end
	return n
}

func lowerASCII(c rune) rune {
	if c >= 'A' && c <= 'Z' {
		return c + 32
	}
	return c
}

// contraction returns the length of 's 't 're 've 'm 'll 'd at p (0 if none).
func (f *fragment) contraction(p int, fold bool) int {
	if f.cpt(p) != '\'' || p+1 >= f.hi {
		return 0
	}
	c1 := f.cpt(p + 1)
	if fold {
		c1 = lowerASCII(c1)
	}
	if c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd' {
		return 2
	}
	if p+2 < f.hi {
		c2 := f.cpt(p + 2)
		if fold {
			c2 = lowerASCII(c2)
		}
		if (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l') {
			return 3
		}
	}
	return 0
}

// splitGPT2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(s *scanText, lo, hi int, out []span) []span {
	f := fragment{s: s, lo: lo, hi: hi, prev: lo, out: out}
	for pos := lo; pos < hi; {
		c := f.cpt(pos)
		fl := f.flags(pos)
		if n := f.contraction(pos, false); n > 0 {
			pos += f.add(pos + n)
			continue
		}
		fl2 := fl
		if c == ' ' {
			fl2 = f.flags(pos + 1)
		}
		if fl2&flagLetter != 0 {
			if c == ' ' {
				pos++
			}
			for f.flags(pos)&flagLetter != 0 {
				pos++
			}
			f.add(pos)
			continue
		}
		if fl2&flagNumber != 0 {
			if c == ' ' {
				pos++
			}
			for f.flags(pos)&flagNumber != 0 {
				pos++
			}
			f.add(pos)
			continue
		}
		if fl2&(flagSpace|flagLetter|flagNumber) == 0 && fl2 != 0 {
			if c == ' ' {
				pos++
			}
			for {
				g := f.flags(pos)
				if g&(flagSpace|flagLetter|flagNumber) != 0 || g == 0 {
					break
				}
				pos++
			}
			f.add(pos)
			continue
		}
		nws := 0
		for f.flags(pos+nws)&flagSpace != 0 {
			nws++
		}
		if nws > 1 && f.cpt(pos+nws) != -1 {
			pos += nws - 1
			f.add(pos)
			continue
		}
		if nws > 0 {
			pos += nws
			f.add(pos)
			continue
		}
		pos++
		f.add(pos)
	}
	return f.out
}

// splitLlama3 implements Llama 3's pattern:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitLlama3(s *scanText, lo, hi int, out []span) []span {
	return splitLlama3Digits(s, lo, hi, out, 3)
}

// splitQwen2 is Qwen2's pattern: Llama 3's with \p{N} (single digits) instead of \p{N}{1,3}.
func splitQwen2(s *scanText, lo, hi int, out []span) []span {
	return splitLlama3Digits(s, lo, hi, out, 1)
}

func splitLlama3Digits(s *scanText, lo, hi int, out []span, maxDigits int) []span {
	f := fragment{s: s, lo: lo, hi: hi, prev: lo, out: out}
	for pos := lo; pos < hi; {
		c := f.cpt(pos)
		fl := f.flags(pos)
		if n := f.contraction(pos, true); n > 0 {
			pos += f.add(pos + n)
			continue
		}
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if !(c == '\r' || c == '\n' || fl&flagNumber != 0) {
			if fl&flagLetter != 0 || f.flags(pos+1)&flagLetter != 0 {
				pos++
				for f.flags(pos)&flagLetter != 0 {
					pos++
				}
				f.add(pos)
				continue
			}
		}
		// \p{N}{1,maxDigits}
		if fl&flagNumber != 0 {
			ini := pos
			for f.flags(pos)&flagNumber != 0 {
				pos++
				if pos-ini >= maxDigits {
					f.add(pos)
					ini = pos
				}
			}
			f.add(pos)
			continue
		}
		// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
		fl2 := fl
		if c == ' ' {
			fl2 = f.flags(pos + 1)
		}
		if fl2&(flagSpace|flagLetter|flagNumber) == 0 && fl != 0 {
			if c == ' ' {
				pos++
			}
			for {
				g := f.flags(pos)
				if g&(flagSpace|flagLetter|flagNumber) != 0 || g == 0 {
					break
				}
				pos++
			}
			for c2 := f.cpt(pos); c2 == '\r' || c2 == '\n'; c2 = f.cpt(pos) {
				pos++
			}
			f.add(pos)
			continue
		}
		nws := 0
		lastNL := 0
		for f.flags(pos+nws)&flagSpace != 0 {
			if c2 := f.cpt(pos + nws); c2 == '\r' || c2 == '\n' {
				lastNL = pos + nws + 1
			}
			nws++
		}
		if lastNL > 0 { // \s*[\r\n]+
			pos = lastNL
			f.add(pos)
			continue
		}
		if nws > 1 && f.cpt(pos+nws) != -1 { // \s+(?!\S)
			pos += nws - 1
			f.add(pos)
			continue
		}
		if nws > 0 {
			pos += nws
			f.add(pos)
			continue
		}
		pos++
		f.add(pos)
	}
	return f.out
}

// splitRuns splits a span into maximal runs where in(flags) holds, keeping the gaps
// between them as their own spans (std::regex_iterator over "[class]+").
func splitRuns(s *scanText, lo, hi int, out []span, in func(rune, uint8) bool) []span {
	start := lo
	for pos := lo; pos < hi; {
		if !in(s.cpts[pos], s.flags[pos]) {
			pos++
			continue
		}
		end := pos
		for end < hi && in(s.cpts[end], s.flags[end]) {
			end++
		}
		if pos > start {
			out = append(out, span{start, pos})
		}
		out = append(out, span{pos, end})
		start, pos = end, end
	}
	if start < hi {
		out = append(out, span{start, hi})
	}
	return out
}

// splitPunctRuns: [\p{P}\$\+<=>\^~\|]+
func splitPunctRuns(s *scanText, lo, hi int, out []span) []span {
	return splitRuns(s, lo, hi, out, func(_ rune, f uint8) bool { return f&flagPunct != 0 })
}

// splitNumberRuns: \p{N}+
func splitNumberRuns(s *scanText, lo, hi int, out []span) []span {
	return splitRuns(s, lo, hi, out, func(_ rune, f uint8) bool { return f&flagNumber != 0 })
}

// splitEachNumber: \p{N} (every number code point on its own).
func splitEachNumber(s *scanText, lo, hi int, out []span) []span {
	start := lo
	for pos := lo; pos < hi; pos++ {
		if s.flags[pos]&flagNumber != 0 {
			if pos > start {
				out = append(out, span{start, pos})
			}
			out = append(out, span{pos, pos + 1})
			start = pos + 1
		}
	}
	if start < hi {
		out = append(out, span{start, hi})
	}
	return out
}

// splitASCIIDigitTriples: [0-9][0-9][0-9]
func splitASCIIDigitTriples(s *scanText, lo, hi int, out []span) []span {
	isDigit := func(p int) bool { return s.cpts[p] >= '0' && s.cpts[p] <= '9' }
	start := lo
	for pos := lo; pos+3 <= hi; {
		if isDigit(pos) && isDigit(pos+1) && isDigit(pos+2) {
			if pos > start {
				out = append(out, span{start, pos})
			}
			out = append(out, span{pos, pos + 3})
			pos += 3
			start = pos
			continue
		}
		pos++
	}
	if start < hi {
		out = append(out, span{start, hi})
	}
	return out
}

// preTokenize splits text into words (re-encoded as UTF-8, llama.cpp style).
func (p *preTokenizer) split(text string) []string {
	st := newScanText(text)
	spans := []span{{0, len(st.cpts)}}
	var next []span
	for _, pass := range p.passes {
		next = next[:0]
		for _, sp := range spans {
			if sp.hi > sp.lo {
				next = pass(st, sp.lo, sp.hi, next)
			}
		}
		spans, next = next, spans
	}
	words := make([]string, 0, len(spans))
	var buf []byte
	for _, sp := range spans {
		buf = buf[:0]
		for _, c := range st.cpts[sp.lo:sp.hi] {
			buf = appendCpt(buf, c)
		}
		words = append(words, string(buf))
	}
	return words
}
