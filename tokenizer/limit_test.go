package tokenizer

import (
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestEncodeLimit: under its limit EncodeLimit gives Encode's ids; one token over, it
// refuses; and MaxTokenBytes is a true bound (no text encodes to fewer tokens than its
// length over it), so the refusal by length alone never refuses a text that fits.
func TestEncodeLimit(t *testing.T) {
	for _, name := range vocabOrder {
		t.Run(name, func(t *testing.T) {
			tk, v := loadVocab(t, name)
			if tk.MaxTokenBytes() <= 0 {
				t.Fatalf("MaxTokenBytes = %d: every fixture vocabulary covers all bytes", tk.MaxTokenBytes())
			}
			texts := []string{strings.Repeat(" ", 300), strings.Repeat("ab", 500), strings.Repeat("\u00e9\u4e2d", 100)}
			for _, r := range v.Results {
				texts = append(texts, r.Text)
			}
			for _, text := range texts {
				for _, special := range []bool{false, true} {
					want := tk.Encode(text, true, special)
					if len(want) < len(text)/tk.MaxTokenBytes() {
						t.Fatalf("%q: %d tokens, fewer than %d bytes / MaxTokenBytes %d", text, len(want), len(text), tk.MaxTokenBytes())
					}
					got, ok := tk.EncodeLimit(text, true, special, len(want))
					if !ok || !slices.Equal(got, want) {
						t.Fatalf("%q limit %d: %v %v, want %v", text, len(want), got, ok, want)
					}
					if len(want) > 1 {
						if got, ok := tk.EncodeLimit(text, true, special, len(want)-1); ok {
							t.Fatalf("%q limit %d: accepted %d tokens", text, len(want)-1, len(got))
						}
					}
				}
			}
		})
	}
}

// TestEncodeLimitBoundsWork: refusing a 32 MB prompt for a 2048-token context allocates
// next to nothing (Encode of it allocated gigabytes inside a server).
func TestEncodeLimitBoundsWork(t *testing.T) {
	tk := demoTokenizer(t)
	text := strings.Repeat("All work and no play makes Jack a dull boy. ", 32<<20/44)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, ok := tk.EncodeLimit(text, true, true, 2048)
	runtime.ReadMemStats(&after)
	if ok {
		t.Fatal("a 32 MB text fit in 2048 tokens")
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("refusing it allocated %d bytes", n)
	}
	// Just under the length bound, the work is bounded by the limit too.
	text = text[:2048*tk.MaxTokenBytes()]
	runtime.ReadMemStats(&before)
	_, ok = tk.EncodeLimit(text, true, true, 2048)
	runtime.ReadMemStats(&after)
	if ok {
		t.Fatalf("a %d-byte text of the byte-level vocabulary fit in 2048 tokens", len(text))
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64*uint64(len(text)) {
		t.Fatalf("tokenizing %d bytes allocated %d bytes", len(text), n)
	}
}
