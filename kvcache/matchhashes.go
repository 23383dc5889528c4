package kvcache

// MatchHashes is Match by sequence hashes the caller computed (with this sequence's salt
// and the pool's block size): it takes a reference on the longest cached leading run of
// them and returns its length in tokens. Unlike Match it counts nothing in Stats, since it
// is no prompt's lookup: a KV export uses it to pin the blocks it copies out. It is called
// once, on an empty sequence; it panics otherwise.
func (s *Seq) MatchHashes(hashes []uint64) int {
	if len(s.blocks) != 0 || s.n != 0 {
		panic("kvcache: MatchHashes on a non-empty sequence")
	}
	p := s.pool
	p.mu.Lock()
	s.blocks = p.acquireRun(hashes, s.blocks)
	p.mu.Unlock()
	s.hashes = append(s.hashes[:0], hashes[:len(s.blocks)]...)
	s.n = len(s.blocks) * p.blockSize
	return s.n
}
