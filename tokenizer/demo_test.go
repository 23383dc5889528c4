package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// demoMetadata is the built-in demo model's tokenizer metadata (see ByteLevelVocab).
func demoMetadata(withIDs bool) MapMetadata {
	tokens := append(ByteLevelVocab(), "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
	types := make([]int32, len(tokens))
	for i := range types {
		types[i] = TokenTypeNormal
		if i >= 256 {
			types[i] = TokenTypeControl
		}
	}
	md := MapMetadata{
		"tokenizer.ggml.model":      "gpt2",
		"tokenizer.ggml.pre":        "gpt2",
		"tokenizer.ggml.tokens":     tokens,
		"tokenizer.ggml.token_type": types,
		"tokenizer.ggml.merges":     []string{},
	}
	if withIDs {
		md["tokenizer.ggml.bos_token_id"] = uint32(256)
		md["tokenizer.ggml.eos_token_id"] = uint32(257)
	}
	return md
}

func demoTokenizer(t testing.TB) *Tokenizer {
	tk, err := FromGGUF(demoMetadata(true))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestByteLevelVocab(t *testing.T) {
	v := ByteLevelVocab()
	if len(v) != 256 || v['A'] != "A" || v[' '] != "Ġ" || v['\n'] != "Ċ" || v[0] != "Ā" || v[0xAD] != "Ń" {
		t.Fatalf("unexpected byte-level table: %q %q %q %q", v[' '], v['\n'], v[0], v[0xAD])
	}
	seen := map[string]bool{}
	for _, s := range v {
		if seen[s] {
			t.Fatalf("duplicate %q", s)
		}
		seen[s] = true
	}
}

func TestDemoVocab(t *testing.T) {
	tk := demoTokenizer(t)
	text := "Hi, wörld! 🦙\n"
	ids := tk.Encode(text, false, false)
	if len(ids) != len(text) {
		t.Fatalf("got %d tokens for %d bytes", len(ids), len(text))
	}
	for i := range ids {
		if ids[i] != int32(text[i]) && tk.TokenText(ids[i]) != byteToUnicode[text[i]] {
			t.Fatalf("token %d = %d, want byte %#x", i, ids[i], text[i])
		}
	}
	if got := tk.Decode(ids); got != text {
		t.Errorf("Decode = %q", got)
	}
	got := tk.Encode("<|im_start|>user\nhi<|im_end|>", true, true)
	want := append([]int32{258}, tk.Encode("user\nhi", false, false)...)
	want = append(want, 259)
	if !slices.Equal(got, want) {
		t.Errorf("parse special: got %v want %v", got, want)
	}
	if tk.AddBOS() || tk.BOS() != 256 || tk.EOS() != 257 {
		t.Errorf("add_bos/bos/eos = %v/%d/%d", tk.AddBOS(), tk.BOS(), tk.EOS())
	}
	if !tk.IsEOG(257) || !tk.IsEOG(259) || tk.IsEOG(256) || tk.IsEOG(258) {
		t.Errorf("EOG set = %v", tk.EOGTokens())
	}
	// Without explicit ids llama.cpp's gpt2 defaults (11) apply: warn-worthy but valid.
	tk2, err := FromGGUF(demoMetadata(false))
	if err != nil {
		t.Fatal(err)
	}
	if tk2.EOS() != 11 {
		t.Errorf("default eos = %d", tk2.EOS())
	}
}

func TestFromGGUFErrors(t *testing.T) {
	md := demoMetadata(true)
	md["tokenizer.ggml.pre"] = "no-such-pre"
	if _, err := FromGGUF(md); err == nil || !strings.Contains(err.Error(), "no-such-pre") {
		t.Errorf("unknown pre: err = %v", err)
	}
	md = demoMetadata(true)
	md["tokenizer.ggml.model"] = "t5"
	if _, err := FromGGUF(md); err == nil || !strings.Contains(err.Error(), "t5") {
		t.Errorf("unknown model: err = %v", err)
	}
	md = demoMetadata(true)
	delete(md, "tokenizer.ggml.merges")
	if _, err := FromGGUF(md); err == nil {
		t.Error("missing merges: expected an error")
	}
	md = demoMetadata(true)
	md["tokenizer.ggml.tokens"] = []string{"a", "a"}
	md["tokenizer.ggml.token_type"] = []int32{1, 1}
	if _, err := FromGGUF(md); err == nil {
		t.Error("duplicate tokens: expected an error")
	}
}
