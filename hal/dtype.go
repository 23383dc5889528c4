package hal

import "tandem/dtype"

// DType is the element type of a tensor (see package dtype), named here so
// the op set reads on its own.
type DType = dtype.DType

// Tensor types, as in package dtype.
const (
	F32  = dtype.F32
	F16  = dtype.F16
	Q4_0 = dtype.Q4_0
	Q4_1 = dtype.Q4_1
	Q5_0 = dtype.Q5_0
	Q5_1 = dtype.Q5_1
	Q8_0 = dtype.Q8_0
	Q8_1 = dtype.Q8_1
	Q2_K = dtype.Q2_K
	Q3_K = dtype.Q3_K
	Q4_K = dtype.Q4_K
	Q5_K = dtype.Q5_K
	Q6_K = dtype.Q6_K
	Q8_K = dtype.Q8_K
	I8   = dtype.I8
	I16  = dtype.I16
	I32  = dtype.I32
	I64  = dtype.I64
	F64  = dtype.F64
	BF16 = dtype.BF16
)

// ParseDType accepts a type name such as "q8_0" or "BF16".
func ParseDType(s string) (DType, error) { return dtype.Parse(s) }
