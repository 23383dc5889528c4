package hal

import "errors"

// Weight is a 2-D weight matrix as it lies in its file: Rows rows of Cols
// elements of Type, row-major, read in place (usually from an mmap).
type Weight struct {
	Name string
	Type DType
	Rows int
	Cols int
	Data []byte
}

// RowBytes is the size in bytes of one row.
func (w *Weight) RowBytes() int {
	n, _ := w.Type.RowBytes(w.Cols)
	return n
}

// RoPE describes a rotary position embedding.
type RoPE struct {
	Dims        int       // rotated dimensions per head (usually the head size)
	Base        float64   // frequency base
	Neox        bool      // rotate (i, i+Dims/2) pairs instead of adjacent (2i, 2i+1) pairs
	FreqFactors []float32 // optional per-pair divisors of the frequency (llama3 scaling); len Dims/2
	FreqScale   float32   // linear position scaling; 0 means 1
}

// AttnBatch describes a flattened batch of tokens from several sequences for
// attention over paged KV. Token i belongs to sequence SeqOf[i] and sits at
// position Pos[i] of it; it attends to positions 0..Pos[i] of its sequence.
type AttnBatch struct {
	Pos    []int32
	SeqOf  []int32
	Blocks [][]int32 // per sequence: physical block of each logical block
}

// MatMulOut is one product of a multi-weight matmul: Out = x·Wᵀ.
type MatMulOut struct {
	Out Buf
	W   *Weight
}

// Backend is a device and the op set a model's forward pass runs on it.
//
// Activations are Bufs: row-major float32 matrices in the backend's memory (host memory for
// hal/cpu, device memory for a GPU), so that they stay where the ops run from one op to the
// next. Weights stay in their file format, as host bytes the backend reads in place or copies
// once (WeightPreparer). A step's inputs (token ids, positions, block tables, the rows whose
// logits are wanted) are host slices, and Logits is the one op whose output is host memory.
// Vectors of parameters (norm weights, biases) are host slices that stay the same, and
// unchanged, for the model's life: a device backend may upload each once.
//
// Every op is batch-invariant: a row's result depends only on that row's inputs, with a fixed
// reduction order, so a sequence's logits do not depend on the rest of the batch.
//
// Errors. The ops that allocate return an error (NewBuf, NewKVStore; ErrOutOfMemory when the
// memory is not there). The compute ops do not: a device queues them and learns of a failure
// (the device lost, a kernel fault) only when it next waits, and hal/cpu's cannot fail (a bad
// argument is a programming error, and panics). Err reports the first such failure; after one,
// the backend may skip the ops that follow, and their outputs are undefined. The model checks
// Err once per forward step, after the step's Logits (where a device waits for the step), so
// the hot path carries no error returns.
//
// A Backend runs one forward step at a time; it is not safe for concurrent use, except for
// KVStore block I/O (see KVStore).
type Backend interface {
	Name() string
	// Close releases the backend's threads and memory. Buffers and KV stores it made are
	// invalid afterwards.
	Close() error
	// Err is the first failure of a compute op since the backend was made, nil if none. A
	// device backend that has failed stays failed (ErrDeviceLost, wrapped).
	Err() error

	// SupportsWeight reports whether MatMul, Logits and Embed accept weights of type t.
	SupportsWeight(t DType) bool
	// Dequantize converts len(dst) elements of type t from src, on the host (loading).
	Dequantize(dst []float32, t DType, src []byte)

	// NewBuf allocates an activation buffer of n float32 values; its contents are undefined.
	NewBuf(n int) (Buf, error)
	// FreeBuf releases a buffer NewBuf made (a no-op for memory the garbage collector owns).
	// A step captured with it (StepCapturer) is dropped.
	FreeBuf(b Buf)
	// WriteBuf copies src into dst (len(src) values) and ReadBuf dst from src: how tests and
	// tools move activations between the host and the device. A forward step does not call
	// them: its only host output is Logits.
	WriteBuf(dst Buf, src []float32) error
	ReadBuf(dst []float32, src Buf) error

	// MatMul sets out[m][n] = Σ_k x[m][k]·W[n][k] for m < rows.
	MatMul(out, x Buf, rows int, w *Weight)
	// Logits is MatMul with its output in host memory: the step's logits.
	Logits(dst []float32, x Buf, rows int, w *Weight)
	// Embed copies the rows ids of w into out, converted to float32.
	Embed(out Buf, w *Weight, ids []int32)
	// CopyRows sets row i of dst to row rows[i] of src, rows of width values.
	CopyRows(dst, src Buf, width int, rows []int)
	// RMSNorm normalises each row of x (rows of len(weight)) and scales by weight.
	RMSNorm(out, x Buf, weight []float32, eps float32)
	// RoPE rotates each head of each row of x in place; row i is at pos[i].
	RoPE(x Buf, heads, headDim int, pos []int32, r *RoPE)
	// StoreKV writes the keys and values of each token of the batch into layer
	// layer of kv at the token's position.
	StoreKV(kv KVStore, layer int, k, v Buf, b *AttnBatch)
	// Attention computes causal attention of q (tokens × heads × headDim) over
	// layer layer of kv, with grouped-query heads, writing out (same shape as q).
	Attention(out, q Buf, heads int, scale float32, kv KVStore, layer int, b *AttnBatch)
	// SiLUMul sets gate[i] = silu(gate[i]) · up[i].
	SiLUMul(gate, up Buf)
	// Add sets dst[i] += src[i].
	Add(dst, src Buf)
	// AddBias adds bias to every row of x.
	AddBias(x Buf, bias []float32)

	// NewKVStore allocates a paged key/value store.
	NewKVStore(layout KVLayout) (KVStore, error)
}

// ErrOutOfMemory is wrapped by the error of an allocation that found no memory for it.
var ErrOutOfMemory = errors.New("hal: out of memory")

// ErrDeviceLost is wrapped by Backend.Err once a device has failed (reset, removed, or a
// fault that leaves its memory undefined): nothing it holds, KV included, is usable.
var ErrDeviceLost = errors.New("hal: device lost")
