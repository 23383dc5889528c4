package cpu

import "tandem/hal"

//go:noescape
func packQ8_0x4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ8_0x1VNNI(nb int, w, x, side *byte, out *float32)

var packFormatQ8_0 = &packFormat{groupBlockBytes: 544, corrMul: 128, pack: packQ8_0, k4: packQ8_0x4VNNI, k1: packQ8_0x1VNNI}

// packFormatFor returns the packed layout MatMul uses for weights of type
// t under isa, or nil.
func packFormatFor(isa string, t hal.DType) *packFormat {
	if isa != "avx512vnni" {
		return nil
	}
	switch t {
	case hal.Q8_0:
		return packFormatQ8_0
	}
	return nil
}
