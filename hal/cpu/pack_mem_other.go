//go:build !linux

package cpu

func mapAligned(n, _ int) ([]byte, func()) { return make([]byte, n), func() {} }

func releaseSource(b []byte) {}

func releaseRow(b []byte) {}
