//go:build !unix

package main

func cpuSeconds() float64 { return 0 }
