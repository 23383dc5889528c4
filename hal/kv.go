package hal

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

// BlockBytes is the size of one block across all layers, keys and values: what
// KVStore.ReadBlock writes and WriteBlock reads.
func (l KVLayout) BlockBytes() int {
	return l.Layers * 2 * l.BlockSize * l.KVHeads * l.HeadDim * l.ElemBytes()
}

// KVStore is a backend's paged key/value memory.
//
// Block I/O is how KV moves between engines (disaggregated prefill and decode) and, later,
// between memory tiers. A block's bytes are, for each layer in order, the block's keys then
// its values, each KVHeads × BlockSize × HeadDim elements of the layout's DType,
// little-endian, in the order within a block that Format names. Two stores with equal
// Formats and Layouts (the number of blocks aside) keep a block in the same bytes, so the
// bytes one reads the other can write, with no conversion on either side.
//
// ReadBlock may run on another goroutine while a forward step runs, provided the step does
// not write that block (a full, committed block is never written again), and WriteBlock
// while the step neither reads nor writes it: hal/cpu copies host memory; a device store
// copies on a queue of its own.
type KVStore interface {
	Layout() KVLayout
	// Format names the order of a block's elements: stable across versions, versioned
	// ("cpu-kv/1"), never a Go type name, since it travels between processes that may run
	// different builds. A store whose blocks cannot be read and written returns "".
	Format() string
	// ReadBlock copies block's bytes (Layout().BlockBytes() of them) into dst.
	ReadBlock(block int, dst []byte) error
	// WriteBlock stores src, one block's bytes in Format, as block.
	WriteBlock(block int, src []byte) error
	// CopyBlock copies every layer's keys and values of block src to block dst.
	CopyBlock(dst, src int)
	// Bytes is the memory the store holds.
	Bytes() int64
}
