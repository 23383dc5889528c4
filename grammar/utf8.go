package grammar

import "unicode/utf8"

// byteRange is an inclusive range of byte values.
type byteRange struct{ lo, hi byte }

// utf8Sequences calls emit with sequences of byte ranges whose concatenations are
// exactly the UTF-8 encodings of the code points in [lo, hi] (surrogates excluded).
// Each sequence matches a set of code points whose encodings have the same length and
// whose bytes vary independently within each range (the method of RE2 and of Rust's
// utf8-ranges).
func utf8Sequences(lo, hi rune, emit func([]byteRange)) {
	if lo > hi {
		return
	}
	// No surrogates.
	if lo <= 0xDFFF && hi >= 0xD800 {
		utf8Sequences(lo, min(hi, 0xD7FF), emit)
		utf8Sequences(max(lo, 0xE000), hi, emit)
		return
	}
	// One encoding length per piece.
	for _, edge := range [...]rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= edge && hi > edge {
			utf8Sequences(lo, edge, emit)
			utf8Sequences(edge+1, hi, emit)
			return
		}
	}
	if hi <= 0x7F {
		emit([]byteRange{{byte(lo), byte(hi)}})
		return
	}
	// Split until, for every continuation byte position, the range covers either one
	// value of the bits above it or all values of the bits below it.
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1 // the low i continuation bytes' bits
		if lo&^m != hi&^m {
			if lo&m != 0 {
				utf8Sequences(lo, lo|m, emit)
				utf8Sequences((lo|m)+1, hi, emit)
				return
			}
			if hi&m != m {
				utf8Sequences(lo, (hi&^m)-1, emit)
				utf8Sequences(hi&^m, hi, emit)
				return
			}
		}
	}
	var a, b [utf8.UTFMax]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	seq := make([]byteRange, n)
	for i := range n {
		seq[i] = byteRange{a[i], b[i]}
	}
	emit(seq)
}
