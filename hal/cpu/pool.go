package cpu

import "sync"

// rangeTask is one op's work over an index range; tasks live in the
// Backend and are reused, so handing one to the pool allocates nothing.
type rangeTask interface {
	runRange(worker, lo, hi int)
}

// pool runs a range of work split across a fixed set of goroutines, started
// once; an op neither allocates nor starts goroutines.
type pool struct {
	n    int
	jobs chan poolJob
	wg   sync.WaitGroup
	once sync.Once
}

type poolJob struct {
	t      rangeTask
	worker int
	lo, hi int
}

func newPool(n int) *pool {
	p := &pool{n: n, jobs: make(chan poolJob, n)}
	for i := 1; i < n; i++ {
		go func() {
			for j := range p.jobs {
				j.t.runRange(j.worker, j.lo, j.hi)
				p.wg.Done()
			}
		}()
	}
	return p
}

func (p *pool) close() { p.once.Do(func() { close(p.jobs) }) }

// run calls t over [0,n) split into at most p.n contiguous ranges; the
// caller's goroutine takes the first range. Work is split by index only, so
// each element's result never depends on how the range was cut. One run
// at a time.
func (p *pool) run(n int, t rangeTask) {
	if n <= 0 {
		return
	}
	parts := min(p.n, n)
	if parts == 1 {
		t.runRange(0, 0, n)
		return
	}
	p.wg.Add(parts - 1)
	for i := 1; i < parts; i++ {
		p.jobs <- poolJob{t: t, worker: i, lo: i * n / parts, hi: (i + 1) * n / parts}
	}
	t.runRange(0, 0, n/parts)
	p.wg.Wait()
}

// funcTask adapts a function to rangeTask, for code off the hot path
// (the conversion allocates).
type funcTask func(worker, lo, hi int)

func (f funcTask) runRange(worker, lo, hi int) { f(worker, lo, hi) }
