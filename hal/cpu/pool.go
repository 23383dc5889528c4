package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// rangeTask is one op's work over an index range; tasks live in the
// Backend and are reused, so handing one to the pool allocates nothing.
type rangeTask interface {
	runRange(worker, lo, hi int)
}

// pool runs a range of work across a fixed set of goroutines, started once;
// an op neither allocates nor starts goroutines.
//
// A decode step is a few hundred ops of 10–200 µs each, so waking a parked
// goroutine for every op (a futex round trip of tens of µs) would cost a
// large share of the step. Workers therefore spin for a short while after a
// job before they park, and the caller spins while the last chunks finish.
// Chunks are claimed from a shared counter, so a worker that starts late
// takes less of the job instead of holding up the caller.
type pool struct {
	n int
	// job is the current job: generation, size and next unclaimed index
	// packed into one word, so that a worker claims a chunk and checks it
	// is still on the same job in a single compare-and-swap.
	job  atomic.Uint64
	done atomic.Int64 // indices of the current job completed
	task rangeTask    // written before job is published; stable until done reaches the size

	// The caller parks on finished when the last chunks take long (a
	// worker lost its core to another process): spinning then would only
	// keep that worker off the CPU longer.
	callerWaiting atomic.Bool
	finished      chan struct{}

	workers []poolWorker
	closed  atomic.Bool
	exited  sync.WaitGroup
	once    sync.Once
	spin    time.Duration
}

type poolWorker struct {
	sleeping atomic.Bool
	wake     chan struct{}
	_        [48]byte // keep each worker's flag on its own cache line
}

// The job word: 20 bits of generation, 22 of size, 22 of next index.
const (
	jobIndexBits = 22
	jobMaxSize   = 1<<jobIndexBits - 1
	jobIndexMask = jobMaxSize
	jobGenShift  = 2 * jobIndexBits
)

func jobWord(gen uint64, size, next int) uint64 {
	return gen<<jobGenShift | uint64(size)<<jobIndexBits | uint64(next)
}

func jobFields(w uint64) (gen uint64, size, next int) {
	return w >> jobGenShift, int(w >> jobIndexBits & jobIndexMask), int(w & jobIndexMask)
}

// poolSpin is how long an idle worker keeps polling for the next job before
// it parks: longer than the gaps between the ops of one forward pass, short
// enough that an idle server does not burn a core.
const poolSpin = 200 * time.Microsecond

func newPool(n int) *pool {
	p := &pool{n: n, spin: poolSpin, finished: make(chan struct{}, 1)}
	if n > 1 {
		p.workers = make([]poolWorker, n-1)
	}
	for i := range p.workers {
		p.workers[i].wake = make(chan struct{}, 1)
		p.exited.Add(1)
		go p.work(i + 1)
	}
	return p
}

func (p *pool) close() {
	p.once.Do(func() {
		p.closed.Store(true)
		gen, _, _ := jobFields(p.job.Load())
		p.job.Store(jobWord(gen+1, 0, 0))
		p.wakeSleepers()
		p.exited.Wait()
	})
}

// run calls t over [0,n) in chunks spread over the pool; the caller's
// goroutine works too. Work is split by index only, so each element's
// result never depends on how the range was cut. One run at a time.
func (p *pool) run(n int, t rangeTask) {
	if n <= 0 {
		return
	}
	if p.n == 1 || n == 1 {
		t.runRange(0, 0, n)
		return
	}
	if n > jobMaxSize {
		panic(fmt.Sprintf("cpu: pool job of %d indices is over the limit of %d", n, jobMaxSize))
	}
	p.task = t
	p.done.Store(0)
	gen, _, _ := jobFields(p.job.Load())
	p.job.Store(jobWord(gen+1, n, 0))
	p.wakeSleepers()
	p.claim(0, gen+1)
	p.awaitDone(int64(n))
}

// awaitDone spins until the job's n indices are done, then parks until
// the worker that completes them wakes it.
func (p *pool) awaitDone(n int64) {
	start := time.Now()
	for i := 0; p.done.Load() != n; i++ {
		if i&255 == 255 && time.Since(start) > p.spin {
			p.callerWaiting.Store(true)
			if p.done.Load() == n {
				if !p.callerWaiting.CompareAndSwap(true, false) {
					<-p.finished // the completing worker saw the flag
				}
				return
			}
			<-p.finished
			return
		}
		cpuRelax()
	}
}

func (p *pool) wakeSleepers() {
	for i := range p.workers {
		w := &p.workers[i]
		if w.sleeping.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
}

// claim runs chunks of job gen until none are left. A chunk is an eighth of
// an even share, so a late worker still finds work and the chunks stay
// large enough that claiming them costs little.
func (p *pool) claim(worker int, gen uint64) {
	for {
		w := p.job.Load()
		g, size, lo := jobFields(w)
		if g != gen || lo >= size {
			return
		}
		chunk := max(1, size/(8*p.n))
		hi := min(size, lo+chunk)
		if !p.job.CompareAndSwap(w, jobWord(g, size, hi)) {
			continue
		}
		p.task.runRange(worker, lo, hi)
		if p.done.Add(int64(hi-lo)) == int64(size) && worker != 0 && p.callerWaiting.CompareAndSwap(true, false) {
			p.finished <- struct{}{}
		}
	}
}

func (p *pool) work(id int) {
	defer p.exited.Done()
	w := &p.workers[id-1]
	var seen uint64 // the generation before the first job, even if this goroutine starts late
	for {
		gen := p.await(w, seen)
		if p.closed.Load() {
			return
		}
		seen = gen
		p.claim(id, gen)
	}
}

// await returns the generation of the first job after seen, spinning for
// p.spin and then parking until run wakes the worker.
func (p *pool) await(w *poolWorker, seen uint64) uint64 {
	for {
		start := time.Now()
		for i := 0; ; i++ {
			if g, _, _ := jobFields(p.job.Load()); g != seen {
				return g
			}
			if i&255 == 255 {
				if time.Since(start) > p.spin {
					break
				}
				// With as many workers as cores, a spinning pool would
				// otherwise keep the server's other goroutines off the CPU
				// until the runtime preempts it.
				runtime.Gosched()
			}
			cpuRelax()
		}
		w.sleeping.Store(true)
		if g, _, _ := jobFields(p.job.Load()); g != seen {
			if !w.sleeping.CompareAndSwap(true, false) {
				<-w.wake // run saw the flag and is sending a token
			}
			return g
		}
		<-w.wake
	}
}

// funcTask adapts a function to rangeTask, for code off the hot path
// (the conversion allocates).
type funcTask func(worker, lo, hi int)

func (f funcTask) runRange(worker, lo, hi int) { f(worker, lo, hi) }
