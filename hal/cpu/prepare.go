package cpu

import "tandem/hal"

// PrepareWeight makes now the copy of w in the backend's own layout that
// its first MatMul would otherwise make, and reports whether there is one.
// A weight with a copy is no longer read from its own bytes by MatMul, and
// where those lie in a mapped file their pages are dropped from the
// process's resident set as the copy is made: loading weight by weight
// this way keeps the peak near the final size, instead of the whole file
// plus the copies.
func (b *Backend) PrepareWeight(w *hal.Weight) bool { return b.packs.packed(w, b.pool) != nil }
