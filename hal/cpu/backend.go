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
	quant  quantTask
	mm     matmulTask
	mmPack packedTask
	norm   normTask
	rope   ropeTask
	attn   attnTask
	silu   siluTask

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
func (b *Backend) Close() {
	b.pool.close()
	b.packs.release()
}

// Name describes the backend.
func (b *Backend) Name() string {
	return fmt.Sprintf("cpu (%d threads, %s kernels)", b.pool.n, kern.isa)
}

// Threads is the number of workers.
func (b *Backend) Threads() int { return b.pool.n }

var _ hal.Backend = (*Backend)(nil)

// SupportsWeight reports whether a kernel exists for weights of type t.
func (b *Backend) SupportsWeight(t hal.DType) bool { return SupportedWeight(t) }

// Dequantize converts len(dst) elements of type t from src.
func (b *Backend) Dequantize(dst []float32, t hal.DType, src []byte) { DequantizeRow(t, src, dst) }
