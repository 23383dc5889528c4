package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	"tandem/llm"
	"tandem/model"
)

// queuedForward is a PipelineForwarder over the model's own forward pass: Launch computes
// a step at once and keeps its logits, Land hands out the oldest: what a pipeline's order
// of results looks like, without the stages.
type queuedForward struct {
	f        Forwarder
	depth    int
	vocab    int
	queue    [][]float32
	failNext int // Land fails this many steps from the next one
	maxQueue int
}

func (q *queuedForward) Forward(b *model.Batch, logits []float32) error {
	return q.f.Forward(b, logits)
}
func (q *queuedForward) InFlight() int { return q.depth }

func (q *queuedForward) Launch(b *model.Batch) error {
	if len(q.queue) >= q.depth {
		return errors.New("too many steps in flight")
	}
	logits := make([]float32, len(b.Outputs)*q.vocab)
	if err := q.f.Forward(b, logits); err != nil {
		return err
	}
	q.queue = append(q.queue, logits)
	q.maxQueue = max(q.maxQueue, len(q.queue))
	return nil
}

func (q *queuedForward) Land(b *model.Batch, logits []float32) error {
	l := q.queue[0]
	q.queue = q.queue[1:]
	if q.failNext > 0 {
		q.failNext--
		return errors.New("a stage failed")
	}
	copy(logits, l)
	return nil
}

// TestMicroBatchesMatchSolo runs the 16 prompts through an engine that keeps 2 and 3
// steps in flight: every sequence's tokens are the ones it gets alone, and steps were in
// flight together.
func TestMicroBatchesMatchSolo(t *testing.T) {
	for _, depth := range []int{2, 3} {
		m, be := loadStories(t)
		f, err := ModelForwarder(m, be, 256, DefaultBlockSize)
		if err != nil {
			t.Fatal(err)
		}
		q := &queuedForward{f: f, depth: depth, vocab: m.Config.VocabSize}
		e, err := NewWithForwarder(m, q, Config{KVBlocks: 256, MaxBatchTokens: 24})
		if err != nil {
			t.Fatal(err)
		}
		runEngine(t, e)
		want := solo(t, m, 30)
		got, last := runConcurrently(t, e, m, 30)
		for i := range prompts {
			if !slices.Equal(got[i], want[i]) || last[i].Usage.CompletionTokens != 30 {
				t.Errorf("depth %d, prompt %d: %v, alone %v", depth, i, got[i], want[i])
			}
		}
		if q.maxQueue != depth {
			t.Errorf("depth %d: at most %d steps were in flight", depth, q.maxQueue)
		}
		if _, err := e.KVFormat(); !errors.Is(err, errPipelineKV) {
			t.Errorf("a pipeline's engine offers KV blocks: %v", err)
		}
		if err := e.LoadAdapter(context.Background(), "a", "/nonexistent"); !errors.Is(err, llm.ErrInvalid) {
			t.Errorf("a pipeline's engine loads a LoRA adapter: %v", err)
		}
		waitIdle(t, e)
	}
}

// TestMicroBatchLandFails: a step that fails when it lands ends its sequences with the
// forwarder's error, and the others go on.
func TestMicroBatchLandFails(t *testing.T) {
	m, be := loadStories(t)
	f, err := ModelForwarder(m, be, 64, DefaultBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	q := &queuedForward{f: f, depth: 2, vocab: m.Config.VocabSize, failNext: 1}
	e, err := NewWithForwarder(m, q, Config{KVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	runEngine(t, e)
	s, err := e.Generate(context.Background(), &llm.Request{Prompt: m.Tokenizer.Encode("Once upon a time", true, false), MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(context.Background()); err == nil || err.Error() != "engine: forward pass: a stage failed" {
		t.Errorf("the failed step's sequence got %v", err)
	}
	ids, _ := collect(t, mustGenerate(t, e, m, "Once upon a time", 4))
	if len(ids) != 4 {
		t.Errorf("after the failure: %v", ids)
	}
}

func mustGenerate(t *testing.T, e *Engine, m *model.Model, prompt string, n int) llm.Stream {
	t.Helper()
	s, err := e.Generate(context.Background(), &llm.Request{Prompt: m.Tokenizer.Encode(prompt, true, false), MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
