//go:build !linux

package safetensors

import "os"

// mapFile reads the file: the fallback where mmap is not used.
func mapFile(fd *os.File, size int) ([]byte, func([]byte) error, error) {
	return readWhole(fd, size)
}
