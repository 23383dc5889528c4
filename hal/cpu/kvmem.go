package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"tandem/hal"
)

// newHostKVStore allocates a store's arrays, per floats for each layer's
// keys and each layer's values, outside the Go heap where the platform
// allows (mapKV), and unmaps them once the store is unreachable. The KV
// cache is most of a server's memory besides the weights: on the Go heap
// it set the collector's goal (twice the live heap) past its own size, so
// that nothing was collected until the garbage of requests had grown as
// large as the whole cache (+180 MiB of resident memory over 150 short
// requests to Qwen 0.5B with a 9 GiB budget, the next collection due at
// 12.6 GB). Pages are zero and not resident until first written, as
// before. The arrays KVArrays hands out are valid while the store is
// reachable.
func newHostKVStore(l hal.KVLayout, per int) (*kvStore, error) {
	const f32 = 4
	n := 2 * l.Layers * per
	if per <= 0 || n/(2*l.Layers) != per || n > int(^uint(0)>>1)/f32 {
		return nil, fmt.Errorf("cpu: KV layout %+v is too large", l)
	}
	mem, free, err := mapKV(n * f32)
	if err != nil {
		return nil, fmt.Errorf("cpu: KV store of %d bytes: %w", n*f32, err)
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(mem))), n)
	s := &kvStore{layout: l, k: make([][]float32, l.Layers), v: make([][]float32, l.Layers)}
	for i := range s.k {
		s.k[i] = all[(2*i)*per : (2*i+1)*per : (2*i+1)*per]
		s.v[i] = all[(2*i+1)*per : (2*i+2)*per : (2*i+2)*per]
	}
	runtime.AddCleanup(s, func(free func()) { free() }, free)
	return s, nil
}
