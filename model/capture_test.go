package model

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/hal/vulkan"
	"tandem/internal/vulkantest"
)

// captureBackend is a hal.StepCapturer over the CPU backend, made the way a
// GPU backend's graph capture is: the first step of a shape records its ops,
// each as a closure that takes its host inputs from the step being run (the
// device would copy them into the buffers the graph reads), and later steps
// of that shape replay the record instead of issuing the ops. A replay gives
// the bits of issuing the ops only if the model keeps hal.StepCapturer's
// promises: the same ops on the same buffers for a shape, host inputs taken
// from the Step alone, and FreeBuf for a buffer it stops using (which drops
// every capture here, so the test's counts show it, and poisons the memory
// with NaN, so that an op that still reads it spoils the logits).
type captureBackend struct {
	*cpu.Backend
	t testing.TB

	caps      map[captureKey][]func(*hal.Step)
	cur       *hal.Step
	key       captureKey
	rec       []func(*hal.Step)
	recording bool

	captures, replays, drops int
}

type captureKey struct {
	shape hal.StepShape
	kv    hal.KVStore
}

var _ hal.StepCapturer = (*captureBackend)(nil)

func (c *captureBackend) BeginStep(s *hal.Step) bool {
	c.cur, c.key = s, captureKey{s.Shape(), s.KV}
	if rec, ok := c.caps[c.key]; ok {
		for _, op := range rec {
			op(s)
		}
		c.replays++
		return true
	}
	c.recording, c.rec = true, nil
	return false
}

func (c *captureBackend) EndStep() error {
	if c.recording {
		if c.caps == nil {
			c.caps = map[captureKey][]func(*hal.Step){}
		}
		c.caps[c.key] = c.rec
		c.captures++
	}
	c.recording, c.cur = false, nil
	return nil
}

// op runs f on the current step now and, while capturing, records it.
func (c *captureBackend) op(f func(s *hal.Step)) {
	if c.recording {
		c.rec = append(c.rec, f)
	}
	f(c.cur)
}

// input checks that a host slice an op receives is the step's field.
func input[T any](c *captureBackend, what string, got, field []T) {
	if c.cur == nil {
		c.t.Fatalf("%s outside a step", what)
	}
	if len(got) != len(field) || len(got) > 0 && &got[0] != &field[0] {
		c.t.Errorf("%s: the op's host input is not the step's (a replay would not find it)", what)
	}
}

func (c *captureBackend) FreeBuf(b hal.Buf) {
	for i := range b.Host() {
		b.Host()[i] = float32(math.NaN())
	}
	if len(c.caps) > 0 {
		c.drops++
		clear(c.caps)
	}
}

func (c *captureBackend) Embed(out hal.Buf, w *hal.Weight, ids []int32) {
	input(c, "Embed ids", ids, c.cur.Tokens)
	c.op(func(s *hal.Step) { c.Backend.Embed(out, w, s.Tokens) })
}

func (c *captureBackend) RoPE(x hal.Buf, heads, headDim int, pos []int32, r *hal.RoPE) {
	input(c, "RoPE positions", pos, c.cur.Attn.Pos)
	c.op(func(s *hal.Step) { c.Backend.RoPE(x, heads, headDim, s.Attn.Pos, r) })
}

func (c *captureBackend) StoreKV(kv hal.KVStore, layer int, k, v hal.Buf, b *hal.AttnBatch) {
	if kv != c.cur.KV || b != c.cur.Attn {
		c.t.Error("StoreKV: not the step's KV store and batch")
	}
	c.op(func(s *hal.Step) { c.Backend.StoreKV(s.KV, layer, k, v, s.Attn) })
}

func (c *captureBackend) Attention(out, q hal.Buf, heads int, scale float32, kv hal.KVStore, layer int, b *hal.AttnBatch) {
	if kv != c.cur.KV || b != c.cur.Attn {
		c.t.Error("Attention: not the step's KV store and batch")
	}
	c.op(func(s *hal.Step) { c.Backend.Attention(out, q, heads, scale, s.KV, layer, s.Attn) })
}

func (c *captureBackend) CopyRows(dst, src hal.Buf, width int, rows []int) {
	input(c, "CopyRows rows", rows, c.cur.Outputs)
	c.op(func(s *hal.Step) { c.Backend.CopyRows(dst, src, width, s.Outputs) })
}

func (c *captureBackend) Logits(dst []float32, x hal.Buf, rows int, w *hal.Weight) {
	input(c, "Logits", dst, c.cur.Logits)
	c.op(func(s *hal.Step) { c.Backend.Logits(s.Logits, x, rows, w) })
}

func (c *captureBackend) MatMul(out, x hal.Buf, rows int, w *hal.Weight) {
	c.op(func(*hal.Step) { c.Backend.MatMul(out, x, rows, w) })
}

func (c *captureBackend) MatMuls(x hal.Buf, rows int, ps []hal.MatMulOut) {
	ps = slices.Clone(ps) // the caller reuses its slice
	c.op(func(*hal.Step) { c.Backend.MatMuls(x, rows, ps) })
}

