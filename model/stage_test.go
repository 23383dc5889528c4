package model

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
)

func TestStageSplit(t *testing.T) {
	for _, tc := range []struct {
		layers int
		spec   StageSpec
		want   string // "lo-hi,…" or the error's text
	}{
		{24, StageSpec{Count: 2}, "0-12,12-24"},
		{5, StageSpec{Count: 3}, "0-2,2-4,4-5"},
		{5, StageSpec{Count: 2, Sizes: []int{1, 4}}, "0-1,1-5"},
		{24, StageSpec{}, "0-24"},
		{2, StageSpec{Count: 3}, "each stage needs a layer"},
		{5, StageSpec{Count: 2, Sizes: []int{2, 2}}, "the split 2,2 has 4 layers, the model 5"},
		{5, StageSpec{Count: 2, Sizes: []int{5}}, "1 layer counts (5) for 2 stages"},
		{5, StageSpec{Count: 2, Index: 2}, "numbered 0 to 1"},
	} {
		st, err := tc.spec.Stages(tc.layers)
		got := ""
		if err != nil {
			got = err.Error()
		}
		for i, s := range st {
			if s.Index != i || s.Count != max(tc.spec.Count, 1) {
				t.Errorf("%+v: stage %d is %+v", tc.spec, i, s)
			}
			if i > 0 {
				got += ","
			}
			got += strconv.Itoa(s.Lo) + "-" + strconv.Itoa(s.Hi)
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%d layers, %+v: %q, want %q", tc.layers, tc.spec, got, tc.want)
		}
	}
	if s, err := ParseSizes("12, 12"); err != nil || !slices.Equal(s, []int{12, 12}) || FormatSizes(s) != "12,12" {
		t.Errorf("ParseSizes: %v %v", s, err)
	}
	if _, err := ParseSizes("12,0"); err == nil {
		t.Error("ParseSizes took a stage of no layers")
	}
}

// TestStagesMatchWhole runs batches through a model's stages, each loaded alone with its own
// KV store, handing each stage's hidden states to the next, and checks that the logits are
// the whole model's bits: the forward pass a pipeline replica runs is the engine's.
func TestStagesMatchWhole(t *testing.T) {
	be := cpu.New(0)
	defer be.Close()
	for _, tc := range []struct {
		name  string
		specs []StageSpec
	}{
		{"stories260K-f32.gguf", []StageSpec{{Count: 2}, {Count: 3}, {Count: 2, Sizes: []int{4, 1}}}},
		{"rand-qwen2-tok512-f32.gguf", []StageSpec{{Count: 2}}},       // biases, tied output
		{"rand-qwen3-tok512-f32.gguf", []StageSpec{{Count: 2}}},       // q/k norms, tied
		{"rand-llama256-tok512-q4_k_m.gguf", []StageSpec{{Count: 2}}}, // K-quants, untied
	} {
		path := fixtures.Model(t, tc.name)
		whole, err := Load(path, be)
		if err != nil {
			t.Fatal(err)
		}
		want := stageLogits(t, []*Model{whole}, be)
		for _, sp := range tc.specs {
			var ms []*Model
			var bytes int64
			for i := range max(sp.Count, 1) {
				sp.Index = i
				m, err := LoadStage(path, be, sp)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				ms = append(ms, m)
				bytes += m.WeightBytes
				if !m.Stage.Last() && (m.Output != nil || m.OutputNorm != nil || slices.Contains(m.Matrices(), m.Embedding)) {
					t.Errorf("%s %s: holds the output matrix or norm", tc.name, m.Stage)
				}
				if m.KVLayout(1, 16).Layers != m.Stage.Layers() {
					t.Errorf("%s %s: KV layout of %d layers", tc.name, m.Stage, m.KVLayout(1, 16).Layers)
				}
			}
			if tied := whole.Output == whole.Embedding; tied && bytes != whole.WeightBytes+int64(len(whole.Embedding.Data)) ||
				!tied && bytes != whole.WeightBytes {
				t.Errorf("%s %+v: the stages load %d bytes of weights, the whole model %d (tied %v)", tc.name, sp, bytes, whole.WeightBytes, tied)
			}
			got := stageLogits(t, ms, be)
			for i := range want {
				if !slices.EqualFunc(got[i], want[i], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
					t.Errorf("%s %+v: step %d's logits differ from the whole model's", tc.name, sp, i)
				}
			}
		}
		whole.Close()
	}
	// A staged model is not run whole.
	m, err := LoadStage(fixtures.Model(t, "stories260K-f32.gguf"), be, StageSpec{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := NewRunner(m, be).Forward(nil, &Batch{Tokens: []int32{1}}, nil); err == nil || !strings.Contains(err.Error(), "ForwardStage") {
		t.Errorf("Forward of a stage: %v", err)
	}
}

// stageLogits runs three steps of two sequences (a prompt chunk each, then a chunk and a
// decode, then two decodes) through the stages in turn and returns each step's logits.
func stageLogits(t *testing.T, stages []*Model, be hal.Backend) [][]float32 {
	t.Helper()
	const bs = 4
	embd, vocab := stages[0].Config.Embd, stages[0].Config.VocabSize
	kvs := make([]hal.KVStore, len(stages))
	runners := make([]*Runner, len(stages))
	for i, m := range stages {
		kv, err := be.NewKVStore(m.KVLayout(16, bs))
		if err != nil {
			t.Fatal(err)
		}
		kvs[i], runners[i] = kv, NewRunner(m, be)
	}
	seqs := [][]int32{{1, 45, 67, 89, 23, 11, 300, 21, 5, 7}, {1, 99, 100, 101, 102, 7}}
	tables := [][]int32{{3, 1, 5}, {0, 2}}
	steps := [][]int{{6, 3}, {3, 3}, {1, 0}}
	done := []int{0, 0}
	var out [][]float32
	for _, step := range steps {
		b := &Batch{Attn: hal.AttnBatch{Blocks: tables}}
		for s, n := range step {
			for i := range n {
				p := done[s] + i
				b.Tokens = append(b.Tokens, seqs[s][p])
				b.Attn.Pos = append(b.Attn.Pos, int32(p))
				b.Attn.SeqOf = append(b.Attn.SeqOf, int32(s))
			}
			done[s] += n
			if n > 0 {
				b.Outputs = append(b.Outputs, len(b.Tokens)-1)
			}
		}
		logits := make([]float32, len(b.Outputs)*vocab)
		var in []float32
		for i, r := range runners {
			x := make([]float32, len(b.Tokens)*embd)
			sb := *b
			if i > 0 {
				sb.Tokens = nil // later stages see positions and tables, not tokens
			}
			if err := r.ForwardStage(kvs[i], &sb, in, x, logits); err != nil {
				t.Fatal(err)
			}
			in = x
		}
		out = append(out, logits)
	}
	return out
}
