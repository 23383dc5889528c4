// Package dtype names tensor element types in ggml's numbering, with their
// block layouts: shared by the weight file formats and the device layer.
package dtype

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor. The numbering is ggml's, so a GGUF
// tensor's type field converts directly and files stay the source of truth.
type DType uint32

// Tensor types. Quantized types store blocks of BlockSize elements in
// TypeSize bytes; the others store one element per unit.
const (
	F32  DType = 0
	F16  DType = 1
	Q4_0 DType = 2
	Q4_1 DType = 3
	Q5_0 DType = 6
	Q5_1 DType = 7
	Q8_0 DType = 8
	Q8_1 DType = 9
	Q2_K DType = 10
	Q3_K DType = 11
	Q4_K DType = 12
	Q5_K DType = 13
	Q6_K DType = 14
	Q8_K DType = 15
	I8   DType = 24
	I16  DType = 25
	I32  DType = 26
	I64  DType = 27
	F64  DType = 28
	BF16 DType = 30
)

type dtypeInfo struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
}

var dtypeTable = map[DType]dtypeInfo{
	F32:  {"F32", 1, 4},
	F16:  {"F16", 1, 2},
	BF16: {"BF16", 1, 2},
	Q4_0: {"Q4_0", 32, 18},
	Q4_1: {"Q4_1", 32, 20},
	Q5_0: {"Q5_0", 32, 22},
	Q5_1: {"Q5_1", 32, 24},
	Q8_0: {"Q8_0", 32, 34},
	Q8_1: {"Q8_1", 32, 36},
	Q2_K: {"Q2_K", 256, 84},
	Q3_K: {"Q3_K", 256, 110},
	Q4_K: {"Q4_K", 256, 144},
	Q5_K: {"Q5_K", 256, 176},
	Q6_K: {"Q6_K", 256, 210},
	Q8_K: {"Q8_K", 256, 292},
	I8:   {"I8", 1, 1},
	I16:  {"I16", 1, 2},
	I32:  {"I32", 1, 4},
	I64:  {"I64", 1, 8},
	F64:  {"F64", 1, 8},
}

// Known reports whether t is a type whose layout this package knows.
func (t DType) Known() bool { _, ok := dtypeTable[t]; return ok }

func (t DType) String() string {
	if info, ok := dtypeTable[t]; ok {
		return info.name
	}
	return fmt.Sprintf("DType(%d)", uint32(t))
}

// BlockSize is the number of elements in one block (1 for unquantized types).
func (t DType) BlockSize() int { return dtypeTable[t].blockSize }

// TypeSize is the number of bytes in one block.
func (t DType) TypeSize() int { return dtypeTable[t].typeSize }

// Quantized reports whether t stores elements in blocks with shared scales.
func (t DType) Quantized() bool { return dtypeTable[t].blockSize > 1 }

// RowBytes returns the bytes needed for n elements, or an error when n is not
// a whole number of blocks or the type is unknown.
func (t DType) RowBytes(n int) (int, error) {
	info, ok := dtypeTable[t]
	if !ok {
		return 0, fmt.Errorf("dtype: unknown tensor type %d", uint32(t))
	}
	if n%info.blockSize != 0 {
		return 0, fmt.Errorf("dtype: %d elements is not a multiple of the %s block size %d", n, info.name, info.blockSize)
	}
	return n / info.blockSize * info.typeSize, nil
}

// Parse accepts a type name such as "q8_0" or "BF16".
func Parse(s string) (DType, error) {
	u := strings.ToUpper(s)
	for t, info := range dtypeTable {
		if info.name == u {
			return t, nil
		}
	}
	return 0, fmt.Errorf("dtype: unknown tensor type %q", s)
}
