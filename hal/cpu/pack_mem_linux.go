//go:build linux

package cpu

import (
	"syscall"
	"unsafe"
)

// allocPacked returns zeroed memory for a packed weight, mapped outside the
// Go heap with transparent huge pages requested (fewer TLB misses when a
// decode step streams every weight), and the function that releases it.
func allocPacked(n int) ([]byte, func()) {
	if n == 0 {
		return nil, func() {}
	}
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, n), func() {}
	}
	_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE; advice only
	return b, func() { _ = syscall.Munmap(b) }
}

// releaseSource tells the kernel that the pages of a weight's original
// bytes are not needed soon (MADV_PAGEOUT): once a weight is packed, its
// file pages need not stay resident beside the copy. The data stays
// valid: a later read (Embed of a tied embedding) pages it back in.
func releaseSource(b []byte) {
	const page = 4096
	if len(b) < 2*page {
		return
	}
	start := (page - int(uintptrOf(b)%page)) % page
	end := start + (len(b)-start)/page*page
	_ = syscall.Madvise(b[start:end], 21) // MADV_PAGEOUT; advice only
	_ = syscall.Madvise(b[start:end], 1)  // MADV_RANDOM: no readahead for later row reads
}

// releaseRow pages out the pages holding b, a row read from a weight
// whose packed copy serves the matmuls (advice only; neighbouring rows on
// those pages stay valid and are read back on demand).
func releaseRow(b []byte) {
	const page = 4096
	if len(b) == 0 {
		return
	}
	p := uintptrOf(b)
	start := -int(p % page)
	end := len(b) + int((page-(p+uintptr(len(b)))%page)%page)
	full := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), start)), end-start)
	_ = syscall.Madvise(full, 21) // MADV_PAGEOUT
}
