package tokenizer

import (
	"slices"
	"strconv"
	"sync"
	"testing"
)

func TestWordCacheGenerations(t *testing.T) {
	var c wordCache
	ids := func(i int) []int32 { return []int32{int32(i), int32(i) + 1} }
	has := func(i int) bool {
		got, ok := c.load(strconv.Itoa(i))
		if ok && !slices.Equal(got, ids(i)) {
			t.Fatalf("word %d: ids %v, want %v", i, got, ids(i))
		}
		return ok
	}
	for i := range wordCacheGen {
		c.store(strconv.Itoa(i), ids(i))
	}
	if !has(0) || !has(wordCacheGen-1) || has(wordCacheGen) {
		t.Fatal("a full generation lost words or found one never stored")
	}
	// A second generation makes the first the old one: words of both are
	// found, and word 0, found in the old one, is stored in the current one
	// again.
	for i := wordCacheGen; i < 2*wordCacheGen; i++ {
		c.store(strconv.Itoa(i), ids(i))
	}
	if !has(0) || !has(2*wordCacheGen-1) {
		t.Error("the words of the current generation (and one in use) were dropped")
	}
	for i := 2 * wordCacheGen; i < 3*wordCacheGen; i++ {
		c.store(strconv.Itoa(i), ids(i))
	}
	if has(1) {
		t.Error("a word unused for two generations is still there")
	}
	c.clear()
	if has(0) || has(3*wordCacheGen-1) {
		t.Error("clear left words")
	}
}

// TestWordCacheConcurrent stores and loads from several goroutines across
// generation changes (run with -race): every word found has its own ids.
func TestWordCacheConcurrent(t *testing.T) {
	var c wordCache
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 * wordCacheGen {
				w := strconv.Itoa((i*7 + g) % (2 * wordCacheGen))
				if got, ok := c.load(w); ok {
					if want, _ := strconv.Atoi(w); len(got) != 1 || got[0] != int32(want) {
						t.Errorf("word %s: ids %v", w, got)
						return
					}
					continue
				}
				n, _ := strconv.Atoi(w)
				c.store(w, []int32{int32(n)})
			}
		}()
	}
	wg.Wait()
}
