package cpu

// packArena hands out the memory of packed weights from large mappings
// aligned to 2 MiB, so that the kernel can back nearly all of it with
// transparent huge pages: a decode step streams every weight once, and
// with 4 KiB pages the small weights (an attention projection is under
// 1 MiB) and the unaligned ends of the large ones missed the TLB on every
// page. Pages of a slab that no weight reached are never touched, so they
// cost address space, not memory.
type packArena struct {
	slab  []byte // the unused rest of the current slab
	frees []func()
}

const (
	hugePageBytes = 2 << 20
	packSlabBytes = 256 << 20
)

// alloc returns n zeroed bytes starting on a cache line. Pieces of a slab
// are released with the arena; a weight over a quarter of a slab gets its
// own mapping (so a slab's unused tail stays small) and free releases it.
func (a *packArena) alloc(n int) (data []byte, free func()) {
	if n == 0 {
		return nil, func() {}
	}
	if n > packSlabBytes/4 {
		return mapAligned(n, hugePageBytes)
	}
	if len(a.slab) < n {
		b, free := mapAligned(packSlabBytes, hugePageBytes)
		a.frees = append(a.frees, free)
		a.slab = b
	}
	data = a.slab[:n:n]
	a.slab = a.slab[min(len(a.slab), (n+63)&^63):]
	return data, func() {}
}

// release unmaps the slabs; no piece of them may be used afterwards.
func (a *packArena) release() {
	for _, f := range a.frees {
		f()
	}
	a.frees, a.slab = nil, nil
}
