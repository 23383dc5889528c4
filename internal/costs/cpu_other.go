//go:build !unix

package costs

import "time"

// ProcessCPU is 0 where the process's CPU time is not read (getrusage is Unix's).
func ProcessCPU() time.Duration { return 0 }
