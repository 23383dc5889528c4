package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// byteToUnicode is GPT-2's bytes_to_unicode table: byte b is written as the
// UTF-8 string byteToUnicode[b] in byte-level BPE vocabularies.
var byteToUnicode [256]string

// unicodeByte inverts byteToUnicode: code point r stands for byte
// unicodeByte[r]-1, or for none where that is 0 (all are below 512).
var unicodeByte [512]uint16

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		var r rune
		if (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			r = rune(b)
		} else {
			r = rune(256 + n)
			n++
		}
		byteToUnicode[b] = string(r)
		byteSpelling[b].n = uint8(copy(byteSpelling[b].b[:], byteToUnicode[b]))
		unicodeByte[r] = uint16(b) + 1
	}
}

// ByteLevelVocab returns the 256 byte-level BPE token strings (GPT-2's
// bytes_to_unicode mapping) in byte order.
func ByteLevelVocab() []string {
	out := make([]string, 256)
	copy(out, byteToUnicode[:])
	return out
}

// appendByteLevel maps a byte-level token text back to bytes, like llama.cpp's
// llama_decode_text (unmappable code points become an [UNK_BYTE_...] marker),
// and appends them to out.
func appendByteLevel(out []byte, text string) []byte {
	for i := 0; i < len(text); {
		c, n := decodeCpt(text, i)
		i += n
		if c >= 0 && c < rune(len(unicodeByte)) && unicodeByte[c] != 0 {
			out = append(out, byte(unicodeByte[c]-1))
			continue
		}
		var enc [4]byte
		out = append(out, "[UNK_BYTE_0x"...)
		for _, e := range appendCpt(enc[:0], c) {
			const hex = "0123456789abcdef"
			out = append(out, hex[e>>4], hex[e&15])
		}
		out = append(out, text...)
		out = append(out, ']')
	}
	return out
}

// utf8Len is llama.cpp's unicode_len_utf8: the sequence length implied by a lead byte.
func utf8Len(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// decodeCpt decodes one code point at s[i] the way llama.cpp does: it checks
// only the continuation bit patterns, and an invalid sequence yields U+FFFD
// consuming one byte.
func decodeCpt(s string, i int) (rune, int) {
	b0 := s[i]
	if b0 < 0x80 {
		return rune(b0), 1
	}
	cont := func(k int) bool { return i+k < len(s) && s[i+k]&0xC0 == 0x80 }
	switch {
	case b0&0x40 == 0:
		return utf8.RuneError, 1
	case b0&0x20 == 0:
		if cont(1) {
			return rune(b0&0x1F)<<6 | rune(s[i+1]&0x3F), 2
		}
	case b0&0x10 == 0:
		if cont(1) && cont(2) {
			return rune(b0&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F), 3
		}
	case b0&0x08 == 0:
		if cont(1) && cont(2) && cont(3) {
			return rune(b0&0x07)<<18 | rune(s[i+1]&0x3F)<<12 | rune(s[i+2]&0x3F)<<6 | rune(s[i+3]&0x3F), 4
		}
	}
	return utf8.RuneError, 1
}

// appendCpt encodes a code point like llama.cpp's unicode_cpt_to_utf8 (surrogates
// are encoded as-is; values past U+10FFFF, which llama.cpp rejects, become U+FFFD).
func appendCpt(dst []byte, c rune) []byte {
	switch {
	case c < 0:
		return append(dst, "\uFFFD"...)
	case c <= 0x7F:
		return append(dst, byte(c))
	case c <= 0x7FF:
		return append(dst, 0xC0|byte(c>>6), 0x80|byte(c&0x3F))
	case c <= 0xFFFF:
		return append(dst, 0xE0|byte(c>>12), 0x80|byte((c>>6)&0x3F), 0x80|byte(c&0x3F))
	case c <= 0x10FFFF:
		return append(dst, 0xF0|byte(c>>18), 0x80|byte((c>>12)&0x3F), 0x80|byte((c>>6)&0x3F), 0x80|byte(c&0x3F))
	}
	return append(dst, "\uFFFD"...)
}

// Code point classes used by the pre-tokenizers.
const (
	flagLetter uint8 = 1 << iota
	flagNumber
	flagSpace
	flagPunct // \p{P} or one of $+<=>^~| (llama.cpp's default BPE pre-tokenizer)
	flagValid // inside the current fragment
)

var asciiFlags [128]uint8

func init() {
	for c := 0; c < 128; c++ {
		asciiFlags[c] = slowFlags(rune(c))
	}
}

func slowFlags(c rune) uint8 {
	f := flagValid
	switch {
	case unicode.Is(unicode.White_Space, c):
		f |= flagSpace
	case unicode.IsLetter(c):
		f |= flagLetter
	case unicode.IsNumber(c):
		f |= flagNumber
	}
	if unicode.IsPunct(c) {
		f |= flagPunct
	}
	switch c {
	case '$', '+', '<', '=', '>', '^', '~', '|':
		f |= flagPunct
	}
	return f
}

func cptFlags(c rune) uint8 {
	if c >= 0 && c < 128 {
		return asciiFlags[c]
	}
	if c > unicode.MaxRune {
		return flagValid
	}
	return slowFlags(c)
}
