//go:build !amd64

package cpu

// sumsBF16Pairs: no packed kernels off amd64.
func sumsBF16Pairs(f *packFormat) bool { return false }
