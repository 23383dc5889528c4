//go:build !amd64

package cpu

// cpuRelax is a no-op where there is no spin-loop hint in Go assembly here.
func cpuRelax() {}
