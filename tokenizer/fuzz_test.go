package tokenizer

import (
	"os"
	"path/filepath"
	"tandem/internal/fixtures"
	"testing"
	"unicode/utf8"
)

// fixtureTokenizer returns a fixture vocab's tokenizer, or nil when fixtures are absent.
func fixtureTokenizer(name string) *Tokenizer {
	dir := fixtures.Root()
	if _, err := os.Stat(filepath.Join(dir, "golden", "tokenizer.golden.json")); err != nil {
		return nil
	}
	var tk *Tokenizer
	t := &testing.T{}
	func() {
		defer func() { _ = recover() }()
		tk, _ = loadVocab(t, name)
	}()
	return tk
}

var fuzzSeeds = []string{"", " ", "Hello world", "  \n\n  \t ", "I'm IT'S they'll", "12345678 3.14", "🦙👨\u200d👩\u200d👧",
	"<|im_start|>user\nhi<|im_end|>\n", "<s> </s>", "<|begin_of_text|>x", "e\u0301 ﬁ a\u00a0b a\u200bb", "\xff\xfe\xc0\x80", "\xed\xa0\x80",
	"x != y , it 's", "日本語のテキスト", "\r\n\r\n", "'''' 'S 'Ll"}

func FuzzEncode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	demo := demoTokenizer(f)
	var vocabs []*Tokenizer
	for _, name := range vocabOrder {
		if tk := fixtureTokenizer(name); tk != nil {
			vocabs = append(vocabs, tk)
		}
	}
	qwen := fixtureTokenizer("qwen2")
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return
		}
		// Byte-level BPE is lossless: the pieces reproduce the input exactly.
		ids := demo.Encode(s, false, false)
		if utf8.ValidString(s) {
			var got []byte
			for _, id := range ids {
				got = append(got, demo.Piece(id)...)
			}
			if string(got) != s {
				t.Fatalf("demo pieces %q != %q", got, s)
			}
		}
		for _, tk := range vocabs {
			for _, ps := range []bool{false, true} {
				ids := tk.Encode(s, true, ps)
				for _, id := range ids {
					if id < 0 || int(id) >= tk.VocabSize() {
						t.Fatalf("id %d out of range", id)
					}
				}
				_ = tk.Decode(ids)
			}
		}
		// qwen2 has no space clean-up, so Decode(Encode(s)) == s for valid UTF-8.
		if qwen != nil && utf8.ValidString(s) {
			if got := qwen.Decode(qwen.Encode(s, false, false)); got != s {
				t.Fatalf("qwen2 round trip %q != %q", got, s)
			}
		}
	})
}

func FuzzFromHF(f *testing.F) {
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"},"added_tokens":[{"id":4,"content":"<|x|>","special":true}]}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3},"merges":[["a","b"]]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"` + jsonEscape(hfPatternLlama3) + `"}},{"type":"ByteLevel","use_regex":false}]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","byte_fallback":true,"unk_token":"<unk>","vocab":{"<unk>":0,"<0x41>":1,"▁":2,"a":3,"▁a":4},"merges":["▁ a"]},"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"}]}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":5},"merges":[1]}}`))
	cfg := []byte(`{"bos_token":"a","eos_token":{"content":"<|x|>"},"chat_template":"{{ messages[0].content }}"}`)
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := fromHFBytes(data, cfg, []byte(`{"eos_token_id":[0,1,99999999]}`), 0)
		if err != nil {
			return
		}
		for _, s := range []string{"", "ab a", "<|x|> \xff🦙"} {
			ids := tk.Encode(s, true, true)
			_ = tk.Decode(ids)
			_ = streamAll(tk, ids)
		}
		_, _ = tk.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, true)
	})
}

func jsonEscape(s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\', '"':
			out = append(out, '\\', s[i])
		default:
			out = append(out, s[i])
		}
	}
	return string(out)
}

// FuzzStreamDecoder feeds arbitrary byte tokens (and specials) through the stream
// decoder: every chunk must be valid UTF-8 and the whole must equal Decode.
func FuzzStreamDecoder(f *testing.F) {
	f.Add([]byte("x != y , it 's a ' b"))
	f.Add([]byte("\xf0\x9f\xa6\x99 \xe6\x97\xa5\xff"))
	f.Add([]byte(" 're 've 'm ' ' '"))
	demo := demoTokenizer(f)
	tok512 := fixtureTokenizer("tok512")
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(tk *Tokenizer, ids []int32) {
			want := string([]rune(tk.Decode(ids)))
			if got := streamAll(tk, ids); got != want {
				t.Fatalf("stream %q != Decode %q (ids %v)", got, want, ids)
			}
		}
		ids := make([]int32, len(data))
		for i, b := range data {
			ids[i] = demo.byteTok[b]
			if b == 0xFF {
				ids[i] = 256 + int32(i%4)
			}
		}
		check(demo, ids)
		if tok512 != nil {
			ids := make([]int32, len(data))
			for i, b := range data {
				ids[i] = int32(b) * 2 % int32(tok512.VocabSize())
				if b&1 == 1 {
					ids[i] = tok512.byteTok[b]
				}
			}
			check(tok512, ids)
		}
	})
}
