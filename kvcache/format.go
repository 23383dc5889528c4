package kvcache

import (
	"errors"
	"fmt"
)

// BlockFormat describes a KV block as a transfer carries it: for each layer in order, the keys
// then the values of the block, each KVHeads × BlockSize × HeadDim values of DType,
// little-endian, in the order within a block that Store names (hal.KVStore's Format: hal/cpu's
// "cpu-kv/1" keeps keys [kv head][dim][slot] and values [kv head][slot][dim]). Two engines
// can exchange blocks only when their formats are equal.
type BlockFormat struct {
	Store     string // the KV store's block format, stable and versioned: "cpu-kv/1", SimFormat
	DType     string // "f32": IEEE float32; "f16": IEEE binary16; little-endian
	BlockSize int    // positions per block
	Layers    int
	KVHeads   int
	HeadDim   int
}

// BlockBytes is the size of one block in this format: what a transfer moves per block, or,
// for a modelled store, what it would move (and is counted and timed as moving).
func (f BlockFormat) BlockBytes() int {
	return f.Layers * 2 * f.BlockSize * f.KVHeads * f.HeadDim * dtypeSize(f.DType)
}

// SimFormat names the KV "store" of an engine whose forward pass is modelled
// (NewWithForwarder, the sim backend): it keeps no KV data.
const SimFormat = "sim-kv/1"

// Modelled reports whether blocks of this format are modelled rather than stored: a transfer
// of them carries no payload (WireBytes is 0) and takes the modelled time of BlockBytes.
func (f BlockFormat) Modelled() bool { return f.Store == SimFormat }

// WireBytes is the payload of one block as a transfer carries it: BlockBytes, or nothing for
// a modelled store.
func (f BlockFormat) WireBytes() int {
	if f.Modelled() {
		return 0
	}
	return f.BlockBytes()
}

func dtypeSize(t string) int {
	switch t {
	case "f32":
		return 4
	case "f16":
		return 2
	}
	return 0
}

func (f BlockFormat) String() string {
	return fmt.Sprintf("%s %s, block size %d, %d layers, %d KV heads, head dim %d", f.Store, f.DType, f.BlockSize, f.Layers, f.KVHeads, f.HeadDim)
}

// ErrBlockFormat is wrapped by the error of BlockFormat.Check.
var ErrBlockFormat = errors.New("KV layouts differ")

// Check returns nil if blocks in format other can be imported into an engine of format f,
// else an error naming both layouts: engines that store KV differently (another dtype, block
// size or model shape) cannot exchange blocks, and must recompute instead.
func (f BlockFormat) Check(other BlockFormat) error {
	if f == other && dtypeSize(f.DType) > 0 {
		return nil
	}
	return fmt.Errorf("%w: this engine stores %v; the other %v", ErrBlockFormat, f, other)
}
