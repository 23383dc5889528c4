//go:build linux

package cpu

import (
	"syscall"
	"unsafe"
)

// mapAligned returns n zeroed bytes mapped outside the Go heap, starting on
// a multiple of align, with transparent huge pages requested, and the
// function that unmaps them.
func mapAligned(n, align int) ([]byte, func()) {
	b, err := syscall.Mmap(-1, 0, n+align, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, n), func() {}
	}
	head := (align - int(uintptrOf(b)%uintptr(align))) % align
	end := head + (n+4095)&^4095
	if head > 0 {
		_ = syscall.Munmap(b[:head])
	}
	if end < len(b) {
		_ = syscall.Munmap(b[end:])
	}
	b = b[head:end:end]
	_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE; advice only
	return b[:n:n], func() { _ = syscall.Munmap(b) }
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
