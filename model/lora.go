package model

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"tandem/gguf"
	"tandem/hal"
	"tandem/safetensors"
)

// An Adapter is a LoRA adapter loaded for one model: per layer, the low-rank updates of the
// projections it targets (hal.LowRank, nil where it has none). A forward pass applies it to
// the rows of the sequences that name it (Batch.Adapters), after the base matmul that all
// the batch's rows share. An Adapter is read-only once loaded.
type Adapter struct {
	Layers []AdapterLayer
	// Rank is the largest rank of its updates; Targets the projections it updates, by
	// their GGUF names without the layer (attn_q, ffn_down, …), sorted.
	Rank    int
	Targets []string
	// Format is "gguf" (llama.cpp's adapter files) or "peft" (a Hugging Face PEFT
	// directory); ID the first 16 hex digits of the SHA-256 of its file (or of its
	// directory's two files), which names its content: the block hash salt of its
	// sequences includes it, so two adapters of one name but other weights never share KV.
	Format string
	ID     string
	// Bytes is the memory its float32 updates take.
	Bytes int64

	model *Model
}

// AdapterLayer holds one layer's updates; nil ones are not targeted.
type AdapterLayer struct {
	Q, K, V, O, Gate, Up, Down *hal.LowRank
}

// update is where the update of the projection role is kept.
func (l *AdapterLayer) update(role TensorRole) **hal.LowRank {
	switch role {
	case RoleQ:
		return &l.Q
	case RoleK:
		return &l.K
	case RoleV:
		return &l.V
	case RoleO:
		return &l.O
	case RoleGate:
		return &l.Gate
	case RoleUp:
		return &l.Up
	case RoleDown:
		return &l.Down
	}
	return nil
}

// For reports whether the adapter was loaded for m.
func (a *Adapter) For(m *Model) bool { return a.model == m }

// maxAdapterBytes bounds an adapter's files (they are read whole): a rank-256 adapter of
// every projection of an 8B model in float32 is about 3 GiB.
const maxAdapterBytes = 8 << 30

// LoadAdapter reads a LoRA adapter for m: a GGUF adapter file as llama.cpp's
// convert_lora_to_gguf.py writes it (general.type "adapter", adapter.type "lora",
// adapter.lora.alpha, tensors "<base tensor>.lora_a" and ".lora_b"), or a Hugging Face PEFT
// directory (adapter_config.json and adapter_model.safetensors). It targets the attention
// and feed-forward projections (q, k, v, o, gate, up, down) of any layer; an adapter of
// another architecture or shape, one that targets other tensors (the embedding, the output,
// norms), or one whose method is not plain LoRA (DoRA, biases, saved modules) is refused
// with the reason. be converts the adapter's tensors to float32.
func LoadAdapter(path string, m *Model, be hal.Backend) (*Adapter, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("model: adapter: %w", err)
	}
	var a *Adapter
	if st.IsDir() {
		a, err = loadPEFT(path, m, be)
	} else {
		a, err = loadGGUFAdapter(path, m, be)
	}
	if err != nil {
		return nil, fmt.Errorf("model: adapter %s: %w", path, err)
	}
	return a, nil
}

// readAdapterFile reads a whole adapter file, bounded, into memory and adds it to the
// content hash.
func readAdapterFile(path string, h interface{ Write([]byte) (int, error) }) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > maxAdapterBytes {
		return nil, fmt.Errorf("%s is %d bytes: larger than any adapter (%d)", path, st.Size(), int64(maxAdapterBytes))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	h.Write(data)
	return data, nil
}

// newAdapter is an empty adapter of m.
func newAdapter(m *Model, format string, sum []byte) *Adapter {
	return &Adapter{Layers: make([]AdapterLayer, m.Config.Layers), Format: format, ID: hex.EncodeToString(sum[:8]), model: m}
}

// projections are the adapter's possible targets: m's matrix specs of the roles LoRA
// updates, by GGUF name.
func projections(m *Model) map[string]TensorSpec {
	arch, _ := LookupArch(m.Config.Arch)
	out := map[string]TensorSpec{}
	for _, ts := range arch.TensorSpecs(&m.Config) {
		switch ts.Role {
		case RoleQ, RoleK, RoleV, RoleO, RoleGate, RoleUp, RoleDown:
			out[ts.GGUF] = ts
		}
	}
	return out
}

