package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
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

// moved is what a transfer between two engines exported: each block's bytes, by index.
type moved struct {
	blocks map[int][]byte
	n      int
}

// move prefills req on src, imports its blocks into dst as a decode worker would (the
// blocks dst lacks, streamed as src computes them) and returns what moved; the import is
// committed and returned, to be released once the request is admitted.
func move(t *testing.T, src, dst *engine.Engine, req *llm.Request) (*engine.PrefillResult, *engine.Import, moved) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, wait, err := src.StartPrefill(ctx, req, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	im, err := dst.BeginImport(req.Prompt)
	if err != nil {
		t.Fatal(err)
	}
	mv := moved{blocks: map[int][]byte{}}
	err = src.ExportBlocks(ctx, h, im.Missing(), func(i int, hash uint64, data []byte) error {
		mv.blocks[i] = slices.Clone(data)
		mv.n++
		return im.Write(hash, data)
	})
	if err != nil {
		t.Fatal(err)
	}
	if im.Commit(); im.Written() != mv.n {
		t.Fatalf("%d blocks exported, %d written", mv.n, im.Written())
	}
	res, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	src.ReleaseHeld(res.Handle)
	return res, im, mv
}

// decode continues req on e after its first token (as a decode worker does with the
// blocks it pulled) and returns every token, the first included, and the last event.
func decode(t *testing.T, e *engine.Engine, req *llm.Request, first int32) ([]int32, llm.Event) {
	t.Helper()
	r := *req
	r.Prompt = append(slices.Clone(req.Prompt), first)
	r.MaxTokens--
	ids, last := collect(t, e, &r)
	return append([]int32{first}, ids...), last
}

// TestReplicaKVTransfer moves a prompt's KV between 2-stage replicas, a replica of another
// split, a 3-stage replica and whole engines, each way, for the stories fixture and a
// gen-model qwen2 (Q8_0, biases, tied output): the decode side finds the blocks cached and
// generates one engine's tokens, and the bytes a replica exports are those one engine over
// the whole model exports, block for block.
func TestReplicaKVTransfer(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	ca, err := orpc.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fixtures.Model(t, "stories260K-f32.gguf"), genQwen2(t)} { // 5 and 6 layers
		t.Run(filepath.Base(path), func(t *testing.T) { testKVTransfer(t, path, be, ca) })
	}
}

func testKVTransfer(t *testing.T, path string, be hal.Backend, ca *orpc.CA) {
	ref, m := startWhole(t, path, be)
	whole, _ := startWhole(t, path, be)
	p := startReplica(t, path, model.StageSpec{Count: 2}, be, ca)
	d := startReplica(t, path, model.StageSpec{Count: 2}, be, ca)
	split := startReplica(t, path, model.StageSpec{Count: 2, Sizes: []int{1, m.Config.Layers - 1}}, be, ca)
	three := startReplica(t, path, model.StageSpec{Count: 3}, be, ca)
	const maxTokens = 16
	for i, tc := range []struct {
		name     string
		src, dst *engine.Engine
	}{
		{"2 stages to 2 stages", p.e, d.e},
		{"2 stages to another split", p.e, split.e},
		{"2 stages to 3 stages", p.e, three.e},
		{"3 stages to 2 stages", three.e, p.e},
		{"2 stages to one engine", d.e, whole},
		{"one engine to 2 stages", whole, split.e},
	} {
		prompt := m.Tokenizer.Encode(fmt.Sprintf("Story %d. ", i)+strings.Repeat("Lily and Ben played in the park with a big red ball. ", 6), true, false)
		req := &llm.Request{Prompt: prompt, MaxTokens: maxTokens}
		want, _ := collect(t, ref, req)
		res, im, mv := move(t, tc.src, tc.dst, req)
		if mv.n != len(prompt)/testBlockSize || mv.n < 4 {
			t.Fatalf("%s: %d blocks moved for a prompt of %d tokens", tc.name, mv.n, len(prompt))
		}
		got, last := decode(t, tc.dst, req, res.First.Token)
		im.Release()
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, one engine %v", tc.name, got, want)
		}
		if last.Usage.CachedTokens < mv.n*testBlockSize {
			t.Errorf("%s: the decode side cached %d tokens, %d were moved", tc.name, last.Usage.CachedTokens, mv.n*testBlockSize)
		}
		// The same prompt's blocks, exported by one engine over the whole model: the same bytes.
		other, _ := startWhole(t, path, be)
		_, oim, omv := move(t, whole, other, &llm.Request{Prompt: prompt, MaxTokens: maxTokens})
		oim.Release()
		for b, data := range mv.blocks {
			if !bytes.Equal(data, omv.blocks[b]) {
				t.Errorf("%s: block %d differs from one engine's (%d bytes, %d)", tc.name, b, len(data), len(omv.blocks[b]))
				break
			}
		}
	}

	// A peer pull (docs/kv-tiers.md) from a replica's prefix cache into another replica:
	// the cached blocks move through both replicas' stages the same way.
	prompt := m.Tokenizer.Encode("Story 0. "+strings.Repeat("Lily and Ben played in the park with a big red ball. ", 6), true, false)
	im, err := split.e.BeginImport(prompt) // d holds it from the first transfer, split does not
	if err != nil {
		t.Fatal(err)
	}
	n, err := d.e.ExportCached(context.Background(), im.Missing(), func(hash uint64, data []byte) error { return im.Write(hash, data) })
	if err != nil || n != len(prompt)/testBlockSize || im.Commit() != n {
		t.Fatalf("peer pull: %d blocks sent, %v", n, err)
	}
	want, _ := collect(t, ref, &llm.Request{Prompt: prompt, MaxTokens: maxTokens})
	got, last := collect(t, split.e, &llm.Request{Prompt: prompt, MaxTokens: maxTokens})
	im.Release()
	if !slices.Equal(got, want) || last.Usage.CachedTokens != n*testBlockSize {
		t.Errorf("after a peer pull: %v (cached %d tokens), one engine %v", got, last.Usage.CachedTokens, want)
	}
}

