// Package cpu is the CPU backend of hal: kernels for quantized matmul,
// attention over paged KV, norms and RoPE, run on a pool of worker goroutines.
package cpu

import (
	"fmt"
	"runtime"

	"tandem/hal"
)

// Backend runs hal ops on the CPU. One forward pass at a time: the scratch
// buffers it keeps between ops are not safe for concurrent callers.
type Backend struct {
	pool *pool

	xq      []byte      // activations converted to a weight's vec-dot type
	scratch [][]float32 // per worker, attention scores
	offsets [][]int32   // per worker, attention block offsets
	wbufs   []workerBufs
	sideBuf []int32   // per activation block: scale and correction for packed kernels
	packs   packCache // packed copies of weights

	// The ops' pool tasks, reused from op to op.
	quant   quantTask
	mm      matmulTask
	mmPack  packedTask
	norm    normTask
	rope    ropeTask
	attn    attnTask
	silu    siluTask
	lowRank lowRankTask

	perHeadAttn bool // tests: attention one query head at a time, grouped kernels or not
}

// New returns a CPU backend using threads workers (0 means all cores).
func New(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	b := &Backend{pool: newPool(threads)}
	b.scratch = make([][]float32, threads)
	b.offsets = make([][]int32, threads)
	b.wbufs = make([]workerBufs, threads)
	return b
}

// Close stops the worker goroutines and frees the packed weights.
func (b *Backend) Close() error {
	b.pool.close()
	b.packs.release()
	return nil
}

// Err is always nil: the CPU's ops cannot fail (a bad argument panics).
func (b *Backend) Err() error { return nil }

// Name describes the backend.
func (b *Backend) Name() string {
	threads := "threads"
	if b.pool.n == 1 {
		threads = "thread"
	}
	return fmt.Sprintf("cpu (%d %s, %s kernels)", b.pool.n, threads, kern.isa)
}

// Threads is the number of workers.
func (b *Backend) Threads() int { return b.pool.n }

// A Backend has two of hal's optional ops, which the model finds by type
// assertion: a change of their signatures must not turn them off unseen.
var (
	_ hal.Backend        = (*Backend)(nil)
	_ hal.MultiMatMuler  = (*Backend)(nil)
	_ hal.WeightPreparer = (*Backend)(nil)
)

// SupportsWeight reports whether a kernel exists for weights of type t.
func (b *Backend) SupportsWeight(t hal.DType) bool { return SupportedWeight(t) }

// Dequantize converts len(dst) elements of type t from src.
func (b *Backend) Dequantize(dst []float32, t hal.DType, src []byte) { DequantizeRow(t, src, dst) }

// NewBuf allocates n values of host memory, on the Go heap: activations are a
// few MiB, and the collector frees a buffer once nothing refers to it.
func (b *Backend) NewBuf(n int) (hal.Buf, error) {
	if n < 0 {
		return hal.Buf{}, fmt.Errorf("cpu: buffer of %d values", n)
	}
	return hal.HostBuf(make([]float32, n)), nil
}

// FreeBuf does nothing: the garbage collector owns the memory.
func (b *Backend) FreeBuf(hal.Buf) {}

// WriteBuf copies src into dst.
func (b *Backend) WriteBuf(dst hal.Buf, src []float32) error {
	if len(src) > dst.Len() {
		return fmt.Errorf("cpu: %d values into a buffer of %d", len(src), dst.Len())
	}
	copy(host(dst), src)
	return nil
}

// ReadBuf copies src into dst.
func (b *Backend) ReadBuf(dst []float32, src hal.Buf) error {
	if len(dst) > src.Len() {
		return fmt.Errorf("cpu: %d values from a buffer of %d", len(dst), src.Len())
	}
	copy(dst, host(src))
	return nil
}

// host returns the values of a host buffer. A non-empty Buf without them
// belongs to a device backend: handing it to this one is a programming error.
func host(b hal.Buf) []float32 {
	v := b.Host()
	if v == nil && b.Len() > 0 {
		panic("cpu: a buffer of another backend (it has no host values)")
	}
	return v
}
