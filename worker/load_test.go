package worker_test

import (
	"context"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/sched"
	"tandem/worker"
)

// fakeStats is a StatsEngine with fixed figures.
type fakeStats struct {
	pool *kvcache.Pool
	st   engine.Stats
}

func (f *fakeStats) Generate(context.Context, *llm.Request) (llm.Stream, error) {
	return nil, llm.ErrUnavailable
}
func (f *fakeStats) Pool() *kvcache.Pool { return f.pool }
func (f *fakeStats) Stats() engine.Stats { return f.st }

func newWorker(t *testing.T, e worker.Engine) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Config{Engine: e, Card: cluster.ModelCard{Model: modelName, BlockSize: 16},
		Routers: []string{"127.0.0.1:1"}, Token: "abcdef.0123456789abcdef", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// The load report carries the engine's own state: sequences without a first token count
// as waiting, the uncomputed prompt tokens of the admitted and the queued ones as prefill,
// the pool's KV figures, and the last step's timing.
func TestLoadFromEngineStats(t *testing.T) {
	pool := kvcache.NewPool(100, 16)
	seq := pool.NewSeq(0)
	if err := seq.Reserve(15 * 16); err != nil {
		t.Fatal(err)
	}
	f := &fakeStats{pool: pool, st: engine.Stats{
		Census: sched.Census{Running: 5, Prefilling: 2, Waiting: 3, PrefillTokens: 70, WaitingTokens: 30, DecodeBlocks: 12},
		KVUsed: 15, KVBlocks: 100, KVUsage: 0.15, LastStep: 2500 * time.Microsecond, LastStepTokens: 42, Steps: 9,
	}}
	got := newWorker(t, f).Load()
	want := cluster.LoadReport{Load: llm.Load{Running: 3, Waiting: 5, PrefillTokens: 100, Queued: 3, QueuedTokens: 30,
		DecodeBlocks: 12, KVUsage: 0.15, KVBlocks: 100, Healthy: true, StepMicros: 2500, StepTokens: 42}}
	if got != want {
		t.Errorf("load\n got %+v\nwant %+v", got, want)
	}
}

// With a real engine, a report after a request has the step it ran and an idle batch.
func TestLoadRealEngine(t *testing.T) {
	be := cpu.New(2)
	defer be.Close()
	path := fixtures.Model(t, "stories260K-f32.gguf")
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	w := newWorker(t, eng)
	if r := w.Load(); r.StepMicros != 0 || r.StepTokens != 0 || r.KVBlocks != 64 || r.Running != 0 {
		t.Errorf("before any step: %+v", r)
	}
	st, err := eng.Generate(ctx, &llm.Request{Prompt: m.Tokenizer.Encode("Once upon a time", true, false), MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Finish != "" {
			break
		}
	}
	st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := w.Load()
		if r.StepMicros > 0 && r.StepTokens == 1 && r.Running == 0 && r.Waiting == 0 && r.DecodeBlocks == 0 &&
			r.LastEventID == eng.Pool().Stats().LastEventID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a request: %+v", r)
		}
		time.Sleep(time.Millisecond)
	}
}

// A node that is signalled during its start-up shuts its worker down before the worker's
// Run has begun, or while Run is still joining: Run must then end at once (it once ran on,
// registered, and the node waited for it forever).
func TestShutdownBeforeOrDuringRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // from Run's start to Shutdown; <0: Shutdown first
	}{{"before Run", -1}, {"while joining", 50 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			// 127.0.0.1:1 answers nothing: Run keeps trying to join until stopped.
			w := newWorker(t, &fakeStats{pool: kvcache.NewPool(16, 16)})
			if tc.delay < 0 {
				if err := w.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() { done <- w.Run(context.Background()) }()
			if tc.delay >= 0 {
				time.Sleep(tc.delay)
				if err := w.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run after Shutdown: %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run went on after Shutdown")
			}
		})
	}
}
