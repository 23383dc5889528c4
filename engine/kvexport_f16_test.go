package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"tandem/hal"
	"tandem/llm"
)

// Engines with F16 KV caches exchange blocks as "f16" (half the bytes of "f32"), and the
// decode engine's output equals one F16 engine doing both; an F16 engine and an F32 one
// refuse each other's blocks, naming both formats.
func TestKVTransferF16(t *testing.T) {
	agg, m := startEngineKV(t, Config{}, hal.F16)
	p, _ := startEngineKV(t, Config{}, hal.F16)
	d, _ := startEngineKV(t, Config{}, hal.F16)
	d32, _ := startEngineKV(t, Config{}, hal.F32)
	f16, err := p.KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	f32, err := d32.KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	if f16.DType != "f16" || f32.DType != "f32" || 2*f16.BlockBytes() != f32.BlockBytes() {
		t.Fatalf("formats %v (%d bytes a block) and %v (%d)", f16, f16.BlockBytes(), f32, f32.BlockBytes())
	}
	for _, c := range [][2]KVFormat{{f16, f32}, {f32, f16}} {
		err := c[0].Check(c[1])
		if !errors.Is(err, ErrKVFormat) || !strings.Contains(err.Error(), " f16,") || !strings.Contains(err.Error(), " f32,") {
			t.Errorf("%v.Check(%v) = %v, want ErrKVFormat naming f16 and f32", c[0], c[1], err)
		}
	}
	if err := f16.Check(f16); err != nil {
		t.Error(err)
	}

	prompt := m.Tokenizer.Encode(prompts[6]+" and they all went home", true, false)
	const maxTokens = 24
	ref, _ := collectReq(t, agg, &llm.Request{Prompt: prompt, MaxTokens: maxTokens})
	res, err := p.Prefill(context.Background(), &llm.Request{Prompt: prompt, MaxTokens: maxTokens}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	im, err := d.BeginImport(prompt)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	err = p.ExportBlocks(context.Background(), res.Handle, im.Missing(), func(i int, hash uint64, data []byte) error {
		sizes = append(sizes, len(data))
		return im.Write(hash, slices.Clone(data))
	})
	if err != nil {
		t.Fatal(err)
	}
	im.Commit()
	if len(sizes) != len(res.Hashes) || sizes[0] != f16.BlockBytes() {
		t.Fatalf("exported blocks of %v bytes, want %d of %d", sizes, len(res.Hashes), f16.BlockBytes())
	}
	p.ReleaseHeld(res.Handle)
	cont := append(slices.Clone(prompt), res.First.Token)
	got, _ := collectReq(t, d, &llm.Request{Prompt: cont, MaxTokens: maxTokens - 1})
	im.Release()
	if got = append([]int32{res.First.Token}, got...); !slices.Equal(got, ref) {
		t.Errorf("disaggregated %v\naggregated    %v", got, ref)
	}
	waitIdle(t, p)
	waitIdle(t, d)
}
