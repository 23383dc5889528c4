package model

import (
	"fmt"
	"strconv"
	"strings"
)

// A Stage is one pipeline stage's share of a model: stage Index of Count runs the layers
// [Lo, Hi); the first also embeds the tokens, the last also applies the output norm and
// the output matrix. The zero Stage (Count 0) is the whole model in one process.
type Stage struct {
	Index, Count int
	Lo, Hi       int
}

// Whole reports whether s is the whole model: no pipeline.
func (s Stage) Whole() bool { return s.Count <= 1 }

// First reports whether s embeds the tokens (the head stage, or the whole model).
func (s Stage) First() bool { return s.Index == 0 }

// Last reports whether s computes the logits (the tail stage, or the whole model).
func (s Stage) Last() bool { return s.Count <= 1 || s.Index == s.Count-1 }

// Layers is the number of layers the stage runs.
func (s Stage) Layers() int { return s.Hi - s.Lo }

func (s Stage) String() string {
	if s.Whole() {
		return "the whole model"
	}
	return fmt.Sprintf("stage %d of %d (layers %d-%d)", s.Index, s.Count, s.Lo, s.Hi-1)
}

// A StageSpec says how a model is cut into pipeline stages, and which one to load: Count
// stages of Sizes[i] layers each (nil: as even as possible, the earlier stages taking one
// more), and stage Index of them. The zero StageSpec is the whole model.
type StageSpec struct {
	Index, Count int
	Sizes        []int
}

// Stages cuts a model of the given layers into the spec's stages.
func (sp StageSpec) Stages(layers int) ([]Stage, error) {
	if sp.Count <= 1 {
		if len(sp.Sizes) > 1 || sp.Index != 0 {
			return nil, fmt.Errorf("model: stage %d with %d layer counts given, of a model in one stage", sp.Index, len(sp.Sizes))
		}
		return []Stage{{Index: 0, Count: 1, Lo: 0, Hi: layers}}, nil
	}
	switch {
	case sp.Index < 0 || sp.Index >= sp.Count:
		return nil, fmt.Errorf("model: stage %d of %d: the stages are numbered 0 to %d", sp.Index, sp.Count, sp.Count-1)
	case sp.Count > layers:
		return nil, fmt.Errorf("model: %d stages of a model of %d layers: each stage needs a layer at least", sp.Count, layers)
	case sp.Sizes != nil && len(sp.Sizes) != sp.Count:
		return nil, fmt.Errorf("model: %d layer counts (%s) for %d stages", len(sp.Sizes), FormatSizes(sp.Sizes), sp.Count)
	}
	sizes := sp.Sizes
	if sizes == nil {
		sizes = make([]int, sp.Count)
		for i := range sizes {
			sizes[i] = layers / sp.Count
			if i < layers%sp.Count {
				sizes[i]++
			}
		}
	}
	out := make([]Stage, sp.Count)
	lo := 0
	for i, n := range sizes {
		if n < 1 {
			return nil, fmt.Errorf("model: stage %d of the split %s has %d layers; each needs one at least", i, FormatSizes(sizes), n)
		}
		out[i] = Stage{Index: i, Count: sp.Count, Lo: lo, Hi: lo + n}
		lo += n
	}
	if lo != layers {
		return nil, fmt.Errorf("model: the split %s has %d layers, the model %d", FormatSizes(sizes), lo, layers)
	}
	return out, nil
}

// FormatSizes writes layer counts as the --stage-layers flag takes them: "12,12".
func FormatSizes(sizes []int) string {
	s := make([]string, len(sizes))
	for i, n := range sizes {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// ParseSizes reads layer counts written by FormatSizes.
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("model: layer counts %q: want positive numbers separated by commas, e.g. 12,12", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// wants reports whether a stage loads the tensor ts: its own layers' tensors, and of the
// others the token embedding (a reference into the mapped file, read by the first stage,
// and the output matrix of a tied model's last stage) and, for the last stage, the output
// norm and the output matrix.
func (s Stage) wants(ts TensorSpec) bool {
	if ts.Layer >= 0 {
		return ts.Layer >= s.Lo && ts.Layer < s.Hi
	}
	return ts.Role == RoleEmbedding || s.Last()
}

// layerRange is the layers the model's forward pass runs.
func (m *Model) layerRange() (lo, hi int) {
	if m.Stage.Whole() {
		return 0, len(m.Layers)
	}
	return m.Stage.Lo, m.Stage.Hi
}
