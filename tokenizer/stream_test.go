package tokenizer

import (
	"testing"
	"unicode/utf8"
)

func streamAll(tk *Tokenizer, ids []int32) string {
	d := tk.NewStreamDecoder()
	var s string
	for _, id := range ids {
		chunk := d.Add(id)
		if !utf8.ValidString(chunk) {
			panic("stream decoder emitted invalid UTF-8")
		}
		s += chunk
	}
	return s + d.Flush()
}

func TestStreamDecoderGolden(t *testing.T) {
	for _, name := range vocabOrder {
		t.Run(name, func(t *testing.T) {
			tk, v := loadVocab(t, name)
			for _, r := range v.Results {
				want := string([]rune(tk.Decode(r.IDs)))
				if got := streamAll(tk, r.IDs); got != want {
					t.Errorf("%q: stream %q, Decode %q", r.Text, got, want)
				}
			}
		})
	}
}

func TestStreamDecoderByteFallback(t *testing.T) {
	for _, name := range []string{"tok512", "llama-spm", "llama-bpe", "qwen2"} {
		t.Run(name, func(t *testing.T) {
			tk, _ := loadVocab(t, name)
			text := "a🦙b 👨\u200d👩\u200d👧 日本語 é"
			ids := tk.Encode(text, false, false)
			d := tk.NewStreamDecoder()
			var got string
			held := 0
			for _, id := range ids {
				chunk := d.Add(id)
				if !utf8.ValidString(chunk) {
					t.Fatalf("invalid UTF-8 chunk %q", chunk)
				}
				if chunk == "" {
					held++
				}
				got += chunk
			}
			got += d.Flush()
			if got != tk.Decode(ids) {
				t.Errorf("stream %q != Decode %q", got, tk.Decode(ids))
			}
			want := text
			if tk.addSpacePrefix {
				want = text // the prefix space added by Encode is removed again
			}
			if got != want {
				t.Errorf("round trip %q != %q", got, want)
			}
			if name == "tok512" && held == 0 {
				t.Errorf("expected byte-fallback tokens to be held back")
			}
		})
	}
}

func TestStreamDecoderInvalid(t *testing.T) {
	tk, _ := loadVocab(t, "tok512")
	// <0xF0><0x9F> then a plain token: the incomplete sequence can never finish.
	f0, _ := tk.TokenID("<0xF0>")
	x9f, _ := tk.TokenID("<0x9F>")
	a := tk.Encode("a", false, false)
	d := tk.NewStreamDecoder()
	if s := d.Add(f0) + d.Add(x9f); s != "" {
		t.Fatalf("incomplete sequence emitted %q", s)
	}
	s := d.Add(a[0])
	s += d.Flush()
	if s != "\uFFFD\uFFFD a" { // "a" encodes as "▁a"
		t.Errorf("got %q", s)
	}
	// Flush of a dangling lead byte.
	d = tk.NewStreamDecoder()
	s = d.Add(a[0]) + d.Add(f0)
	s += d.Flush()
	if s != "a\uFFFD" {
		t.Errorf("got %q", s)
	}
}

func TestStreamDecoderCleanSpaces(t *testing.T) {
	tk, _ := loadVocab(t, "gpt-2")
	for _, text := range []string{"x != y , z ?", "it 's a ' quote ' and they 're here", "a ' b", " ' ", "don 't", "we 've  , ok .", "'''  ''' ' ' '"} {
		ids := tk.Encode(text, false, false)
		if got, want := streamAll(tk, ids), tk.Decode(ids); got != want {
			t.Errorf("%q: stream %q != Decode %q", text, got, want)
		}
	}
}
