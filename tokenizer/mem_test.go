package tokenizer

import (
	"path/filepath"
	"runtime"
	"testing"

	"tandem/gguf"
	"tandem/internal/fixtures"
)

// retainedHeap opens a fixture GGUF, builds its tokenizer, drops the file
// and its metadata, and returns the heap that stays reachable because of the
// tokenizer (HeapAlloc after minus before, each after a collection).
func retainedHeap(t testing.TB, file string) (uint64, *Tokenizer) {
	t.Helper()
	path := fixtures.Model(t, file)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	f.ReleaseMetadata()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(tk)
	if after.HeapAlloc < before.HeapAlloc {
		return 0, tk
	}
	return after.HeapAlloc - before.HeapAlloc, tk
}

// TestRetainedHeap holds what a large vocabulary's tokenizer keeps on the
// heap for the life of a model under a bound (about 25% over what it took
// when the bound was set), so that it cannot silently grow back.
func TestRetainedHeap(t *testing.T) {
	for _, tc := range []struct {
		file  string
		bound uint64
	}{
		// Qwen2: 151,936 tokens, 151,387 merges; 3.68 MiB (15.7 MiB when
		// the texts and merges were strings and maps keyed by them).
		{"rand-qwen2-qwen2vocab-f32.gguf", 4_600 << 10},
		// Llama 3: 128,256 tokens, 280,147 merges; 4.66 MiB (21.0 MiB).
		{"rand-llama-llama3vocab-f32.gguf", 5_850 << 10},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, tk := retainedHeap(t, tc.file)
			t.Logf("%s: %d tokens, %.2f MiB retained", tc.file, tk.VocabSize(), float64(got)/(1<<20))
			if got > tc.bound {
				t.Errorf("tokenizer keeps %.2f MiB of heap, bound %.2f MiB", float64(got)/(1<<20), float64(tc.bound)/(1<<20))
			}
			if ids := tk.Encode("Hello world", false, false); len(ids) == 0 {
				t.Error("the measured tokenizer encodes nothing")
			}
		})
	}
}

// BenchmarkFromGGUF is the tokenizer's share of a model load: building it
// from metadata already decoded.
func BenchmarkFromGGUF(b *testing.B) {
	for _, name := range []string{"qwen2", "llama-bpe"} {
		b.Run(name, func(b *testing.B) {
			g := loadGolden(b)
			f, err := gguf.Open(filepath.Join(fixturesDir(b), "models", g.Vocabs[name].File))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := FromGGUF(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
