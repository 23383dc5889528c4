package hal

// Optional ops. A backend implements those it has a use for; the model asks for each with a
// type assertion once, when it starts on a backend, and does without it otherwise, with the
// same results.

// MultiMatMuler multiplies one input by several weights in one pass (a layer's q, k and v;
// the FFN's gate and up): one conversion of x and one job over all the rows, instead of one
// per weight. Each product is the bits MatMul would give.
type MultiMatMuler interface {
	MatMuls(x Buf, rows int, ps []MatMulOut)
}

// WeightPreparer is a backend that keeps some weights in a layout or memory of its own
// (hal/cpu's packed copies; a GPU's device copies). PrepareWeight makes that copy now rather
// than at the weight's first use, and reports whether there is one: a weight with a copy is
// not read from its file by the ops, and the backend may drop its file pages from the
// resident set as it copies.
type WeightPreparer interface {
	PrepareWeight(w *Weight) bool
}

// Prepared is a weight's prepared form outside its backend: Format names the layout of
// Data with a stable, versioned string ("cpu-pack/q8_0.vnni/1"), which changes whenever
// the bytes a backend makes of a weight would change, so that two processes whose formats
// are equal can use each other's bytes as their own.
type Prepared struct {
	Format string
	Data   []byte
}

// WeightPorter is a WeightPreparer whose prepared forms can leave the process and come
// back without being made again: a restart maps them from a file (the pack cache), a new
// engine receives them from a running peer. Making them is what it saves: hal/cpu's packing
// of a 1B model takes seconds, a GPU's upload would take its conversion.
type WeightPorter interface {
	WeightPreparer
	// PreparedKey names everything the backend's prepared forms depend on besides the
	// weights themselves: the backend and the features its kernels were chosen for
	// ("cpu avx512vnni+bf16"). Caches of prepared forms are keyed by it.
	PreparedKey() string
	// PreparedFormat returns the format and the size in bytes of the prepared form w would
	// have on this backend, without making it; ok is false when w has none (it is read in
	// place).
	PreparedFormat(w *Weight) (format string, size int, ok bool)
	// ExportWeight returns w's prepared form, making it first if need be. Its Data is the
	// backend's memory: read only, and valid until Close.
	ExportWeight(w *Weight) (p Prepared, ok bool)
	// AllocPrepared returns n bytes of memory suited to prepared forms (hal/cpu: aligned
	// to huge pages), for a caller that assembles prepared forms to import, and the
	// function that releases it. After a successful ImportWeights of forms in it, it is the
	// backend's (pass release there); otherwise the caller calls release.
	AllocPrepared(n int) (mem []byte, release func())
	// ImportWeights makes ps[i] the prepared form of ws[i], without making it again: all
	// of them, or, on an error, none (a format or size that is not PreparedFormat's is
	// one). The backend may compute from the bytes in place (hal/cpu does), so it owns
	// them from then on: release, if not nil, is called once none of them is read any more
	// (at Close on hal/cpu; at once on a backend that copies them to a device).
	ImportWeights(ws []*Weight, ps []Prepared, release func()) error
}

// Step is one forward step's host memory: the inputs the ops of the step read (token ids,
// positions, owning sequences and block tables, the rows whose logits are wanted), the KV
// store they read and write, and the logits they write. Nothing else crosses between the
// host and the backend during a step.
type Step struct {
	Tokens  []int32
	Attn    *AttnBatch
	Outputs []int
	KV      KVStore
	Logits  []float32
}

// StepShape is what fixes the ops of a forward step: for steps of equal shape the model
// issues the same ops, in the same order, on the same buffers, weights and store, with the
// same sizes; only the contents of the Step's inputs differ.
type StepShape struct {
	Tokens, Seqs, Outputs int
}

// Shape is s's StepShape.
func (s *Step) Shape() StepShape {
	return StepShape{Tokens: len(s.Tokens), Seqs: len(s.Attn.Blocks), Outputs: len(s.Outputs)}
}

// StepCapturer is a backend that runs a whole forward step as one unit, recorded once and
// replayed (a CUDA graph; a Vulkan command buffer): launching a decode step's hundreds of
// small kernels one by one would cost more than the kernels do.
//
// The model brackets every forward step with BeginStep and EndStep. BeginStep either replays
// a step the backend captured for s's shape (and store) on s's current inputs, writes the
// logits into s.Logits and returns true, in which case the model issues no ops; or returns
// false, and the model issues the step's ops, which the backend may record as the capture for
// that shape. Either way the model calls EndStep, which waits for the step and returns its
// error.
//
// What the model promises, and a capture relies on: the host slices a step's ops receive are
// s's fields, or ranges of them (Tokens to Embed, Attn.Pos to RoPE, Attn to StoreKV and
// Attention, Outputs to CopyRows, Logits to Logits), so that a replay finds its inputs where
// s has them now; steps of equal shape issue the same ops on the same Bufs (StepShape); and a
// Buf the model stops using is freed (FreeBuf), which drops the captures that use it.
type StepCapturer interface {
	BeginStep(s *Step) (replayed bool)
	EndStep() error
}

// LowRank is one LoRA adapter's update of one projection W (Out × In): out += B·(Scale·A·x),
// with A of Rank × In and B of Out × Rank. It is held as float32 host slices, A row-major
// as adapter files store it and B transposed (BT, Rank × Out), the layout the update reads:
// adapters are a few MiB and come and go at run time, so they are neither in a file's
// format nor prepared by the backend.
type LowRank struct {
	Rank, In, Out int
	A             []float32 // Rank × In
	BT            []float32 // Rank × Out: B transposed
	Scale         float32   // alpha / rank, as the adapter's config says
}

// LowRankSpan says that rows Row … Row+Rows−1 of a batch take W's update.
type LowRankSpan struct {
	Row, Rows int
	W         *LowRank
}

// LowRanker adds LoRA adapters' low-rank updates to a projection's output: the rows of a
// batch that belong to sequences with an adapter, each its own adapter's (the base matmul
// ran once for the whole batch). x holds the projection's input rows (In wide) and out its
// output rows (Out wide), both of the whole batch; rows in no span are left alone.
//
// Every output row is computed from its own input row alone, in this order, so the update
// is batch-invariant and a backend's bits can be held to a reference:
//
//	t[i]   = Σ_k A[i][k]·x[k]  for i < Rank: the products rounded to float32, added into
//	         16 float32 lanes (element k into lane k mod 16, in order of k) for the first
//	         In − In mod 16 elements; the lanes folded as lane l + lane l+8, then l + l+4,
//	         l + l+2, l + l+1; the remaining products added in order after
//	s[i]   = Scale·t[i]
//	u[j]   = (((0 + s[0]·BT[0][j]) + s[1]·BT[1][j]) + …) + s[Rank−1]·BT[Rank−1][j]
//	out[j] = out[j] + u[j]
//
// with every product rounded to float32 before its addition (no fused multiply-add). A
// backend without the op cannot serve adapters (the engine refuses them on it).
type LowRanker interface {
	AddLowRank(out, x Buf, spans []LowRankSpan)
}
