//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package packcache

import "os"

// mapFile reads the whole file where this package does not use mmap.
func mapFile(path string) ([]byte, func(), error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	return data, func() {}, nil
}
