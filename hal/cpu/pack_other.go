//go:build !amd64

package cpu

import "tandem/hal"

// packFormatFor: no packed kernels off amd64.
func packFormatFor(isa string, t hal.DType) *packFormat { return nil }

// attnKernelsFor: the scalar attention loops off amd64.
func attnKernelsFor(isa string, hd, bs int) *attnKernels { return nil }

func siluMulSIMD(gate, up []float32) int { return 0 }

func addSIMD(dst, src []float32) int { return 0 }

func quantizeQ8_0SIMD(src []float32, dst []byte) int { return 0 }

func quantizeQ8_KSIMD(src []float32, dst []byte) int { return 0 }

func expShiftedSIMD(v []float32, m float32) int { return 0 }

func f32ToF16SIMD(src []float32, dst []byte) int { return 0 }

// kernelFeatures names the kernels in use for PreparedKey.
func kernelFeatures() string { return kern.isa }
