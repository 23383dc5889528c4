package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"tandem/llm"
)

// transfer copies the blocks under handle h of p that d's import lacks into d.
func transfer(t *testing.T, p *Engine, h uint64, im *Import) int {
	t.Helper()
	n := 0
	err := p.ExportBlocks(context.Background(), h, im.Missing(), func(i int, hash uint64, data []byte) error {
		n++
		return im.Write(hash, slices.Clone(data))
	})
	if err != nil {
		t.Fatal(err)
	}
	im.Commit()
	return n
}

// A prompt prefilled on one engine and decoded on another, its KV moved block by block,
// yields exactly the tokens of one engine doing both; the decode engine reports the
// imported blocks as cached, and both pools return to no blocks in use.
func TestPrefillExportImportMatchesAggregated(t *testing.T) {
	agg, m := startEngine(t, Config{})
	p, _ := startEngine(t, Config{})
	d, _ := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode(prompts[6]+" and they all went home", true, false)
	const maxTokens = 24
	ref, _ := collectReq(t, agg, &llm.Request{Prompt: prompt, MaxTokens: maxTokens})

	res, err := p.Prefill(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: maxTokens}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if res.First.Token != ref[0] {
		t.Fatalf("first token %d, aggregated %d", res.First.Token, ref[0])
	}
	if want := len(prompt) / 16; len(res.Hashes) != want {
		t.Fatalf("%d held hashes, want %d", len(res.Hashes), want)
	}
	if p.Pool().Stats().Used == 0 {
		t.Fatal("prefill-only request holds no blocks")
	}
	im, err := d.BeginImport(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if im.Have() != 0 || len(im.Missing()) != len(res.Hashes) {
		t.Fatalf("fresh engine has %d, misses %d", im.Have(), len(im.Missing()))
	}
	if n := transfer(t, p, res.Handle, im); n != len(res.Hashes) {
		t.Fatalf("transferred %d blocks", n)
	}
	if !p.ReleaseHeld(res.Handle) || p.ReleaseHeld(res.Handle) {
		t.Fatal("ReleaseHeld should report true once")
	}
	cont := append(slices.Clone(prompt), res.First.Token)
	got, last := collectReq(t, d, &llm.Request{Prompt: cont, MaxTokens: maxTokens - 1})
	im.Release()
	if !slices.Equal(append([]int32{res.First.Token}, got...), ref) {
		t.Errorf("disaggregated %v\naggregated    %v", append([]int32{res.First.Token}, got...), ref)
	}
	if want := len(res.Hashes) * 16; last.Usage.CachedTokens < want-16 {
		t.Errorf("decode engine cached %d tokens, imported %d", last.Usage.CachedTokens, want)
	}
	waitIdle(t, p)
	waitIdle(t, d)

	// A second import of the same prompt finds every block cached: nothing to fetch.
	im2, err := d.BeginImport(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if len(im2.Missing()) != 0 || im2.Have() != len(res.Hashes) {
		t.Errorf("second import misses %d, has %d", len(im2.Missing()), im2.Have())
	}
	im2.Release()
	waitIdle(t, d)
}

func collectReq(t *testing.T, e *Engine, req *llm.Request) ([]int32, llm.Event) {
	t.Helper()
	s, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, s)
}

func TestHeldBlocksExpireAndRefuse(t *testing.T) {
	p, m := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode(prompts[1], true, false)
	res, err := p.Prefill(context.Background(), &llm.Request{Prompt: prompt}, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitIdle(t, p) // the hold expires by itself
	if held, expired := p.HeldStats(); held != 0 || expired != 1 {
		t.Errorf("held %d expired %d", held, expired)
	}
	err = p.ExportBlocks(context.Background(), res.Handle, res.Hashes, func(int, uint64, []byte) error { return nil })
	if !errors.Is(err, ErrNotHeld) {
		t.Errorf("export after expiry: %v", err)
	}

	// A wrong hash is refused by the importer, and a format with another shape by Check.
	im, err := p.BeginImport(m.Tokenizer.Encode(prompts[6], true, false))
	if err != nil {
		t.Fatal(err)
	}
	f, _ := p.KVFormat()
	if f.Store != "cpu-kv/1" {
		t.Errorf("the store's format is %q, want the CPU store's versioned name cpu-kv/1", f.Store)
	}
	if err := im.Write(12345, make([]byte, f.BlockBytes())); err == nil {
		t.Error("a block with a foreign hash was imported")
	}
	im.Release()
	other := f
	other.HeadDim *= 2
	if err := f.Check(other); !errors.Is(err, ErrKVFormat) {
		t.Errorf("format check: %v", err)
	}
	other = f
	other.Store = "cpu-kv/2" // a later order of the elements within a block
	if err := f.Check(other); !errors.Is(err, ErrKVFormat) {
		t.Errorf("format check against another version: %v", err)
	}
	if err := f.Check(f); err != nil {
		t.Error(err)
	}
	waitIdle(t, p)
}

// Cancelling a prefill-only request frees its sequence and holds nothing.
func TestPrefillCancelHoldsNothing(t *testing.T) {
	p, m := startEngine(t, Config{MaxBatchTokens: 4}) // slow prefill: cancel lands mid-way
	prompt := m.Tokenizer.Encode(prompts[6], true, false)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(2 * time.Millisecond); cancel() }()
	res, err := p.Prefill(ctx, &llm.Request{Prompt: prompt}, time.Minute)
	if err == nil {
		t.Log("prefill finished before the cancel; releasing")
		p.ReleaseHeld(res.Handle)
	}
	waitIdle(t, p)
	if held, _ := p.HeldStats(); held != 0 {
		t.Errorf("%d handles held after a cancelled prefill", held)
	}
}

// Blocks exported while the prefill still runs (one block per step here) are the blocks
// computed: the decode engine's output equals the aggregated one.
func TestExportDuringPrefill(t *testing.T) {
	agg, m := startEngine(t, Config{})
	p, _ := startEngine(t, Config{MaxBatchTokens: 16})
	d, _ := startEngine(t, Config{})
	prompt := m.Tokenizer.Encode(prompts[7]+" and they all went home", true, false)
	ref, _ := collectReq(t, agg, &llm.Request{Prompt: prompt, MaxTokens: 16})
	h, wait, err := p.StartPrefill(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: 16}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	im, err := d.BeginImport(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if n := transfer(t, p, h, im); n != len(prompt)/16 {
		t.Fatalf("streamed %d blocks, want %d", n, len(prompt)/16)
	}
	res, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.Handle != h || res.First.Token != ref[0] {
		t.Errorf("prefill result %+v, want handle %d and first token %d", res, h, ref[0])
	}
	p.ReleaseHeld(h)
	got, _ := collectReq(t, d, &llm.Request{Prompt: prompt, MaxTokens: 16})
	im.Release()
	if !slices.Equal(got, ref) {
		t.Errorf("decode engine %v, aggregated %v", got, ref)
	}
	waitIdle(t, p)
	waitIdle(t, d)
}
