//go:build !linux

package router

import "time"

// threadCPU is the wall clock where the thread's CPU clock is not read.
func threadCPU() time.Duration { return time.Duration(time.Now().UnixNano()) }
