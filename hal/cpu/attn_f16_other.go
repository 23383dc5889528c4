//go:build !amd64

package cpu

// attnKernelsF16For: the scalar attention loops off amd64.
func attnKernelsF16For(isa string, hd, bs int) *attnKernelsF16 { return nil }
