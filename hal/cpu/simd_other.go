//go:build !amd64

package cpu

import "tandem/hal"

func simdKernels(t hal.DType, isa string) (dotFunc, dot4Func) { return nil, nil }

func simdKernels2(t hal.DType, isa string) dot2Func { return nil }

func bestISA() string { return "go" }

func simdISAs() []string { return nil }
