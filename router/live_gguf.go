package router

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"tandem/tokenizer"
)

// readGGUFMetadata reads the metadata of a GGUF file (v2 or v3) into the value types package
// gguf uses, ignoring tensors. The router reads the tokenizer a model card carries with it;
// it does not import package gguf, which pulls in hal.
func readGGUFMetadata(b []byte) (tokenizer.MapMetadata, error) {
	r := &ggufReader{b: b}
	if string(r.take(4)) != "GGUF" {
		return nil, errors.New("router: tokenizer: not a GGUF file")
	}
	if v := r.u32(); v != 2 && v != 3 {
		return nil, fmt.Errorf("router: tokenizer: GGUF version %d", v)
	}
	r.u64() // tensors
	n := r.u64()
	if r.err != nil || n > uint64(len(b)) {
		return nil, errors.New("router: tokenizer: truncated GGUF header")
	}
	md := tokenizer.MapMetadata{}
	for range n {
		k := r.str()
		v := r.value(r.u32(), 0)
		if r.err != nil {
			return nil, fmt.Errorf("router: tokenizer: GGUF metadata: %w", r.err)
		}
		md[k] = v
	}
	return md, nil
}

type ggufReader struct {
	b   []byte
	off int
	err error
}

var errGGUFShort = errors.New("truncated")

func (r *ggufReader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = errGGUFShort
		}
		return make([]byte, max(n, 0))
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *ggufReader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *ggufReader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }

func (r *ggufReader) str() string {
	n := r.u64()
	if n > uint64(len(r.b)) {
		r.err = errGGUFShort
		return ""
	}
	return string(r.take(int(n)))
}

var ggufSizes = map[uint32]int{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

func (r *ggufReader) scalar(t uint32) any {
	le := binary.LittleEndian
	switch t {
	case 0:
		return r.take(1)[0]
	case 1:
		return int8(r.take(1)[0])
	case 2:
		return le.Uint16(r.take(2))
	case 3:
		return int16(le.Uint16(r.take(2)))
	case 4:
		return le.Uint32(r.take(4))
	case 5:
		return int32(le.Uint32(r.take(4)))
	case 6:
		return math.Float32frombits(le.Uint32(r.take(4)))
	case 7:
		return r.take(1)[0] != 0
	case 10:
		return le.Uint64(r.take(8))
	case 11:
		return int64(le.Uint64(r.take(8)))
	case 12:
		return math.Float64frombits(le.Uint64(r.take(8)))
	}
	r.err = fmt.Errorf("unknown value type %d", t)
	return nil
}

func (r *ggufReader) value(t uint32, depth int) any {
	switch t {
	case 8:
		return r.str()
	case 9:
		if depth > 4 {
			r.err = errors.New("arrays nested too deep")
			return nil
		}
		et := r.u32()
		n := r.u64()
		if r.err != nil || n > uint64(len(r.b)-r.off) {
			r.err = errGGUFShort
			return nil
		}
		switch et {
		case 8:
			s := make([]string, 0, n)
			for range n {
				s = append(s, r.str())
			}
			return s
		case 9:
			s := make([]any, 0, n)
			for range n {
				s = append(s, r.value(9, depth+1))
			}
			return s
		}
		if _, ok := ggufSizes[et]; !ok {
			r.err = fmt.Errorf("array of unknown value type %d", et)
			return nil
		}
		return arrayOf(r, et, int(n))
	}
	return r.scalar(t)
}

func arrayOf(r *ggufReader, et uint32, n int) any {
	switch et {
	case 0:
		return fill[uint8](r, et, n)
	case 1:
		return fill[int8](r, et, n)
	case 2:
		return fill[uint16](r, et, n)
	case 3:
		return fill[int16](r, et, n)
	case 4:
		return fill[uint32](r, et, n)
	case 5:
		return fill[int32](r, et, n)
	case 6:
		return fill[float32](r, et, n)
	case 7:
		return fill[bool](r, et, n)
	case 10:
		return fill[uint64](r, et, n)
	case 11:
		return fill[int64](r, et, n)
	}
	return fill[float64](r, et, n)
}

func fill[T any](r *ggufReader, et uint32, n int) []T {
	s := make([]T, n)
	for i := range s {
		v, _ := r.scalar(et).(T)
		s[i] = v
	}
	return s
}
