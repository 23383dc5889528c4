package hal

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

// KVLayout is the shape of the paged key/value store: Layers × Blocks blocks,
// each holding BlockSize positions of KVHeads heads of HeadDim values of
// DType. The zero DType is F32; a backend may also offer F16 (half the
// memory, values rounded to nearest even as they are stored).
type KVLayout struct {
	Layers    int
	Blocks    int
	BlockSize int
	KVHeads   int
	HeadDim   int
	DType     DType
}

// ElemBytes is the size of one stored key or value element: 4 for F32, 2 for
// F16 and BF16, 0 for a type that is not a plain float.
func (l KVLayout) ElemBytes() int {
	switch l.DType {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
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
	Out []float32
	W   *Weight
}

// Backend is the op set a model's forward pass runs on. Activations are
// row-major float32 matrices; weights stay in their file format. Every op is
// batch-invariant: a row's result depends only on that row's inputs.
type Backend interface {
	Name() string
	// SupportsWeight reports whether MatMul and Embed accept weights of type t.
	SupportsWeight(t DType) bool
	// Dequantize converts len(dst) elements of type t from src.
	Dequantize(dst []float32, t DType, src []byte)
	// MatMul sets out[m][n] = Σ_k x[m][k]·W[n][k] for m < rows.
	MatMul(out, x []float32, rows int, w *Weight)
	// Embed copies the rows ids of w into out, converted to float32.
	Embed(out []float32, w *Weight, ids []int32)
	// RMSNorm normalises each row of x (rows of len(weight)) and scales by weight.
	RMSNorm(out, x, weight []float32, eps float32)
	// RoPE rotates each head of each row of x in place; row i is at pos[i].
	RoPE(x []float32, heads, headDim int, pos []int32, r *RoPE)
	// StoreKV writes the keys and values of each token of the batch into layer
	// layer of kv at the token's position.
	StoreKV(kv KVStore, layer int, k, v []float32, b *AttnBatch)
	// Attention computes causal attention of q (tokens × heads × headDim) over
	// layer layer of kv, with grouped-query heads, writing out (same shape as q).
	Attention(out, q []float32, heads int, scale float32, kv KVStore, layer int, b *AttnBatch)
	// SiLUMul sets gate[i] = silu(gate[i]) · up[i].
	SiLUMul(gate, up []float32)
	// Add sets dst[i] += src[i].
	Add(dst, src []float32)
	// AddBias adds bias to every row of x.
	AddBias(x, bias []float32)
	// NewKVStore allocates a paged key/value store.
	NewKVStore(layout KVLayout) (KVStore, error)
}

// KVStore is a backend's paged key/value memory.
type KVStore interface {
	Layout() KVLayout
	// CopyBlock copies every layer's keys and values of block src to block dst.
	CopyBlock(dst, src int)
	Bytes() int64
}
