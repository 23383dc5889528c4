package cpu

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"tandem/hal"
)

// TestOpsAllocateNothing: after a warm-up (scratch growth, weight packing),
// the ops of a forward pass allocate nothing, with one and two workers.
func TestOpsAllocateNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	const k, n, rows = 256, 40, 5
	x := testRandRow(r, rows*k)
	out := make([]float32, rows*n)
	weights := map[hal.DType]*hal.Weight{}
	for _, typ := range []hal.DType{hal.Q8_0, hal.Q5_0, hal.Q4_K, hal.F16, hal.BF16, hal.F32} {
		weights[typ] = benchWeight(typ, n, k)
	}
	norm := testRandRow(r, k)
	const heads, kvHeads, hd = 4, 2, 64
	q := testRandRow(r, rows*heads*hd)
	kv := testRandRow(r, rows*kvHeads*hd)
	ao := make([]float32, rows*heads*hd)
	out2, out3 := make([]float32, rows*(n+16)), make([]float32, rows*n)
	prods := []hal.MatMulOut{{Out: hal.HostBuf(out), W: weights[hal.Q8_0]}, {Out: hal.HostBuf(out2), W: benchWeight(hal.Q8_0, n+16, k)}, {Out: hal.HostBuf(out3), W: weights[hal.Q5_0]}}
	rope := &hal.RoPE{Dims: hd, Base: 10000, Neox: true}
	rowsOut := []int{4, 1}
	batch := &hal.AttnBatch{Blocks: [][]int32{{0, 1}}, Pos: []int32{0, 1, 2, 3, 17}, SeqOf: []int32{0, 0, 0, 0, 0}}
	for _, threads := range []int{1, 2} {
		be := New(threads)
		store, err := be.NewKVStore(hal.KVLayout{Layers: 1, Blocks: 2, BlockSize: 16, KVHeads: kvHeads, HeadDim: hd})
		if err != nil {
			t.Fatal(err)
		}
		store16, err := be.NewKVStore(hal.KVLayout{Layers: 1, Blocks: 2, BlockSize: 16, KVHeads: kvHeads, HeadDim: hd, DType: hal.F16})
		if err != nil {
			t.Fatal(err)
		}
		step := func() {
			for _, w := range weights {
				be.MatMul(hal.HostBuf(out), hal.HostBuf(x), rows, w)
				be.MatMul(hal.HostBuf(out[:n]), hal.HostBuf(x[:k]), 1, w)
			}
			be.MatMuls(hal.HostBuf(x), rows, prods[:2]) // one job
			be.MatMuls(hal.HostBuf(x), rows, prods)     // formats differ: one at a time
			be.RMSNorm(hal.HostBuf(x), hal.HostBuf(x), norm, 1e-6)
			be.Add(hal.HostBuf(x), hal.HostBuf(x))
			be.RoPE(hal.HostBuf(q), heads, hd, batch.Pos, rope)
			be.StoreKV(store, 0, hal.HostBuf(kv), hal.HostBuf(kv), batch)
			be.Attention(hal.HostBuf(ao), hal.HostBuf(q), heads, 0.125, store, 0, batch)
			be.StoreKV(store16, 0, hal.HostBuf(kv), hal.HostBuf(kv), batch)
			be.Attention(hal.HostBuf(ao), hal.HostBuf(q), heads, 0.125, store16, 0, batch)
			be.SiLUMul(hal.HostBuf(x[:k]), hal.HostBuf(x[k:2*k]))
			be.CopyRows(hal.HostBuf(x[:2*k]), hal.HostBuf(x), k, rowsOut)
			be.Logits(out, hal.HostBuf(x), rows, weights[hal.Q8_0])
		}
		step()
		if a := testing.AllocsPerRun(5, step); a != 0 {
			t.Errorf("threads=%d: %v allocations per forward step", threads, a)
		}
		be.Close()
	}
}

// countTask counts how often each index is run.
type countTask struct{ hits []int32 }

func (c *countTask) runRange(_, lo, hi int) {
	for i := lo; i < hi; i++ {
		c.hits[i]++
	}
}

// TestPoolRunsEachIndexOnce: for thread counts 1–5 and job sizes from 1
// (fewer indices than workers) to 37, thousands of back-to-back jobs run
// every index exactly once, and Close stops the workers.
func TestPoolRunsEachIndexOnce(t *testing.T) {
	before := runtime.NumGoroutine()
	for threads := 1; threads <= 5; threads++ {
		p := newPool(threads)
		task := &countTask{hits: make([]int32, 37)}
		for job := range 3000 {
			n := 1 + job%37
			clear(task.hits)
			p.run(n, task)
			for i, h := range task.hits {
				if want := int32(0); i < n {
					want = 1
					if h != want {
						t.Fatalf("threads=%d job %d (n=%d): index %d ran %d times", threads, job, n, i, h)
					}
				} else if h != want {
					t.Fatalf("threads=%d job %d (n=%d): index %d ran", threads, job, n, i)
				}
			}
			if job%500 == 499 {
				time.Sleep(2 * time.Millisecond) // let the workers park
			}
		}
		p.close()
		p.close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, %d before", n, before)
	}
}

// TestPoolCloseBeforeWorkersStart: a pool closed right after its first jobs,
// before its goroutines may have started, still stops them (a worker that
// starts late must see the close as a new generation, not sleep through it).
func TestPoolCloseBeforeWorkersStart(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 300 {
			p := newPool(3)
			task := &countTask{hits: make([]int32, 7)}
			p.run(7, task)
			p.close()
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return: a worker slept through it")
	}
}

// slowTask sleeps in the ranges worker 1 runs, so that the caller gives up
// spinning and parks until the worker completes the job.
type slowTask struct{ hits []int32 }

func (s *slowTask) runRange(worker, lo, hi int) {
	if worker != 0 {
		time.Sleep(time.Millisecond)
	}
	for i := lo; i < hi; i++ {
		s.hits[i]++
	}
}

// TestPoolCallerParks: when a worker holds the last chunk for longer than
// the caller spins, the caller parks and is woken when the job is done;
// every index still runs once.
func TestPoolCallerParks(t *testing.T) {
	p := newPool(2)
	defer p.close()
	task := &slowTask{hits: make([]int32, 64)}
	for job := range 50 {
		clear(task.hits)
		p.run(len(task.hits), task)
		for i, h := range task.hits {
			if h != 1 {
				t.Fatalf("job %d: index %d ran %d times", job, i, h)
			}
		}
	}
}
