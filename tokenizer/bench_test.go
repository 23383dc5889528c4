package tokenizer

import (
	"strings"
	"testing"
)

const benchText = `The quick brown fox jumps over the lazy dog. In the beginning, there was a small village
nestled between two mountains, where people lived simple lives and told stories by the fire every night.
Children played in the fields while their parents worked; the harvest of 2023 was the best in 15 years!
"We've never seen anything like it," said Maria, the village elder, who'd lived there for 87 years.
Scientists from the university (located 120 km away) came to study the soil, the water, and the weather.
They measured temperatures of 23.5 degrees, rainfall of 1,200 mm, and humidity around 65%. Their report,
published on 2024-03-15, concluded that the combination of factors was unique. Isn't it remarkable how
nature works? The villagers weren't surprised; they'd always known their valley was special. Tourists
began arriving soon after, and the local economy grew quickly.`

func BenchmarkEncode(b *testing.B) {
	text := strings.Repeat(benchText, 2)[:1024]
	for _, name := range []string{"llama-bpe", "llama-spm", "qwen2", "gpt-2", "tok512"} {
		for _, cold := range []bool{false, true} {
			sub := name
			if cold {
				sub += "/cold" // BPE word cache emptied before every Encode
			}
			b.Run(sub, func(b *testing.B) {
				tk, _ := loadVocab(b, name)
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				var n int
				for b.Loop() {
					if cold {
						tk.wordCache.clear()
					}
					n = len(tk.Encode(text, true, false))
				}
				b.ReportMetric(float64(n), "tokens")
			})
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	tk, _ := loadVocab(b, "llama-bpe")
	ids := tk.Encode(benchText, false, false)
	b.ReportAllocs()
	for b.Loop() {
		_ = tk.Decode(ids)
	}
}

func TestConcurrentEncode(t *testing.T) {
	tk, _ := loadVocab(t, "qwen2")
	want := tk.Encode(benchText, true, true)
	done := make(chan []int32)
	for g := 0; g < 8; g++ {
		go func() {
			var ids []int32
			for i := 0; i < 20; i++ {
				ids = tk.Encode(benchText, true, true)
			}
			done <- ids
		}()
	}
	for g := 0; g < 8; g++ {
		if got := <-done; len(got) != len(want) {
			t.Fatalf("concurrent Encode gave %d tokens, want %d", len(got), len(want))
		}
	}
}
