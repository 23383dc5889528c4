package router

import (
	"errors"
	"strings"
	"testing"

	"tandem/kvcache"
)

func TestCheckCard(t *testing.T) {
	other := kvcache.Salt("Qwen/Qwen3-0.6B", "tenant-b", "")
	tests := []struct {
		name   string
		change func(*Card)
		want   []string // substrings of the error; nil: accepted
	}{
		{"same", func(*Card) {}, nil},
		{"capacity may differ", func(c *Card) { c.KVBlocks = 5 }, nil},
		{"block size", func(c *Card) { c.BlockSize = 32 }, []string{"block size 32", "use 16"}},
		{"salt", func(c *Card) { c.Salt = other }, []string{"salt 0x", "use 0x7d38246f2d3ef01c"}},
		{"hash version", func(c *Card) { c.HashVersion = 2 }, []string{"hash version 2", "use 1"}},
		{"model", func(c *Card) { c.Model = "llama" }, []string{`model "llama" is not the pool's model "Qwen/Qwen3-0.6B"`}},
		{"no block size", func(c *Card) { c.BlockSize = 0 }, []string{"block size 0 is not positive"}},
		{"both", func(c *Card) { c.BlockSize, c.Salt = 8, other }, []string{"block size 8, the other workers use 16", "salt"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := testCard
			tt.change(&w)
			err := CheckCard(testCard, w)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrCardMismatch) {
				t.Fatalf("err %v", err)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q lacks %q", err, s)
				}
			}
		})
	}
	// The salt error names both values.
	w := testCard
	w.Salt = other
	if err := CheckCard(testCard, w); !strings.Contains(err.Error(), "0x7d38246f2d3ef01c") || strings.Count(err.Error(), "0x") != 2 {
		t.Errorf("salt error %q", err)
	}
}

func TestAddWorkerChecksCard(t *testing.T) {
	s := newTestState(t, testConfig())
	if _, ok := s.Card(); ok {
		t.Fatal("card before any worker")
	}
	if err := s.AddWorker(1, Card{Model: "m"}); err == nil {
		t.Fatal("card without block size adopted")
	}
	if err := s.AddWorker(1, testCard); err != nil {
		t.Fatal(err)
	}
	if c, ok := s.Card(); !ok || c != testCard {
		t.Fatalf("adopted %+v", c)
	}
	bad := testCard
	bad.BlockSize = 32
	if err := s.AddWorker(2, bad); !errors.Is(err, ErrCardMismatch) {
		t.Fatalf("mismatched worker: %v", err)
	}
	if len(s.Workers()) != 1 {
		t.Fatal("refused worker registered")
	}

	cfg := testConfig()
	cfg.Card = bad
	s = newTestState(t, cfg)
	if err := s.AddWorker(1, testCard); !errors.Is(err, ErrCardMismatch) {
		t.Fatalf("configured card not enforced: %v", err)
	}
}
