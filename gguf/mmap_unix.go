//go:build linux || darwin || freebsd || netbsd || openbsd

package gguf

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// mapFile maps path read-only. The mapping outlives the descriptor, which is
// closed before returning.
func mapFile(path string) ([]byte, func() error, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size == 0 {
		// mmap rejects empty mappings; let the parser report the empty file.
		return []byte{}, func() error { return nil }, nil
	}
	if size < 0 || uint64(size) > math.MaxInt {
		return nil, nil, fmt.Errorf("%s: file of %d bytes is too large to map", path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
