package model

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/hal/vulkan"
	"tandem/internal/vulkantest"
)

// runBatches feeds each sequence's tokens in the given pieces, all sequences
// sharing each forward step, and returns every position's logits per sequence.
// steps[k][s] is how many tokens sequence s feeds at step k.
func runBatches(t *testing.T, m *Model, be hal.Backend, bs int, seqs [][]int32, steps [][]int) [][][]float32 {
	t.Helper()
	return runAdaptedBatches(t, m, be, bs, seqs, nil, steps)
}

// runAdaptedBatches is runBatches with sequence s taking adapters[s] (nil: none).
func runAdaptedBatches(t *testing.T, m *Model, be hal.Backend, bs int, seqs [][]int32, adapters []*Adapter, steps [][]int) [][][]float32 {
	t.Helper()
	vocab := m.Config.VocabSize
	var tables [][]int32
	next := int32(0)
	for _, s := range seqs {
		n := (len(s) + bs - 1) / bs
		table := make([]int32, n)
		for i := range table {
			table[i] = next
			next++
		}
		tables = append(tables, table)
	}
	// Lay logical blocks out backwards in physical memory, so the test
	// depends on the block tables being followed.
	for _, table := range tables {
		for i := range table {
			table[i] = next - 1 - table[i]
		}
	}
	kv, err := be.NewKVStore(m.KVLayout(int(next), bs))
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(m, be)
	out := make([][][]float32, len(seqs))
	done := make([]int, len(seqs))
	for _, step := range steps {
		b := &Batch{Attn: hal.AttnBatch{Blocks: tables}, Adapters: adapters}
		var owners []int
		for s, n := range step {
			for i := 0; i < n; i++ {
				p := done[s] + i
				b.Tokens = append(b.Tokens, seqs[s][p])
				b.Attn.Pos = append(b.Attn.Pos, int32(p))
				b.Attn.SeqOf = append(b.Attn.SeqOf, int32(s))
				b.Outputs = append(b.Outputs, len(b.Tokens)-1)
				owners = append(owners, s)
			}
			done[s] += n
		}
		logits := make([]float32, len(b.Outputs)*vocab)
		if err := r.Forward(kv, b, logits); err != nil {
			t.Fatal(err)
		}
		for i, s := range owners {
			out[s] = append(out[s], logits[i*vocab:(i+1)*vocab])
		}
	}
	return out
}

// TestBatchInvariance checks that a sequence's logits are bit-for-bit the
// same alone, batched with other sequences, and under any prefill chunking,
// with an F32 and an F16 KV cache, in blocks of 4 (the scalar attention
// loops, and many blocks per sequence) and of 16 (the SIMD kernels).
func TestBatchInvariance(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	var runs []invarianceRun
	for _, name := range []string{"rand-qwen3-tok512-f32.gguf", "rand-llama-tok512-q8_0.gguf", "rand-llama256-tok512-q4_k_m.gguf", "rand-llama-tok512-bf16.gguf"} {
		runs = append(runs, invarianceRun{name, hal.F32, 4}, invarianceRun{name, hal.F16, 4})
	}
	// Head sizes 32 and 64: the AVX2 and AVX-512 kernels' paths.
	runs = append(runs, invarianceRun{"rand-qwen3-tok512-f32.gguf", hal.F32, 16}, invarianceRun{"rand-qwen3-tok512-f32.gguf", hal.F16, 16},
		invarianceRun{"rand-llama256-tok512-q4_k_m.gguf", hal.F32, 16}, invarianceRun{"rand-llama256-tok512-q4_k_m.gguf", hal.F16, 16})
	testBatchInvariance(t, be, runs)
}

// TestBatchInvarianceVulkan holds the Vulkan backend to the same: its
// matmuls' matrix-vector and tiled forms, and its attention, reduce a row in
// an order that depends on the row alone. Every step after the first of a
// shape is a replay of the captured one.
func TestBatchInvarianceVulkan(t *testing.T) {
	be := vulkantest.New(t, vulkan.Options{Device: -1})
	var runs []invarianceRun
	for _, name := range []string{"rand-qwen3-tok512-f32.gguf", "rand-llama-tok512-q8_0.gguf", "rand-llama256-tok512-q4_k_m.gguf", "rand-llama-tok512-f16.gguf", "rand-llama-tok512-bf16.gguf"} {
		runs = append(runs, invarianceRun{name, hal.F32, 16})
	}
	runs = append(runs, invarianceRun{"rand-llama256-tok512-q4_k_m.gguf", hal.F16, 4}, invarianceRun{"rand-qwen3-tok512-f32.gguf", hal.F16, 4})
	testBatchInvariance(t, be, runs)
	if st := be.Stats(); st.Replays == 0 {
		t.Errorf("no step was replayed: %+v", st)
	}
}

type invarianceRun struct {
	name   string
	kvType hal.DType
	bs     int
}

func testBatchInvariance(t *testing.T, be hal.Backend, runs []invarianceRun) {
	for _, rn := range runs {
		name, bs := rn.name, rn.bs
		t.Run(fmt.Sprintf("%s/kv-%v/bs%d", name, rn.kvType, bs), func(t *testing.T) {
			m := loadFixture(t, be, name)
			m.KVType = rn.kvType
			rng := rand.New(rand.NewPCG(1, 2))
			seq := func(n int) []int32 {
				s := make([]int32, n)
				for i := range s {
					s[i] = int32(rng.IntN(m.Config.VocabSize))
				}
				return s
			}
			a, b, c, d := seq(23), seq(9), seq(17), seq(50)
			alone := runBatches(t, m, be, bs, [][]int32{a}, [][]int{{23}})[0]

			cases := map[string]struct {
				seqs  [][]int32
				steps [][]int
			}{
				"batched with others": {[][]int32{b, a, c}, [][]int{{9, 23, 17}}},
				// 99 tokens, a at 59–81: the FFN runs in chunks of
				// ffnChunkRows and a straddles the first boundary.
				"across FFN chunks":         {[][]int32{d, b, a, c}, [][]int{{50, 9, 23, 17}}},
				"chunks of 1 (decode path)": {[][]int32{a}, repeat([]int{1}, 23)},
				"chunks 5+11+7":             {[][]int32{a}, [][]int{{5}, {11}, {7}}},
				"mixed prefill and decode":  {[][]int32{b, a, c}, [][]int{{9, 3, 0}, {0, 1, 17}, {0, 19, 0}}},
			}
			for cname, tc := range cases {
				got := runBatches(t, m, be, bs, tc.seqs, tc.steps)
				idx := 0
				for i, s := range tc.seqs {
					if &s[0] == &a[0] {
						idx = i
					}
				}
				for pos := range alone {
					for j := range alone[pos] {
						if alone[pos][j] != got[idx][pos][j] {
							t.Fatalf("%s: position %d logit %d: %v alone, %v here", cname, pos, j, alone[pos][j], got[idx][pos][j])
						}
					}
				}
			}
		})
	}
}

func repeat(step []int, n int) [][]int {
	out := make([][]int, n)
	for i := range out {
		out[i] = step
	}
	return out
}
