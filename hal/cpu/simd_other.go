//go:build !amd64

package cpu

import "tandem/hal"

func simdKernels(t hal.DType, isa string) (dotFunc, dot4Func) { return nil, nil }

func bestISA() string { return "go" }

func simdISAs() []string { return nil }
