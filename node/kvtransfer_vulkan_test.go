package node

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"tandem/engine"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/hal/vulkan"
	"tandem/internal/fixtures"
	"tandem/internal/vulkantest"
	"tandem/llm"
	"tandem/model"
)

// A Vulkan engine and a CPU engine exchange KV blocks: the Vulkan store keeps hal/cpu's
// block layout, so both name their format cpu-kv/1 and the formats Check as equal. A
// prompt prefilled on either and decoded on the other continues with the tokens each
// engine writes alone (the stories model's greedy text); an F16 Vulkan engine and an F32
// CPU engine refuse each other's blocks by format.
func TestKVTransferVulkanCPU(t *testing.T) {
	vk := vulkantest.New(t, vulkan.Options{Device: -1})
	c := cpu.New(1)
	t.Cleanup(func() { c.Close() })
	start := func(be hal.Backend, kvType hal.DType) *engine.Engine {
		m, err := model.Load(fixtures.Model(t, "stories260K-f32.gguf"), be)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		m.KVType = kvType
		e, err := engine.New(m, be, engine.Config{KVBlocks: 64, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { e.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return e
	}
	engines := map[string]*engine.Engine{"vulkan": start(vk, hal.F32), "cpu": start(c, hal.F32)}
	fv, err := engines["vulkan"].KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	fc, err := engines["cpu"].KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	if fv != fc || fv.Store != cpu.KVFormat || fv.Check(fc) != nil {
		t.Fatalf("Vulkan format %v, CPU format %v: want equal, %s", fv, fc, cpu.KVFormat)
	}
	f16, err := start(vk, hal.F16).KVFormat()
	if err != nil {
		t.Fatal(err)
	}
	if err := f16.Check(fc); !errors.Is(err, engine.ErrKVFormat) {
		t.Errorf("an F16 Vulkan store against an F32 CPU store: %v, want ErrKVFormat", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	generate := func(e *engine.Engine, prompt []int32, n int) []int32 {
		s, err := e.Generate(ctx, &llm.Request{Prompt: prompt, MaxTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		for {
			ev, err := s.Next(ctx)
			if errors.Is(err, io.EOF) {
				return ids
			}
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, ev.Token)
		}
	}
	mm, err := model.Load(fixtures.Model(t, "stories260K-f32.gguf"), c)
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	prompt := mm.Tokenizer.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside", true, false)
	const maxTokens = 24
	alone := map[string][]int32{}
	for name, e := range engines {
		alone[name] = generate(e, prompt, maxTokens)
	}
	if !slices.Equal(alone["vulkan"], alone["cpu"]) {
		t.Fatalf("greedy tokens: Vulkan %v, CPU %v", alone["vulkan"], alone["cpu"])
	}
	backends := map[string]hal.Backend{"vulkan": vk, "cpu": c}
	for _, dir := range [][2]string{{"cpu", "vulkan"}, {"vulkan", "cpu"}} {
		p, d := engines[dir[0]], start(backends[dir[1]], hal.F32) // d: a fresh prefix cache
		res, err := p.Prefill(ctx, &llm.Request{Prompt: prompt, MaxTokens: maxTokens}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		im, err := d.BeginImport(prompt)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		err = p.ExportBlocks(ctx, res.Handle, im.Missing(), func(i int, hash uint64, data []byte) error {
			n++
			return im.Write(hash, slices.Clone(data))
		})
		if err != nil {
			t.Fatal(err)
		}
		im.Commit()
		p.ReleaseHeld(res.Handle)
		if n == 0 {
			t.Fatalf("%s → %s: no blocks moved (the prefix cache already had them?)", dir[0], dir[1])
		}
		got := append([]int32{res.First.Token}, generate(d, append(slices.Clone(prompt), res.First.Token), maxTokens-1)...)
		im.Release()
		if !slices.Equal(got, alone[dir[1]]) {
			t.Errorf("prefill on %s, %d blocks moved, decode on %s: %v\nalone: %v", dir[0], n, dir[1], got, alone[dir[1]])
		}
	}
}
