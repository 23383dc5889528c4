package kvcache

// CachedRun returns how many leading hashes of hashes (sequence hashes with the pool's
// block size) the prefix cache holds now, without taking a reference or counting a query:
// what a Match of the same blocks would find if it ran now. The scheduler uses it to
// estimate a queued prompt's cache hits for the load report; blocks may be evicted or
// computed by others before the prompt is admitted.
func (p *Pool) CachedRun(hashes []uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, h := range hashes {
		if _, ok := p.index[h]; !ok {
			break
		}
		n++
	}
	return n
}

// HeldRun returns how many leading hashes of hashes the pool holds in any tier (the
// device's prefix cache, or a lower tier, ready), without pinning anything: what a peer
// pull from this pool could send now.
func (p *Pool) HeldRun(hashes []uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, h := range hashes {
		if _, ok := p.index[h]; !ok && !p.heldElsewhere(h, p.tier) {
			break
		}
		n++
	}
	return n
}
