package gguf

import "fmt"

// Open maps the file at path read-only and parses it. Tensor data is used in
// place from the mapping, so loading costs no copy; call Close to unmap.
func Open(path string) (*File, error) {
	data, unmap, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := parse(data)
	if err != nil {
		unmap()
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f.unmap = unmap
	dropPages(data[:min(f.dataOffset, uint64(len(data)))])
	return f, nil
}
