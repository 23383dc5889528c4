//go:build !amd64

package cpu

// The low-rank update runs its pure-Go reference off amd64.
func lowRankSIMD() bool { return false }

func dotLanes16SIMD(a, x *float32, n16 int) float32 { panic("cpu: no low-rank kernels") }

func axpySIMD(dst, src *float32, s float32, n8 int) { panic("cpu: no low-rank kernels") }