// collect runs req on e and returns its tokens.
func collect(t *testing.T, e *engine.Engine, req *llm.Request) ([]int32, llm.Event) {
	t.Helper()
	s, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids []int32
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.Token)
		if ev.Finish != "" {
			return ids, ev
		}
	}
}

// TestReplicaKVTransferStageDies: a prefill replica's stage that dies while the blocks
// stream fails the export (the blocks that arrived are intact and kept; the decode side
// computes the rest: one engine's tokens); a decode replica whose stage restarts during an
// import commits none of its blocks (the restarted stage lost them), and its generation is
// still one engine's.
func TestReplicaKVTransferStageDies(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	ca, _ := orpc.NewCA("test")
	path := fixtures.Model(t, "stories260K-f32.gguf")
	ref, m := startWhole(t, path, be)
	p := startReplica(t, path, model.StageSpec{Count: 2}, be, ca)
	d := startReplica(t, path, model.StageSpec{Count: 2}, be, ca)
	prompt := m.Tokenizer.Encode(strings.Repeat("The sun was hot and the birds were singing in the tall green trees. ", 4), true, false)
	req := &llm.Request{Prompt: prompt, MaxTokens: 12}
	want, _ := collect(t, ref, req)

	// The prefill replica's stage 1 dies once the first blocks went out.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, wait, err := p.e.StartPrefill(ctx, req, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	im, err := d.e.BeginImport(prompt)
	if err != nil {
		t.Fatal(err)
	}
	// The first block is pulled on its own, then the stage dies, then the rest is pulled:
	// within one export a batch of up to 64 blocks is read at once, so a stage stopped
	// while its first block was delivered could die after every block had been read (the
	// prefill done before the export began, as on a loaded machine).
	missing := im.Missing()
	write := func(i int, hash uint64, data []byte) error { return im.Write(hash, data) }
	if err := p.e.ExportBlocks(ctx, h, missing[:1], write); err != nil {
		t.Fatal(err)
	}
	p.stops[1]()
	n := 1
	err = p.e.ExportBlocks(ctx, h, missing[1:], func(i int, hash uint64, data []byte) error {
		n++
		return write(i, hash, data)
	})
	if err == nil {
		t.Fatalf("the export went on after the stage died (%d blocks)", n)
	}
	if _, err := wait(); err != nil && !errors.Is(err, llm.ErrUnavailable) {
		t.Errorf("the prefill after its stage died: %v, want ErrUnavailable (or done, if its last step was back)", err)
	}
	im.Commit()
	kept := im.Written()
	if kept < 1 || kept >= len(prompt)/testBlockSize {
		t.Errorf("%d blocks kept of %d", kept, len(prompt)/testBlockSize)
	}
	got, last := collect(t, d.e, req)
	im.Release()
	if !slices.Equal(got, want) {
		t.Errorf("after the prefill stage died: %v, one engine %v", got, want)
	}
	if last.Usage.CachedTokens != kept*testBlockSize {
		t.Errorf("cached %d tokens, %d blocks were kept", last.Usage.CachedTokens, kept)
	}

	// The decode replica's stage restarts mid-import: nothing of it is committed.
	prompt2 := m.Tokenizer.Encode(strings.Repeat("Once upon a time, there was a little girl named Lily. ", 4), true, false)
	req2 := &llm.Request{Prompt: prompt2, MaxTokens: 12}
	want2, _ := collect(t, ref, req2)
	restartStage(t, path, be, ca, p.addrs[1])
	waitUp(t, p.head)
	h, wait, err = p.e.StartPrefill(ctx, req2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(); err != nil {
		t.Fatal(err)
	}
	im, err = d.e.BeginImport(prompt2)
	if err != nil {
		t.Fatal(err)
	}
	n = 0
	err = p.e.ExportBlocks(ctx, h, im.Missing()[:2], func(i int, hash uint64, data []byte) error {
		n++
		return im.Write(hash, data)
	})
	if err != nil || im.Flush() != nil || im.Written() != 2 {
		t.Fatalf("before the restart: %v, %d blocks written", err, im.Written())
	}
	d.stops[1]()
	waitDown(t, d.head)
	restartStage(t, path, be, ca, d.addrs[1])
	waitUp(t, d.head)
	if c := im.Commit(); c != 0 {
		t.Errorf("%d blocks committed across the restart of a stage that held them", c)
	}
	got2, last2 := collect(t, d.e, req2)
	im.Release()
	p.e.ReleaseHeld(h)
	if !slices.Equal(got2, want2) {
		t.Errorf("after the decode stage restarted: %v, one engine %v", got2, want2)
	}
	if last2.Usage.CachedTokens != 0 {
		t.Errorf("cached %d tokens after the restart", last2.Usage.CachedTokens)
	}
}

func waitUp(t *testing.T, h *Head) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); h.Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not come back: %v", h.Err())
		}
	}
}

