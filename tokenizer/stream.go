package tokenizer

import "unicode/utf8"

// StreamDecoder turns generated token ids into text incrementally. It never
// returns broken UTF-8: an incomplete multi-byte sequence is held back until a
// later token completes it, and bytes that can never be valid become U+FFFD.
// For vocabs where llama.cpp cleans up spaces on detokenize, the few bytes the
// clean-up could still change are held back too, so the concatenation of all
// outputs (including Flush) equals Decode of the same ids whenever that is valid UTF-8.
type StreamDecoder struct {
	t     *Tokenizer
	raw   bool // no clean-up of spaces (NewRawStreamDecoder)
	first bool
	pend  []byte // raw bytes not yet cleaned (clean-up vocabs only)
	ctx   []byte // up to 3 raw bytes preceding pend
	ready []byte // decoded bytes not yet returned
}

// NewStreamDecoder returns a decoder positioned at the start of a sequence.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, first: true}
}

// NewRawStreamDecoder returns a decoder that leaves spaces as the tokens have them even
// where Decode cleans them up, so that its text is exactly the tokens' bytes: what a
// grammar constrained (a clean-up would change a JSON string's content).
func (t *Tokenizer) NewRawStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, first: true, raw: true}
}

// Add appends one token and returns the text that is now final.
func (d *StreamDecoder) Add(id int32) string {
	p := d.t.Piece(id)
	if d.first {
		d.first = false
		if d.t.addSpacePrefix && len(p) > 0 && p[0] == ' ' {
			p = p[1:]
		}
	}
	if !d.t.cleanSpaces || d.raw {
		d.ready = append(d.ready, p...)
		return d.emit(false)
	}
	d.pend = append(d.pend, p...)
	if c := d.safeSplit(); c > 0 {
		d.moveToReady(c)
	}
	return d.emit(false)
}

// Flush returns everything still held back (invalid bytes as U+FFFD) and resets
// the decoder for a new sequence.
func (d *StreamDecoder) Flush() string {
	if len(d.pend) > 0 {
		d.moveToReady(len(d.pend))
	}
	s := d.emit(true)
	d.first = true
	d.ctx = d.ctx[:0]
	return s
}

func (d *StreamDecoder) moveToReady(c int) {
	seg := append([]byte(nil), d.pend[:c]...)
	d.ctx = append(d.ctx, d.pend[:c]...)
	if len(d.ctx) > 3 {
		d.ctx = append(d.ctx[:0], d.ctx[len(d.ctx)-3:]...)
	}
	d.ready = append(d.ready, cleanSpaces(seg)...)
	d.pend = append(d.pend[:0], d.pend[c:]...)
}

// safeSplit returns the largest c such that cleaning pend[:c] and pend[c:]
// separately equals cleaning them together: no clean-up pattern (" ?", " ' ",
// " 's", " 're", ...) can span position c.
func (d *StreamDecoder) safeSplit() int {
	at := func(i int) byte { // raw byte at index i of ctx+pend
		if i < len(d.ctx) {
			return d.ctx[i]
		}
		return d.pend[i-len(d.ctx)]
	}
	base := len(d.ctx)
	for c := base + len(d.pend); c > base; c-- {
		if at(c-1) == ' ' {
			continue
		}
		if c >= 2 && at(c-2) == ' ' && at(c-1) == '\'' {
			continue
		}
		if c >= 3 && at(c-3) == ' ' && at(c-2) == '\'' {
			continue
		}
		return c - base
	}
	return 0
}

// emit returns the longest prefix of ready that is complete UTF-8, replacing
// invalid bytes with U+FFFD. Unless final, an incomplete trailing sequence stays.
func (d *StreamDecoder) emit(final bool) string {
	var out []byte
	i := 0
	for i < len(d.ready) {
		b := d.ready[i]
		if b < utf8.RuneSelf {
			out = append(out, b)
			i++
			continue
		}
		if !final && !utf8.FullRune(d.ready[i:]) {
			break
		}
		r, n := utf8.DecodeRune(d.ready[i:])
		if r == utf8.RuneError && n <= 1 {
			out = append(out, "\uFFFD"...)
			i++
			continue
		}
		out = append(out, d.ready[i:i+n]...)
		i += n
	}
	d.ready = append(d.ready[:0], d.ready[i:]...)
	return string(out)
}