// tensorF32 is one adapter tensor as float32 with its shape as [rows, cols].
type tensorF32 struct {
	rows, cols int
	v          []float32
}

// toF32 converts a tensor of rows × cols elements of type t to float32.
func toF32(name string, t hal.DType, rows, cols int, data []byte, be hal.Backend) (tensorF32, error) {
	switch t {
	case hal.F32, hal.F16, hal.BF16, hal.Q8_0:
	default:
		return tensorF32{}, fmt.Errorf("tensor %s: type %s (want F32, F16, BF16 or Q8_0)", name, t)
	}
	if rows > 1<<24 || cols > 1<<24 {
		return tensorF32{}, fmt.Errorf("tensor %s: %d × %d: larger than any projection", name, rows, cols)
	}
	rb, err := t.RowBytes(cols)
	if err != nil {
		return tensorF32{}, fmt.Errorf("tensor %s: %w", name, err)
	}
	if rows <= 0 || cols <= 0 || len(data) != rb*rows {
		return tensorF32{}, fmt.Errorf("tensor %s: %d bytes for %d × %d %s", name, len(data), rows, cols, t)
	}
	v := make([]float32, rows*cols)
	for r := range rows {
		be.Dequantize(v[r*cols:(r+1)*cols], t, data[r*rb:(r+1)*rb])
	}
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return tensorF32{}, fmt.Errorf("tensor %s holds %v", name, x)
		}
	}
	return tensorF32{rows: rows, cols: cols, v: v}, nil
}

// set makes A (rank × in) and B (out × rank) the update of the projection ts, with the
// given scale. neoxB says whether B's rows rotate NEOX-style halves (Hugging Face order);
// where m's q and k rows are in llama.cpp's permuted order (or the other way round), B's
// rows of q and k are permuted to match.
func (a *Adapter) set(ts TensorSpec, A, B tensorF32, scale float64, neoxB bool) error {
	out, in := ts.Shape[0], ts.Shape[1]
	switch {
	case A.cols != in || B.rows != out:
		return fmt.Errorf("%s: lora_a is %d × %d and lora_b %d × %d; the weight is %d × %d (rank × %d and %d × rank wanted; hint: A and B transposed?)",
			ts.GGUF, A.rows, A.cols, B.rows, B.cols, out, in, in, out)
	case A.rows != B.cols:
		return fmt.Errorf("%s: lora_a has rank %d, lora_b %d", ts.GGUF, A.rows, B.cols)
	case math.IsNaN(scale) || math.IsInf(scale, 0):
		return fmt.Errorf("%s: scale %v", ts.GGUF, scale)
	}
	rank := A.rows
	perm := a.model.qkPermutation(ts, neoxB)
	w := &hal.LowRank{Rank: rank, In: in, Out: out, A: A.v, BT: make([]float32, rank*out), Scale: float32(scale)}
	for row := range out {
		dst := perm(row)
		for i := range rank {
			w.BT[i*out+dst] = B.v[row*rank+i]
		}
	}
	slot := a.Layers[ts.Layer].update(ts.Role)
	if *slot != nil {
		return fmt.Errorf("%s is updated twice", ts.GGUF)
	}
	*slot = w
	a.Rank = max(a.Rank, rank)
	a.Bytes += int64(len(w.A)+len(w.BT)) * 4
	target := strings.TrimSuffix(strings.TrimPrefix(ts.GGUF, fmt.Sprintf("blk.%d.", ts.Layer)), ".weight")
	if !slices.Contains(a.Targets, target) {
		a.Targets = append(a.Targets, target)
		slices.Sort(a.Targets)
	}
	return nil
}