func (c *captureBackend) RMSNorm(out, x hal.Buf, weight []float32, eps float32) {
	c.op(func(*hal.Step) { c.Backend.RMSNorm(out, x, weight, eps) })
}

func (c *captureBackend) AddBias(x hal.Buf, bias []float32) {
	c.op(func(*hal.Step) { c.Backend.AddBias(x, bias) })
}

func (c *captureBackend) Add(dst, src hal.Buf) { c.op(func(*hal.Step) { c.Backend.Add(dst, src) }) }

func (c *captureBackend) SiLUMul(gate, up hal.Buf) {
	c.op(func(*hal.Step) { c.Backend.SiLUMul(gate, up) })
}

// TestStepCapture runs an engine-like schedule (a batched prefill, decode
// steps, a longer prefill that grows the buffers, decode of three sequences,
// then of two again) on the CPU backend and on captureBackend, with fresh
// host memory for every step's inputs and logits: every step's logits are
// the same bits, and the steps of a shape after the first were replays.
func TestStepCapture(t *testing.T) {
	for _, name := range []string{"rand-qwen2-tok512-f32.gguf", "rand-qwen3-tok512-f32.gguf", "rand-llama-tok512-q8_0.gguf"} {
		t.Run(name, func(t *testing.T) {
			be := cpu.New(2)
			defer be.Close()
			m := loadFixture(t, be, name)
			cb := &captureBackend{Backend: be, t: t}
			capt := runCaptureSchedule(t, m, be, cb)
			if capt.capture == nil {
				t.Fatal("the runner does not see the StepCapturer")
			}
			if want := fmt.Sprint(5, 7, 2); fmt.Sprint(cb.captures, cb.replays, cb.drops) != want {
				t.Errorf("captures, replays, drops: %d %d %d, want %s", cb.captures, cb.replays, cb.drops, want)
			}
		})
	}
}

// TestStepCaptureVulkan runs the schedule on the Vulkan backend with its
// replay of recorded command buffers and without it (every step's ops
// issued and run): the same bits, and the expected captures and replays.
// (What replay saves the host is measured by bench-engine --device vulkan
// [--replay=false]: docs/architecture.md, "The Vulkan backend".)
func TestStepCaptureVulkan(t *testing.T) {
	for _, name := range []string{"rand-qwen2-tok512-f32.gguf", "rand-qwen3-tok512-f32.gguf", "rand-llama-tok512-q8_0.gguf", "rand-llama256-tok512-q4_k_m.gguf"} {
		t.Run(name, func(t *testing.T) {
			vk := vulkantest.New(t, vulkan.Options{Device: -1})
			plain := vulkantest.New(t, vulkan.Options{Device: -1, NoReplay: true})
			m := loadFixture(t, vk, name)
			runCaptureSchedule(t, m, plain, vk)
			st, ps := vk.Stats(), plain.Stats()
			// Drops count captures: the long prefill's buffers drop two,
			// the three-output decode's one.
			if want := fmt.Sprint(5, 7, 3); fmt.Sprint(st.Captures, st.Replays, st.Drops) != want {
				t.Errorf("captures, replays, drops: %d %d %d, want %s", st.Captures, st.Replays, st.Drops, want)
			}
			if ps.Captures != 0 || ps.Replays != 0 || ps.Steps != st.Steps {
				t.Errorf("without replay: %+v", ps)
			}
			if st.Dispatches >= ps.Dispatches {
				t.Errorf("%d dispatches recorded with replay, %d without: replays should record none", st.Dispatches, ps.Dispatches)
			}
		})
	}
}

// runCaptureSchedule runs an engine-like schedule on plainBe and on captBe
// (a hal.StepCapturer), with fresh host memory for every step's inputs and
// logits, and fails unless every step's logits are the same bits. It
// returns captBe's runner.
func runCaptureSchedule(t *testing.T, m *Model, plainBe, captBe hal.Backend) *Runner {
	t.Helper()
	const bs = 16
	lens := []int{20, 7, 70}
	var tables [][]int32
	next := int32(0)
	for _, n := range lens {
		var tb []int32
		for range (n + 12 + bs - 1) / bs {
			tb = append(tb, next)
			next++
		}
		tables = append(tables, tb)
	}
	kvPlain, err := plainBe.NewKVStore(m.KVLayout(int(next), bs))
	if err != nil {
		t.Fatal(err)
	}
	kvCap, err := captBe.NewKVStore(m.KVLayout(int(next), bs))
	if err != nil {
		t.Fatal(err)
	}
	plain, capt := NewRunner(m, plainBe), NewRunner(m, captBe)
	pos := make([]int, len(lens))
	tok := func(s, p int) int32 { return int32((s*131 + p*17 + 5) % m.Config.VocabSize) }
	// step feeds n[s] tokens of each sequence s with n[s] > 0.
	step := func(n ...int) {
		t.Helper()
		batch := func() *Batch {
			b := &Batch{}
			for s, k := range n {
				if k == 0 {
					continue
				}
				q := int32(len(b.Attn.Blocks))
				b.Attn.Blocks = append(b.Attn.Blocks, slices.Clone(tables[s]))
				for i := range k {
					b.Tokens = append(b.Tokens, tok(s, pos[s]+i))
					b.Attn.Pos = append(b.Attn.Pos, int32(pos[s]+i))
					b.Attn.SeqOf = append(b.Attn.SeqOf, q)
				}
				b.Outputs = append(b.Outputs, len(b.Tokens)-1)
			}
			return b
		}
		b1, b2 := batch(), batch()
		want := make([]float32, len(b1.Outputs)*m.Config.VocabSize)
		got := make([]float32, len(want))
		if err := plain.Forward(kvPlain, b1, want); err != nil {
			t.Fatal(err)
		}
		if err := capt.Forward(kvCap, b2, got); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
				t.Fatalf("step %v (positions %v), logit %d: %g with capture and replay, %g without", n, pos, i, got[i], want[i])
			}
		}
		for s, k := range n {
			pos[s] += k
		}
	}
	// Captures: the prefill, decode of two, the long prefill (its
	// buffers dropped the captures), decode of three (whose output
	// rows dropped them again), decode of two anew.
	step(20, 7, 0)
	for range 4 {
		step(1, 1, 0)
	}
	step(0, 0, 70)
	for range 3 {
		step(1, 1, 1)
	}
	for range 3 {
		step(1, 1, 0)
	}
	return capt
}

