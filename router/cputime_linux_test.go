package router

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPU returns the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): the
// benchmarks time decisions with it, besides the wall clock, so that their percentiles do
// not count the time the thread waited for a core on a shared machine. The caller locks
// its goroutine to its thread.
func threadCPU() time.Duration { return cpuClock(3) } // CLOCK_THREAD_CPUTIME_ID

// processCPU returns the CPU time of every thread of the process (CLOCK_PROCESS_CPUTIME_ID):
// the replay reports what its timed pass computed, the appliers' and the decisions'
// together (and the garbage collector's), beside the wall clock that other processes on a
// shared machine stretch.
func processCPU() time.Duration { return cpuClock(2) } // CLOCK_PROCESS_CPUTIME_ID

// cpuClock reads the CPU-time clock id (0 if it cannot).
func cpuClock(id uintptr) time.Duration {
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, id, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