func loadGGUFAdapter(path string, m *Model, be hal.Backend) (*Adapter, error) {
	h := sha256.New()
	data, err := readAdapterFile(path, h)
	if err != nil {
		return nil, err
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return nil, err
	}
	if typ, _ := f.String("general.type"); typ != "adapter" {
		return nil, fmt.Errorf("general.type is %q: not an adapter (a model file?)", typ)
	}
	if typ, _ := f.String("adapter.type"); typ != "lora" {
		return nil, fmt.Errorf("adapter.type is %q: only LoRA adapters are supported", typ)
	}
	if arch, _ := f.String("general.architecture"); arch != m.Config.Arch {
		return nil, fmt.Errorf("an adapter for architecture %q, the model is %q", arch, m.Config.Arch)
	}
	alpha, _ := f.Float("adapter.lora.alpha")
	a := newAdapter(m, "gguf", h.Sum(nil))
	arch, _ := LookupArch(m.Config.Arch)
	specs := projections(m)
	pairs := map[string][2]*gguf.TensorInfo{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		base, part, ok := strings.Cut(ti.Name, ".lora_")
		if !ok || (part != "a" && part != "b") {
			return nil, fmt.Errorf("tensor %s is not a LoRA tensor (<weight>.lora_a or .lora_b)", ti.Name)
		}
		if _, ok := specs[base]; !ok {
			return nil, fmt.Errorf("tensor %s updates %s, which is not a projection of this %d-layer model (LoRA covers attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up and ffn_down)", ti.Name, base, m.Config.Layers)
		}
		if len(ti.Dims) != 2 {
			return nil, fmt.Errorf("tensor %s has %d dimensions, want 2", ti.Name, len(ti.Dims))
		}
		p := pairs[base]
		p[map[string]int{"a": 0, "b": 1}[part]] = ti
		pairs[base] = p
	}
	if len(pairs) == 0 {
		return nil, errors.New("no LoRA tensors")
	}
	for base, p := range pairs {
		if p[0] == nil || p[1] == nil {
			return nil, fmt.Errorf("%s has only one of lora_a and lora_b", base)
		}
		// ggml's dims are [cols, rows].
		A, err := toF32(p[0].Name, p[0].Type, int(p[0].Dims[1]), int(p[0].Dims[0]), f.TensorData(p[0]), be)
		if err != nil {
			return nil, err
		}
		B, err := toF32(p[1].Name, p[1].Type, int(p[1].Dims[1]), int(p[1].Dims[0]), f.TensorData(p[1]), be)
		if err != nil {
			return nil, err
		}
		// llama.cpp: scale = alpha / rank, or 1 without an alpha.
		scale := 1.0
		if alpha != 0 {
			scale = alpha / float64(B.cols)
		}
		if err := a.set(specs[base], A, B, scale, arch.GGUFNeox); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// peftConfig is the part of adapter_config.json that decides what the adapter computes.
type peftConfig struct {
	PeftType      string             `json:"peft_type"`
	R             int                `json:"r"`
	Alpha         float64            `json:"lora_alpha"`
	RSLoRA        bool               `json:"use_rslora"`
	DoRA          bool               `json:"use_dora"`
	Bias          string             `json:"bias"`
	FanInFanOut   bool               `json:"fan_in_fan_out"`
	ModulesToSave []string           `json:"modules_to_save"`
	RankPattern   map[string]int     `json:"rank_pattern"`
	AlphaPattern  map[string]float64 `json:"alpha_pattern"`
}

// PEFT's file names in an adapter directory.
const (
	PEFTConfigFile  = "adapter_config.json"
	PEFTWeightsFile = "adapter_model.safetensors"
)

func loadPEFT(dir string, m *Model, be hal.Backend) (*Adapter, error) {
	h := sha256.New()
	raw, err := readAdapterFile(filepath.Join(dir, PEFTConfigFile), h)
	if err != nil {
		return nil, err
	}
	var pc peftConfig
	if err := json.Unmarshal(raw, &pc); err != nil {
		return nil, fmt.Errorf("%s: %w", PEFTConfigFile, err)
	}
	switch {
	case pc.PeftType != "" && pc.PeftType != "LORA":
		return nil, fmt.Errorf("%s: peft_type %q: only LORA is supported", PEFTConfigFile, pc.PeftType)
	case pc.DoRA:
		return nil, fmt.Errorf("%s: use_dora: DoRA adapters are not supported", PEFTConfigFile)
	case pc.Bias != "" && pc.Bias != "none":
		return nil, fmt.Errorf("%s: bias %q: adapters that train biases are not supported", PEFTConfigFile, pc.Bias)
	case pc.FanInFanOut:
		return nil, fmt.Errorf("%s: fan_in_fan_out: adapters of Conv1D layers (GPT-2) are not supported", PEFTConfigFile)
	case len(pc.ModulesToSave) > 0:
		return nil, fmt.Errorf("%s: modules_to_save %v: adapters that replace whole modules are not supported", PEFTConfigFile, pc.ModulesToSave)
	}
	data, err := readAdapterFile(filepath.Join(dir, PEFTWeightsFile), h)
	if err != nil {
		return nil, err
	}
	f, err := safetensors.Parse(data)
	if err != nil {
		return nil, err
	}
	alphaFor, err := peftAlphas(&pc)
	if err != nil {
		return nil, err
	}
	a := newAdapter(m, "peft", h.Sum(nil))
	byModule := map[string]TensorSpec{}
	for _, ts := range projections(m) {
		byModule[strings.TrimSuffix(ts.HF, ".weight")] = ts
	}
	type pair struct{ a, b *safetensors.TensorInfo }
	pairs := map[string]*pair{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		name := strings.Replace(ti.Name, ".default.weight", ".weight", 1) // an unsaved adapter's name
		module, part, ok := strings.Cut(strings.TrimPrefix(name, "base_model.model."), ".lora_")
		if !ok || (part != "A.weight" && part != "B.weight") {
			return nil, fmt.Errorf("tensor %s is not a LoRA weight (<module>.lora_A.weight or .lora_B.weight)", ti.Name)
		}
		if _, ok := byModule[module]; !ok {
			return nil, fmt.Errorf("tensor %s updates %s, which is not a projection of this %d-layer model (LoRA covers q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj)", ti.Name, module, m.Config.Layers)
		}
		if len(ti.Shape) != 2 || !ti.Supported() {
			return nil, fmt.Errorf("tensor %s: shape %v of %s, want a 2-D F32, F16 or BF16 matrix", ti.Name, ti.Shape, ti.DType)
		}
		p := pairs[module]
		if p == nil {
			p = &pair{}
			pairs[module] = p
		}
		if part == "A.weight" {
			p.a = ti
		} else {
			p.b = ti
		}
	}
	if len(pairs) == 0 {
		return nil, errors.New("no LoRA weights")
	}
	for module, p := range pairs {
		if p.a == nil || p.b == nil {
			return nil, fmt.Errorf("%s has only one of lora_A and lora_B", module)
		}
		A, err := toF32(p.a.Name, p.a.Type, int(p.a.Shape[0]), int(p.a.Shape[1]), f.TensorData(p.a), be)
		if err != nil {
			return nil, err
		}
		B, err := toF32(p.b.Name, p.b.Type, int(p.b.Shape[0]), int(p.b.Shape[1]), f.TensorData(p.b), be)
		if err != nil {
			return nil, err
		}
		rank := float64(A.rows)
		alpha := alphaFor(module)
		scale := alpha / rank
		if pc.RSLoRA {
			scale = alpha / math.Sqrt(rank)
		}
		if err := a.set(byModule[module], A, B, scale, true); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// peftAlphas returns the lora_alpha of each module: alpha_pattern's entry of the first key
// that matches the module's name as PEFT matches it (the key, as a regular expression, at
// the end of the name after a dot), else lora_alpha. (rank_pattern needs no reading: a
// module's rank is its tensors' shape.)
func peftAlphas(pc *peftConfig) (func(module string) float64, error) {
	type pat struct {
		re    *regexp.Regexp
		alpha float64
	}
	var pats []pat
	keys := make([]string, 0, len(pc.AlphaPattern))
	for k := range pc.AlphaPattern {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		re, err := regexp.Compile(`^(?:.*\.)?(?:` + k + `)$`)
		if err != nil {
			return nil, fmt.Errorf("%s: alpha_pattern key %q: %w", PEFTConfigFile, k, err)
		}
		pats = append(pats, pat{re, pc.AlphaPattern[k]})
	}
	return func(module string) float64 {
		for _, p := range pats {
			if p.re.MatchString(module) {
				return p.alpha
			}
		}
		if pc.Alpha == 0 {
			return 8 // PEFT's default lora_alpha
		}
		return pc.Alpha
	}, nil
}

// qkPermutation maps the rows of a q or k projection's update in the given order (neox:
// Hugging Face's, else llama.cpp's permuted GGUF order) to m's own rows, which differ where
// m's RoPE layout differs (a llama-family GGUF file's q and k rows are permuted so that RoPE
// rotates adjacent pairs). Other projections' rows map to themselves.
func (m *Model) qkPermutation(ts TensorSpec, neox bool) func(row int) int {
	c := &m.Config
	if (ts.Role != RoleQ && ts.Role != RoleK) || neox == c.RopeNeox {
		return func(row int) int { return row }
	}
	heads := c.Heads
	if ts.Role == RoleK {
		heads = c.KVHeads
	}
	hd := ts.Shape[0] / heads
	if neox {
		// Row (h, j·hd/2 + i) in Hugging Face's order is row (h, 2i + j) permuted.
		return func(row int) int {
			h, r := row/hd, row%hd
			j, i := r/(hd/2), r%(hd/2)
			return h*hd + 2*i + j
		}
	}
	return func(row int) int {
		h, r := row/hd, row%hd
		i, j := r/2, r%2
		return h*hd + j*(hd/2) + i
	}
}

// CanAdapt reports why be cannot apply LoRA adapters (nil: it can): it lacks the low-rank
// op, or it runs a step as one captured unit, which the updates would change.
func CanAdapt(be hal.Backend) error {
	if _, ok := be.(hal.LowRanker); !ok {
		return fmt.Errorf("model: the %s backend has no low-rank op: it cannot apply LoRA adapters", be.Name())
	}
	if _, ok := be.(hal.StepCapturer); ok {
		return fmt.Errorf("model: the %s backend captures steps, which LoRA adapters would change: it cannot apply them", be.Name())
	}
	return nil
}

// loraStep is a Runner's view of a step's adapters: the runs of rows that take an adapter.
type loraStep struct {
	op    hal.LowRanker // the backend's, nil where it has none
	runs  []adapterRun  // this step's; empty when no row takes an adapter
	spans []hal.LowRankSpan
}

// adapterRun is rows Row … Row+Rows−1 of a step, of one sequence with adapter a.
type adapterRun struct {
	row, rows int
	a         *Adapter
}

// setAdapters reads b's adapters into the step's runs, checking them.
func (r *Runner) setAdapters(b *Batch) error {
	l := &r.lora
	l.runs = l.runs[:0]
	if len(b.Adapters) == 0 {
		return nil
	}
	if len(b.Adapters) != len(b.Attn.Blocks) {
		return fmt.Errorf("model: %d adapters for a batch of %d sequences", len(b.Adapters), len(b.Attn.Blocks))
	}
	for i, seq := range b.Attn.SeqOf {
		if seq < 0 || int(seq) >= len(b.Adapters) {
			return fmt.Errorf("model: token %d of sequence %d in a batch of %d sequences", i, seq, len(b.Adapters))
		}
		a := b.Adapters[seq]
		if a == nil {
			continue
		}
		if n := len(l.runs); n > 0 && l.runs[n-1].a == a && l.runs[n-1].row+l.runs[n-1].rows == i {
			l.runs[n-1].rows++
			continue
		}
		if !a.For(r.M) {
			return errors.New("model: an adapter loaded for another model")
		}
		if l.op == nil {
			return fmt.Errorf("model: the %s backend has no low-rank op: it cannot apply LoRA adapters", r.Be.Name())
		}
		if r.capture != nil {
			return fmt.Errorf("model: the %s backend captures steps, which LoRA adapters would change: it cannot apply them", r.Be.Name())
		}
		l.runs = append(l.runs, adapterRun{row: i, rows: 1, a: a})
	}
	return nil
}

// adapt adds the adapters' updates of projection role in layer li to out, the projection's
// output for rows lo … hi−1 of the step, whose input is x (the same rows).
func (r *Runner) adapt(out, x hal.Buf, li int, role TensorRole, lo, hi int) {
	l := &r.lora
	if len(l.runs) == 0 {
		return
	}
	l.spans = l.spans[:0]
	for _, run := range l.runs {
		w := *run.a.Layers[li].update(role)
		a, b := max(run.row, lo), min(run.row+run.rows, hi)
		if w == nil || a >= b {
			continue
		}
		l.spans = append(l.spans, hal.LowRankSpan{Row: a - lo, Rows: b - a, W: w})
	}
	if len(l.spans) > 0 {
		l.op.AddLowRank(out, x, l.spans)
	}
}
