package cpu

import "tandem/hal"

// attnGroupKernelsFor returns the grouped attention kernels for KV element
// type dt, head size hd and block size bs under isa, or nil where only the
// per-head path serves. They are chosen as the per-head kernels are: AVX-512
// for head sizes that are a multiple of 16 (F32 and F16), AVX2 with F16C for
// F16 head sizes that are a multiple of 8.
func attnGroupKernelsFor(isa string, dt hal.DType, hd, bs int) *attnGroupKernels {
	if bs != 16 || hd <= 0 || hd%8 != 0 {
		return nil
	}
	switch {
	case isa == "avx512vnni" && hd%16 == 0 && dt == hal.F32:
		return attnGF32AVX512
	case isa == "avx512vnni" && hd%16 == 0 && dt == hal.F16:
		return attnGF16AVX512
	case dt == hal.F16 && (isa == "avx512vnni" || isa == "avx2") && feat.avx2:
		return attnGF16AVX2
	}
	return nil
}