func waitDown(t *testing.T, h *Head) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); h.Err() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not notice its stage died")
		}
	}
}

// BenchmarkBlockIO gathers (read) and scatters (write) a 1,000-token prompt's 62 blocks
// (24 MiB; blocks of a 0.5B model's size: 12 layers, 4 KV heads of 64, 384 KiB) through a
// 2-stage replica on loopback, in the batches a transfer uses: the head's half from its
// own store, the other half over the stage link (TLS on TCP). MB/s is the blocks' bytes
// (both halves); the link carries half of them. Set it beside BenchmarkKVPull (package
// worker), the ORPC pull of the same 24 MiB between two engines.
func BenchmarkBlockIO(b *testing.B) {
	spec := modelgen.Demo
	spec.Embd, spec.Layers, spec.Heads, spec.KVHeads, spec.HeadDim, spec.FFN, spec.ContextLen = 768, 12, 12, 4, 64, 256, 2048
	spec.Type = "q8_0"
	w, err := modelgen.Build(spec)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "bench.gguf")
	if err := w.WriteFile(path); err != nil {
		b.Fatal(err)
	}
	be := cpu.New(1)
	defer be.Close()
	ca, _ := orpc.NewCA("bench")
	r := startReplica(b, path, model.StageSpec{Count: 2}, be, ca)
	f, err := r.e.KVFormat()
	if err != nil {
		b.Fatal(err)
	}
	const blocks = 62
	ids := make([]int32, blocks)
	for i := range ids {
		ids[i] = int32(i)
	}
	batch := max((4<<20)/f.BlockBytes(), 1) // the engine's batch (engine.blockStoreBatch)
	buf := make([]byte, batch*f.BlockBytes())
	ctx := context.Background()
	for _, op := range []string{"read", "write"} {
		b.Run(op, func(b *testing.B) {
			b.SetBytes(int64(blocks * f.BlockBytes()))
			for b.Loop() {
				for k := 0; k < blocks; k += batch {
					n := min(batch, blocks-k)
					var err error
					if op == "read" {
						err = r.head.ReadBlocks(ctx, ids[k:k+n], buf[:n*f.BlockBytes()])
					} else {
						err = r.head.WriteBlocks(ctx, ids[k:k+n], buf[:n*f.BlockBytes()])
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(batch), "blocks/call")
		})
	}
}
