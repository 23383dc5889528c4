package pipeline

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tandem/engine"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/model"
	"tandem/modelgen"
	"tandem/orpc"
)

const (
	testBlocks    = 128
	testBlockSize = 16
)

// replica is a pipeline replica in this process: its stages on loopback links, its head
// under an engine.
type replica struct {
	e      *engine.Engine
	head   *Head
	stages []*Stage
	stops  []context.CancelFunc // each stage's
	addrs  []string
}

// startReplica starts the stages of the model at path, cut as sp says, the last first
// (each dials the next when the head's hello comes), and an engine over the head on be.
// Each stage has a backend of its own, as a process would: a backend runs one step at a
// time, and with micro-batches the stages run at once.
func startReplica(t testing.TB, path string, sp model.StageSpec, be hal.Backend, ca *orpc.CA) *replica {
	t.Helper()
	id, err := ca.NewIdentity("stage", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{addrs: make([]string, sp.Count), stages: make([]*Stage, sp.Count), stops: make([]context.CancelFunc, sp.Count)}
	for i := sp.Count - 1; i >= 1; i-- {
		s := sp
		s.Index = i
		be := stageBackend(t)
		m, err := model.LoadStage(path, be, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		next := ""
		if i < sp.Count-1 {
			next = r.addrs[i+1]
		}
		st, err := NewStage(StageConfig{Model: m, Backend: be, Name: "m", BlockSize: testBlockSize, Next: next, Identity: id})
		if err != nil {
			t.Fatal(err)
		}
		l, err := st.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { st.Serve(ctx, l); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		r.addrs[i], r.stages[i], r.stops[i] = l.Addr().String(), st, cancel
	}
	s := sp
	s.Index = 0
	m, err := model.LoadStage(path, be, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := NewHead(ctx, HeadConfig{Model: m, Backend: be, Name: "m", BlockSize: testBlockSize, Blocks: testBlocks,
		Next: r.addrs[1], Identity: id, Retry: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.NewWithForwarder(m, h, engine.Config{BlockSize: testBlockSize, KVBlocks: testBlocks, MaxBatchTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { e.Run(runCtx) })
	wg.Go(func() { h.Run(runCtx, e.Reset) })
	t.Cleanup(func() { stop(); wg.Wait(); h.Close() })
	r.e, r.head = e, h
	return r
}

// startWhole is one engine over the whole model.
func startWhole(t *testing.T, path string, be hal.Backend) (*engine.Engine, *model.Model) {
	t.Helper()
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.New(m, be, engine.Config{BlockSize: testBlockSize, KVBlocks: testBlocks, MaxBatchTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, m
}

// prompts are 8 requests of different lengths, two sharing a prefix.
var prompts = []string{
	"Once upon a time",
	"Lily and Ben went to the park to play with a big red ball",
	"The cat sat",
	"One day, a little boy named Tim found a shiny stone in the garden. He",
	"Sue",
	"The sun was hot and the birds were singing in the tall green trees near",
	"Once upon a time, there was a little girl named Lily. She loved to play",
	"Once upon a time, there was a little girl named Lily. Her mom",
}

// generated is one request's greedy tokens and their log-probabilities.
type generated struct {
	ids []int32
	lps []float32
	err error
}

// generateAll submits every prompt at once and collects each one's tokens.
func generateAll(t *testing.T, e *engine.Engine, tok interface {
	Encode(string, bool, bool) []int32
}, maxTokens int) []generated {
	t.Helper()
	out := make([]generated, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		s, err := e.Generate(context.Background(), &llm.Request{Prompt: tok.Encode(p, true, false), MaxTokens: maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for {
				ev, err := s.Next(ctx)
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					out[i].err = err
					return
				}
				out[i].ids = append(out[i].ids, ev.Token)
				out[i].lps = append(out[i].lps, ev.Logprob)
			}
		})
	}
	wg.Wait()
	return out
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// genQwen2 writes a gen-model model besides the fixtures: qwen2 with biases, tied, Q8_0,
// 6 layers.
func genQwen2(t testing.TB) string {
	t.Helper()
	gen := filepath.Join(t.TempDir(), "gen-qwen2-q8_0.gguf")
	w, err := modelgen.Build(modelgen.Spec{Arch: "qwen2", Embd: 128, Layers: 6, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 256,
		ContextLen: 512, RopeBase: 1e6, NormEps: 1e-6, Tied: true, QKVBias: true, Type: "q8_0", Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(gen); err != nil {
		t.Fatal(err)
	}
	return gen
}

// TestReplicaMatchesOneEngine serves 8 concurrent requests through 2- and 3-stage replicas
// (stages linked over TLS on loopback, each with its own KV store, micro-batches on) and
// checks that every token and its log-probability are the bits one engine over the whole
// model gives, for the fixture models and a gen-model model.
func TestReplicaMatchesOneEngine(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	ca, err := orpc.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	gen := genQwen2(t)
	for _, tc := range []struct {
		name  string
		specs []model.StageSpec
	}{
		{gen, []model.StageSpec{{Count: 3}, {Count: 2, Sizes: []int{5, 1}}}},
		{"stories260K-f32.gguf", []model.StageSpec{{Count: 2}, {Count: 3}}},
		{"rand-qwen2-tok512-f32.gguf", []model.StageSpec{{Count: 2}}},
		{"rand-llama256-tok512-q4_k_m.gguf", []model.StageSpec{{Count: 2}}}, // K-quants, 2 layers
		{"rand-qwen3-tok512-f32.gguf", []model.StageSpec{{Count: 2, Sizes: []int{1, 1}}}},
	} {
		path := tc.name
		if !filepath.IsAbs(path) {
			path = fixtures.Model(t, tc.name)
		}
		whole, m := startWhole(t, path, be)
		want := generateAll(t, whole, m.Tokenizer, 24)
		for _, sp := range tc.specs {
			r := startReplica(t, path, sp, be, ca)
			got := generateAll(t, r.e, m.Tokenizer, 24)
			for i := range want {
				if want[i].err != nil || got[i].err != nil {
					t.Fatalf("%s, %d stages, request %d: %v / %v", tc.name, sp.Count, i, want[i].err, got[i].err)
				}
				if len(want[i].ids) == 0 || !slices.Equal(got[i].ids, want[i].ids) || !sameBits(got[i].lps, want[i].lps) {
					t.Errorf("%s, %d stages, request %d: tokens %v, one engine's %v (log-probabilities equal: %v)",
						tc.name, sp.Count, i, got[i].ids, want[i].ids, sameBits(got[i].lps, want[i].lps))
				}
			}
		}
	}
}

// TestStageRefusesAnotherReplica checks that a stage refuses a head of another split or
// block size, with a message naming both, and that the head's start fails with it.
func TestStageRefusesAnotherReplica(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	ca, _ := orpc.NewCA("test")
	id, _ := ca.NewIdentity("stage", []string{"127.0.0.1"})
	path := fixtures.Model(t, "stories260K-f32.gguf")
	m1, err := model.LoadStage(path, be, model.StageSpec{Count: 2, Index: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close()
	st, err := NewStage(StageConfig{Model: m1, Backend: be, Name: "m", BlockSize: testBlockSize, Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.Serve(ctx, l)
	for _, tc := range []struct {
		sizes     []int
		blockSize int
		want      string
	}{
		{[]int{2, 3}, testBlockSize, "split 3,2, block size 16; the replica asks for stage 1 of 2 of m"},
		{nil, 32, "block size 16; the replica asks for stage 1 of 2 of m"},
	} {
		m0, err := model.LoadStage(path, be, model.StageSpec{Count: 2, Sizes: tc.sizes})
		if err != nil {
			t.Fatal(err)
		}
		hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = NewHead(hctx, HeadConfig{Model: m0, Backend: be, Name: "m", BlockSize: tc.blockSize, Blocks: 8, Next: l.Addr().String(), Identity: id})
		hcancel()
		m0.Close()
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("split %v, block size %d: %v, want ErrRefused naming %q", tc.sizes, tc.blockSize, err, tc.want)
		}
	}
	// A client of another CA fails its TLS handshake.
	other, _ := orpc.NewCA("other")
	oid, _ := other.NewIdentity("x", nil)
	m0, _ := model.LoadStage(path, be, model.StageSpec{Count: 2})
	defer m0.Close()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	if _, err := NewHead(hctx, HeadConfig{Model: m0, Backend: be, Name: "m", BlockSize: 16, Blocks: 8, Next: l.Addr().String(), Identity: oid}); err == nil {
		t.Error("a head of another CA linked up")
	}
	var _ net.Listener = l
}

// TestStageDeathFailsRequests stops a replica's last stage mid-stream: every request in
// flight ends with ErrUnavailable naming the lost link (not a hang, not a silent stop),
// the replica reports itself down, and once the stage is back it serves the same tokens.
func TestStageDeathFailsRequests(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	ca, _ := orpc.NewCA("test")
	path := fixtures.Model(t, "stories260K-f32.gguf")
	whole, m := startWhole(t, path, be)
	want := generateAll(t, whole, m.Tokenizer, 16)

	r := startReplica(t, path, model.StageSpec{Count: 2}, be, ca)
	// Long requests, so that they are mid-stream when the stage goes.
	var streams []llm.Stream
	for _, p := range prompts {
		s, err := r.e.Generate(context.Background(), &llm.Request{Prompt: m.Tokenizer.Encode(p, true, false), MaxTokens: 200, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := streams[0].Next(ctx); err != nil {
		t.Fatal(err)
	}
	r.stops[1]() // the stage's process dies: its listener and link close
	for i, s := range streams {
		var err error
		for err == nil {
			_, err = s.Next(ctx)
		}
		if !errors.Is(err, llm.ErrUnavailable) || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "stage 1") {
			t.Errorf("request %d ended with %v, want ErrUnavailable naming the lost stage (and not io.EOF, a clean end to callers)", i, err)
		}
	}
	if err := r.head.Err(); !errors.Is(err, llm.ErrUnavailable) {
		t.Errorf("the head's health after the stage died: %v", err)
	}

	// The stage restarts on its address; the head links up again and serves as before.
	restartStage(t, path, be, ca, r.addrs[1])
	deadline := time.Now().Add(20 * time.Second)
	for r.head.Err() != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.head.Err(); err != nil {
		t.Fatalf("the replica did not come back: %v", err)
	}
	got := generateAll(t, r.e, m.Tokenizer, 16)
	for i := range want {
		if got[i].err != nil || !slices.Equal(got[i].ids, want[i].ids) || !sameBits(got[i].lps, want[i].lps) {
			t.Errorf("after the rejoin, request %d: %v %v, want %v", i, got[i].ids, got[i].err, want[i].ids)
		}
	}
}

// stageBackend is a stage's own CPU backend, closed when the test ends.
func stageBackend(t testing.TB) hal.Backend {
	be := cpu.New(1)
	t.Cleanup(func() { be.Close() })
	return be
}

// restartStage starts stage 1 of 2 again on addr.
func restartStage(t *testing.T, path string, _ hal.Backend, ca *orpc.CA, addr string) {
	t.Helper()
	be := stageBackend(t)
	id, _ := ca.NewIdentity("stage", []string{"127.0.0.1"})
	m, err := model.LoadStage(path, be, model.StageSpec{Count: 2, Index: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	st, err := NewStage(StageConfig{Model: m, Backend: be, Name: "m", BlockSize: testBlockSize, Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	var l net.Listener
	for range 100 { // the old listener's port may take a moment to be free
		if l, err = st.Listen(addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { st.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestStepAllocations: once warm, a decode step through a 2-stage replica (stage 0, the
// link both ways, stage 1) allocates nothing of ours: the frames, the hidden states, the
// batch and the results reuse their buffers. What is left is crypto/tls's own: a record
// read that waits for the network allocates its reader (readFromUntil), once each way.
func TestStepAllocations(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	ca, _ := orpc.NewCA("test")
	path := fixtures.Model(t, "stories260K-f32.gguf")
	r := startReplica(t, path, model.StageSpec{Count: 2}, be, ca)
	b := &model.Batch{Tokens: []int32{1, 2, 3, 4}, Attn: hal.AttnBatch{Pos: []int32{0, 0, 0, 0}, SeqOf: []int32{0, 1, 2, 3},
		Blocks: [][]int32{{0}, {1}, {2}, {3}}}, Outputs: []int{0, 1, 2, 3}}
	logits := make([]float32, 4*512)
	for range 3 {
		if err := r.head.Forward(b, logits); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(50, func() {
		if err := r.head.Forward(b, logits); err != nil {
			t.Fatal(err)
		}
	}); n > 2 {
		t.Errorf("a step allocates %.1f times, want crypto/tls's 2 at most", n)
	}
}
