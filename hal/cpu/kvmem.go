package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"tandem/hal"
)

// newHostKVStore allocates a store's arrays, per elements for each layer's
// keys and each layer's values (float32 or FP16 as the layout says),
// outside the Go heap where the platform allows (mapKV), and unmaps them
// once the store is unreachable. The KV cache is most of a server's memory
// besides the weights: on the Go heap it set the collector's goal (twice
// the live heap) past its own size, so that nothing was collected until
// the garbage of requests had grown as large as the whole cache (+180 MiB
// of resident memory over 150 short requests to Qwen 0.5B with a 9 GiB
// budget, the next collection due at 12.6 GB). Pages are zero and not
// resident until first written, as before.
func newHostKVStore(l hal.KVLayout, per int) (*kvStore, error) {
	es := l.ElemBytes()
	n := 2 * l.Layers * per
	if per <= 0 || n/(2*l.Layers) != per || n > int(^uint(0)>>1)/es {
		return nil, fmt.Errorf("cpu: KV layout %+v is too large", l)
	}
	mem, free, err := mapKV(n * es)
	if err != nil {
		return nil, fmt.Errorf("cpu: KV store of %d bytes: %w: %w", n*es, hal.ErrOutOfMemory, err)
	}
	s := &kvStore{layout: l, kb: make([][]byte, l.Layers), vb: make([][]byte, l.Layers)}
	pb := per * es
	for i := range s.kb {
		s.kb[i] = mem[(2*i)*pb : (2*i+1)*pb : (2*i+1)*pb]
		s.vb[i] = mem[(2*i+1)*pb : (2*i+2)*pb : (2*i+2)*pb]
	}
	switch l.DType {
	case hal.F32:
		s.k, s.v = make([][]float32, l.Layers), make([][]float32, l.Layers)
		for i := range s.kb {
			s.k[i] = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(s.kb[i]))), per)
			s.v[i] = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(s.vb[i]))), per)
		}
	case hal.F16:
		s.k16, s.v16 = make([][]uint16, l.Layers), make([][]uint16, l.Layers)
		for i := range s.kb {
			s.k16[i] = unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(s.kb[i]))), per)
			s.v16[i] = unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(s.vb[i]))), per)
		}
	}
	runtime.AddCleanup(s, func(free func()) { free() }, free)
	return s, nil
}
