package live

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tandem/router"
)

func TestCardStore(t *testing.T) {
	dir := t.TempDir()
	s := newCardStore(dir)
	if cards, err := s.load(); err != nil || len(cards) != 0 {
		t.Fatalf("empty store: %v, %v", cards, err)
	}
	a := router.Card{Model: "a", HashVersion: 1, BlockSize: 16, Salt: 7, KVBlocks: 900}
	b := router.Card{Model: "b", HashVersion: 1, BlockSize: 32, Salt: 9}
	for _, c := range []router.Card{a, b} {
		if err := s.add(c); err != nil {
			t.Fatal(err)
		}
	}
	cards, err := newCardStore(dir).load()
	if err != nil {
		t.Fatal(err)
	}
	a.KVBlocks = 0 // per worker, not remembered
	if cards["a"] != a || cards["b"] != b || len(cards) != 2 {
		t.Fatalf("reloaded %+v", cards)
	}
	for name, body := range map[string]string{
		"not JSON":      "{",
		"no block size": `[{"Model":"a","BlockSize":0}]`,
		"no model":      `[{"BlockSize":16}]`,
	} {
		if err := os.WriteFile(filepath.Join(dir, cardsFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.load(); err == nil || !strings.Contains(err.Error(), "remove it") {
			t.Errorf("%s: %v, want an error that says how to recover", name, err)
		}
	}
}
