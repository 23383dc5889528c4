//go:build linux || darwin || freebsd || netbsd || openbsd

package packcache

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// mapFile maps path read-only and shared: the page cache's pages are the weights, shared
// with every process that maps the same file. The mapping outlives the descriptor.
func mapFile(path string) ([]byte, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size == 0 || size > math.MaxInt {
		return nil, nil, fmt.Errorf("%s: a file of %d bytes", path, size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	return data, func() { _ = syscall.Munmap(data) }, nil
}
