package gguf

import (
	"syscall"
	"unsafe"
)

// dropPages drops the whole pages of b, part of a read-only file mapping
// from mapFile, from the process's resident set: the parsed header is
// copied out of the file, so its pages need not stay resident beside the
// copy. The data stays valid (a later read faults it back in).
func dropPages(b []byte) {
	const page = 4096
	if len(b) < page {
		return
	}
	start := (page - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%page)) % page
	if n := (len(b) - start) / page * page; n > 0 {
		_ = syscall.Madvise(b[start:start+n], syscall.MADV_DONTNEED) // advice only
	}
}
