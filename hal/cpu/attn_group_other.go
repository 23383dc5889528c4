//go:build !amd64

package cpu

import "tandem/hal"

// attnGroupKernelsFor: the per-head attention loops off amd64.
func attnGroupKernelsFor(isa string, dt hal.DType, hd, bs int) *attnGroupKernels { return nil }
