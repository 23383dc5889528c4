//go:build linux

package safetensors

import (
	"os"
	"syscall"
)

// mapFile maps the first size bytes of fd read-only. The mapping outlives fd.
func mapFile(fd *os.File, size int) ([]byte, func([]byte) error, error) {
	data, err := syscall.Mmap(int(fd.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return data, syscall.Munmap, nil
}
