package tokenizer

import (
	"bytes"
	"slices"
	"testing"

	"tandem/gguf"
	"tandem/internal/fixtures"
)

// TestCompactTexts holds a compact tokenizer (texts spelled from pieces) to
// the same tokenizer before compaction: every text, piece and attribute,
// and every text's id.
func TestCompactTexts(t *testing.T) {
	check := func(t *testing.T, full, tk *Tokenizer, maxKept int) {
		t.Helper()
		if full.compact || !tk.compact {
			t.Fatalf("compact: %v and %v", full.compact, tk.compact)
		}
		if len(tk.kept) > maxKept {
			t.Errorf("%d texts kept, want at most %d", len(tk.kept), maxKept)
		}
		for id := range int32(full.VocabSize()) {
			want, got := full.TokenText(id), tk.TokenText(id)
			if got != want || !bytes.Equal(tk.Piece(id), full.Piece(id)) || tk.attrs[id]&^attrKeptText != full.attrs[id] {
				t.Fatalf("id %d: text %q, piece %q, attrs %#x; want %q, %q, %#x", id, got, tk.Piece(id), tk.attrs[id], want, full.Piece(id), full.attrs[id])
			}
			if back, ok := tk.TokenID(want); !ok || back != id {
				t.Fatalf("TokenID(%q) = %d, %v; want %d", want, back, ok, id)
			}
		}
		for _, s := range []string{"", "Ġ", "ĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠ", " the", "\xff", "é", "x\u4e00"} {
			wantID, wantOK := full.TokenID(s)
			if id, ok := tk.TokenID(s); id != wantID || ok != wantOK {
				t.Errorf("TokenID(%q) = %d, %v; want %d, %v", s, id, ok, wantID, wantOK)
			}
		}
	}
	t.Run("fixtures", func(t *testing.T) {
		for _, file := range []string{"rand-qwen2-qwen2vocab-f32.gguf", "rand-llama-llama3vocab-f32.gguf", "vocab-gpt-2.gguf"} {
			f, err := gguf.Open(fixtures.Model(t, file))
			if err != nil {
				t.Fatal(err)
			}
			full, err := fromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			tk, err := FromGGUF(f)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			check(t, full, tk, 300)
		}
	})
	t.Run("texts that spell no piece", func(t *testing.T) {
		md := demoMetadata(true)
		tokens := slices.Clone(md["tokenizer.ggml.tokens"].([]string))
		types := slices.Clone(md["tokenizer.ggml.token_type"].([]int32))
		// A code point outside the byte alphabet, a user-defined token, a
		// byte token and an unused one keep their texts.
		tokens = append(tokens, "x\u4e00", "Ġthe", "user text", "<0x41>", "[PAD1]")
		types = append(types, TokenTypeNormal, TokenTypeNormal, TokenTypeUserDefined, TokenTypeByte, TokenTypeUnused)
		md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"] = tokens, types
		full, err := fromGGUF(md)
		if err != nil {
			t.Fatal(err)
		}
		tk, err := FromGGUF(md)
		if err != nil {
			t.Fatal(err)
		}
		check(t, full, tk, 9)
		if tk.attrs[len(tokens)-4]&attrKeptText != 0 {
			t.Error("Ġthe is kept, not spelled from its piece")
		}
		if got := tk.Encode("x the", false, false); len(got) == 0 {
			t.Error("no tokens")
		}
	})
}
