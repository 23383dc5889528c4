//go:build !unix

package main

func cpuSeconds() float64 { return 0 }

func residentBytes() (now, peak int64) { return 0, 0 }