// faultyBackend fails as a device can: its allocations above limit values
// find no memory, and once lost is set its Err reports the device lost.
type faultyBackend struct {
	*cpu.Backend
	limit int
	lost  bool
}

func (f *faultyBackend) NewBuf(n int) (hal.Buf, error) {
	if n > f.limit {
		return hal.Buf{}, fmt.Errorf("test device: %d values: %w", n, hal.ErrOutOfMemory)
	}
	return f.Backend.NewBuf(n)
}

func (f *faultyBackend) Err() error {
	if f.lost {
		return fmt.Errorf("test device: %w", hal.ErrDeviceLost)
	}
	return nil
}

// TestForwardErrors: a forward step whose buffers cannot be allocated, or
// whose device was lost, returns an error wrapping the backend's (not
// logits), and a later step that fits runs as before.
func TestForwardErrors(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	m := loadFixture(t, be, "rand-qwen2-tok512-f32.gguf")
	fb := &faultyBackend{Backend: be, limit: 4 * max(m.Config.FFN, m.Config.Embd, m.Config.Heads*m.Config.HeadDim)}
	kv, err := be.NewKVStore(m.KVLayout(8, 16))
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(m, fb)
	logits := make([]float32, m.Config.VocabSize)
	batch := func(n int) *Batch {
		b := &Batch{Attn: hal.AttnBatch{Blocks: [][]int32{{0, 1, 2, 3, 4, 5, 6, 7}}}, Outputs: []int{n - 1}}
		for i := range n {
			b.Tokens = append(b.Tokens, int32(i+3))
			b.Attn.Pos = append(b.Attn.Pos, int32(i))
			b.Attn.SeqOf = append(b.Attn.SeqOf, 0)
		}
		return b
	}
	if err := r.Forward(kv, batch(9), logits); !errors.Is(err, hal.ErrOutOfMemory) {
		t.Errorf("9 tokens with room for 4: %v, want ErrOutOfMemory", err)
	}
	if err := r.Forward(kv, batch(3), logits); err != nil {
		t.Errorf("3 tokens after a failed allocation: %v", err)
	}
	fb.lost = true
	if err := r.Forward(kv, batch(3), logits); !errors.Is(err, hal.ErrDeviceLost) {
		t.Errorf("after the device was lost: %v, want ErrDeviceLost", err)
	}
}

// A replayed decode step allocates nothing on the Go heap: it writes the
// inputs into the capture's arena, submits and waits, and copies the
// logits out (hot paths allocate nothing per token).
func TestReplayAllocatesNothingVulkan(t *testing.T) {
	vk := vulkantest.New(t, vulkan.Options{Device: -1})
	m := loadFixture(t, vk, "rand-llama-tok512-q8_0.gguf")
	s := newSeqRunner(t, m, vk, 64)
	s.feed(t, []int32{1, 2, 3, 4})
	s.feed(t, []int32{5}) // records the decode shape
	before := vk.Stats().Replays
	b := &Batch{Tokens: []int32{6}, Attn: hal.AttnBatch{Pos: []int32{0}, SeqOf: []int32{0}, Blocks: [][]int32{s.table}}, Outputs: []int{0}}
	allocs := testing.AllocsPerRun(10, func() {
		b.Attn.Pos[0] = int32(s.pos)
		if err := s.r.Forward(s.kv, b, s.logits); err != nil {
			t.Fatal(err)
		}
		s.pos++
	})
	if got := vk.Stats().Replays - before; got != 11 {
		t.Fatalf("%d replays, want 11 (AllocsPerRun's warm-up and 10 runs)", got)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per replayed step, want 0", allocs)
	}
}
