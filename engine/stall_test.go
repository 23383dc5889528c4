package engine

import (
	"context"
	"testing"
	"time"

	"tandem/internal/costs"
	"tandem/llm"
)

func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	d := costs.ProcessCPU()
	if d == 0 {
		t.Skip("the process's CPU time cannot be read")
	}
	return d
}

// TestStalledSchedulerWaits: with work waiting that cannot be admitted (the pool's blocks
// pinned by a held prefill) and nothing running, the engine waits instead of spinning
// (it took a whole core before), and the release of the hold lets the request in.
func TestStalledSchedulerWaits(t *testing.T) {
	e, _ := startEngine(t, Config{KVBlocks: 25, BlockSize: 4})
	held := make([]int32, 96) // 24 full blocks, held after the prefill
	for i := range held {
		held[i] = int32(10 + i%200)
	}
	res, err := e.Prefill(context.Background(), &llm.Request{Prompt: held, MaxTokens: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 12) // 3 blocks: more than the one left
	for i := range prompt {
		prompt[i] = int32(300 + i)
	}
	st, err := e.Generate(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	time.Sleep(100 * time.Millisecond) // the request reaches the queue
	if s := e.Stats(); s.Waiting != 1 || s.Running != 0 {
		t.Fatalf("stats %+v: want the request waiting and nothing running", s)
	}
	before := cpuTime(t)
	time.Sleep(time.Second)
	if used := cpuTime(t) - before; used > 100*time.Millisecond {
		t.Errorf("the stalled engine used %v of CPU in a second", used)
	}
	if !e.ReleaseHeld(res.Handle) {
		t.Fatal("the prefill's blocks were not held")
	}
	if _, last := collect(t, st); last.Finish != llm.FinishLength {
		t.Errorf("after the release the request ended %q", last.Finish)
	}
}
