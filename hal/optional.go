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
