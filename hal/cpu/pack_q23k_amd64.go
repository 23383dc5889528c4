package cpu

// The packed Q3_K and Q2_K kernels (AVX-512 VNNI, pack_amd64.s from
// packgen.py kernel_q23k); layouts in pack_q23k.go.

//go:noescape
func packQ3_Kx4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ3_Kx4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ3_Kx1VNNI(nb int, w, x, side *byte, out *float32)

//go:noescape
func packQ2_Kx4PFVNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)

//go:noescape
func packQ2_Kx4VNNI(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)

//go:noescape
func packQ2_Kx1VNNI(nb int, w, x, side *byte, out *float32)

var (
	packFormatQ3_K = &packFormat{layout: "q3_k", groupBlockBytes: 1824, blockElems: 256, sideWords: 12, side: sideQ3_K, pack: packQ3_K, k4: packQ3_Kx4VNNI, k4pf: packQ3_Kx4PFVNNI, k1: packQ3_Kx1VNNI}
	packFormatQ2_K = &packFormat{layout: "q2_k", groupBlockBytes: 1344, blockElems: 256, sideWords: 12, side: sideQ2_K, pack: packQ2_K, k4: packQ2_Kx4VNNI, k4pf: packQ2_Kx4PFVNNI, k1: packQ2_Kx1VNNI}
)
