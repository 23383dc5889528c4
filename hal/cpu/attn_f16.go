package cpu

// Attention over an F16 KV store: the pure-Go references widen each key and
// value to float32 (exactly) and then run attnScoresRef's and
// attnAccumVRef's float32 operations in their order, so the SIMD kernels,
// which widen with VCVTPH2PS and do the same, give their bits.

// attnScoresF16Ref is attnScoresRef over FP16 keys.
func attnScoresF16Ref(q []float32, k []uint16, offs []int32, bs int, scale float32, sc []float32) {
	for bi, off := range offs {
		kb := k[off : int(off)+len(q)*bs]
		for slot := range bs {
			var d float32
			for i, qv := range q {
				d += float32(qv * FP16ToFP32(kb[i*bs+slot]))
			}
			sc[bi*bs+slot] = d * scale
		}
	}
}

// attnAccumVF16Ref is attnAccumVRef over FP16 values: o = Σ_j w[j]·v_j over
// the positions j < len(w), in order of j, each as axpy.
func attnAccumVF16Ref(o []float32, v []uint16, offs []int32, bs int, w []float32) {
	clear(o)
	hd := len(o)
	for j, wj := range w {
		off := int(offs[j/bs]) + (j%bs)*hd
		vj := v[off : off+hd]
		for i := range o {
			o[i] += float32(wj * FP16ToFP32(vj[i]))
		}
	}
}

// attnKernelsF16 are the SIMD versions of attnScoresF16Ref and
// attnAccumVF16Ref for one head size and block size.
type attnKernelsF16 struct {
	scores func(q []float32, k []uint16, offs []int32, scale float32, sc []float32)
	accumV func(o []float32, v []uint16, offs []int32, w []float32)
}
