// Package cpu is the CPU backend of hal: kernels for quantized matmul,
// attention over paged KV, norms and RoPE, run on a pool of worker goroutines.
package cpu

import (
	"fmt"
	"runtime"
	"sync"

	"tandem/hal"
)

// Backend runs hal ops on the CPU. One forward pass at a time: the scratch
// buffers it keeps between ops are not safe for concurrent callers.
type Backend struct {
	pool *pool

	xq      []byte      // activations converted to a weight's vec-dot type
	scratch [][]float32 // per worker, attention scores
	offsets [][]int32   // per worker, attention block offsets
	side    []int32     // per activation block: scale and correction for packed kernels
	packs   packCache   // packed copies of weights
}

// New returns a CPU backend using threads workers (0 means all cores).
func New(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	b := &Backend{pool: newPool(threads)}
	b.scratch = make([][]float32, threads)
	b.offsets = make([][]int32, threads)
	return b
}

// Close stops the worker goroutines.
func (b *Backend) Close() { b.pool.close() }

// Name describes the backend.
func (b *Backend) Name() string { return fmt.Sprintf("cpu (%d threads, pure Go)", b.pool.n) }

// Threads is the number of workers.
func (b *Backend) Threads() int { return b.pool.n }

var _ hal.Backend = (*Backend)(nil)

// pool runs a range of work split across a fixed set of goroutines.
type pool struct {
	n    int
	jobs chan poolJob
	once sync.Once
}

type poolJob struct {
	fn     func(worker, lo, hi int)
	worker int
	lo, hi int
	wg     *sync.WaitGroup
}

func newPool(n int) *pool {
	p := &pool{n: n, jobs: make(chan poolJob, n)}
	for i := 1; i < n; i++ {
		go func() {
			for j := range p.jobs {
				j.fn(j.worker, j.lo, j.hi)
				j.wg.Done()
			}
		}()
	}
	return p
}

func (p *pool) close() { p.once.Do(func() { close(p.jobs) }) }

// run calls fn over [0,n) split into at most p.n contiguous ranges; the
// caller's goroutine takes the first range. Work is split by index only, so
// each element's result never depends on how the range was cut.
func (p *pool) run(n int, fn func(worker, lo, hi int)) {
	if n <= 0 {
		return
	}
	parts := p.n
	if parts > n {
		parts = n
	}
	if parts == 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	wg.Add(parts - 1)
	for i := 1; i < parts; i++ {
		p.jobs <- poolJob{fn: fn, worker: i, lo: i * n / parts, hi: (i + 1) * n / parts, wg: &wg}
	}
	fn(0, 0, n/parts)
	wg.Wait()
}

// SupportsWeight reports whether a kernel exists for weights of type t.
func (b *Backend) SupportsWeight(t hal.DType) bool { return SupportedWeight(t) }

// Dequantize converts len(dst) elements of type t from src.
func (b *Backend) Dequantize(dst []float32, t hal.DType, src []byte) { DequantizeRow(t, src, dst) }
