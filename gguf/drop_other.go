//go:build !linux

package gguf

// dropPages leaves the pages alone where the file may not be mapped.
func dropPages(b []byte) {}
