//go:build unix

package costs

import (
	"syscall"
	"time"
)

// ProcessCPU is the process's user and system CPU time, every thread's (the collector's
// too); 0 if it cannot be read.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
