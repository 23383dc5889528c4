package kvcache

import "testing"

func BenchmarkHashBlocks(b *testing.B) {
	toks := iota32(4096)
	dst := make([]uint64, 0, 256)
	b.SetBytes(4 * int64(len(toks)))
	b.ReportAllocs()
	for b.Loop() {
		dst = HashBlocks(1, toks, 16, dst[:0])
	}
}

// BenchmarkMatch matches a 2048-token prompt whose 127 leading blocks are cached
// (the last block is left to compute), then releases them.
func BenchmarkMatch(b *testing.B) {
	p := NewPool(1024, 16)
	prompt := iota32(2048)
	s := p.NewSeq(testSalt)
	if s.Reserve(len(prompt)) != nil {
		b.Fatal("reserve")
	}
	s.Commit(prompt)
	s.Release()
	b.ReportAllocs()
	for b.Loop() {
		if s.Match(prompt, 1) != 2032 {
			b.Fatal("miss")
		}
		s.Release()
	}
}

// BenchmarkChurn admits a new 256-token prompt per iteration into a full pool:
// a miss, 16 blocks taken (evicting old ones), committed and released.
func BenchmarkChurn(b *testing.B) {
	p := NewPool(1024, 16)
	prompt := iota32(256)
	s := p.NewSeq(testSalt)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		prompt[0] = int32(i)
		cached := s.Match(prompt, 1)
		if err := s.Reserve(len(prompt) - cached); err != nil {
			b.Fatal(err)
		}
		s.Commit(prompt)
		s.Release()
	}
}

// BenchmarkDecodeStep is one decode step's bookkeeping: a slot for the next
// token and its commit (a block fills every 16 steps).
func BenchmarkDecodeStep(b *testing.B) {
	p := NewPool(1024, 16)
	toks := make([]int32, 0, 16*1024)
	s := p.NewSeq(testSalt)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if len(toks) == cap(toks)-16 {
			s.Release()
			toks = toks[:0]
		}
		if err := s.Reserve(1); err != nil {
			b.Fatal(err)
		}
		toks = append(toks, int32(i))
		s.Commit(toks)
	}
}
