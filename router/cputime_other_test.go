//go:build !linux

package router

import "time"

// threadCPU is the wall clock where the thread's CPU clock is not read.
func threadCPU() time.Duration { return time.Duration(time.Now().UnixNano()) }

// processCPU is the wall clock where the process's CPU clock is not read.
func processCPU() time.Duration { return time.Duration(time.Now().UnixNano()) }
