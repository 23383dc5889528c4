package vulkan

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"tandem/hal"
	"tandem/hal/cpu"
)

// devWeight is a weight matrix's copy in device memory, in one of the
// shaders' encodings (pipeline.go).
type devWeight struct {
	buf        *buffer
	enc        int
	rows, cols int
}

// encodingOf is the device encoding of weights of type t, and whether t is
// converted (dequantized to F32 at upload) for want of a kernel.
func encodingOf(t hal.DType) (enc int, converted bool) {
	switch t {
	case hal.F32:
		return encF32, false
	case hal.F16:
		return encF16, false
	case hal.BF16:
		return encBF16, false
	case hal.Q8_0:
		return encQ8_0, false
	case hal.Q4_K:
		return encQ4_K, false
	case hal.Q6_K:
		return encQ6_K, false
	}
	return encF32, true
}

// PrepareWeight uploads w now rather than at its first use. It reports
// false (the ops will read the file's bytes) only when the upload failed,
// which Err then reports.
func (b *Backend) PrepareWeight(w *hal.Weight) bool { return b.weight(w) != nil }

// weight is w's device copy, uploaded on first use; nil after a failure
// (recorded for Err).
func (b *Backend) weight(w *hal.Weight) *devWeight {
	if dw, ok := b.weights[w]; ok {
		return dw
	}
	if b.err != nil {
		return nil
	}
	dw, err := b.upload(w)
	if err != nil {
		b.fail(fmt.Errorf("vulkan: weight %s (%v, %d×%d): %w", w.Name, w.Type, w.Rows, w.Cols, err))
		return nil
	}
	b.weights[w] = dw
	return dw
}

func (b *Backend) upload(w *hal.Weight) (*devWeight, error) {
	enc, converted := encodingOf(w.Type)
	rb := w.RowBytes()
	if len(w.Data) < rb*w.Rows {
		return nil, fmt.Errorf("%d bytes, want %d", len(w.Data), rb*w.Rows)
	}
	var data []byte
	switch {
	case converted:
		b.noteConversion(w.Type)
		row := make([]float32, w.Cols)
		data = make([]byte, 4*w.Rows*w.Cols)
		for r := range w.Rows {
			cpu.DequantizeRow(w.Type, w.Data[r*rb:(r+1)*rb], row)
			copy(data[4*r*w.Cols:], unsafe.Slice((*byte)(unsafe.Pointer(&row[0])), 4*w.Cols))
		}
	case enc == encQ8_0:
		data = repackQ8_0(w.Data[:rb*w.Rows])
	case enc == encQ6_K:
		data = padBlocks(w.Data[:rb*w.Rows], 210, 212)
	default:
		data = w.Data[:rb*w.Rows]
	}
	buf, err := b.newBuffer(uint64(len(data)), memDevice)
	if err != nil {
		return nil, err
	}
	if err := b.write(buf, 0, data); err != nil {
		b.freeBuffer(buf)
		return nil, err
	}
	return &devWeight{buf: buf, enc: enc, rows: w.Rows, cols: w.Cols}, nil
}

// noteConversion counts a converted matrix and warns once per type.
func (b *Backend) noteConversion(t hal.DType) {
	b.convMu.Lock()
	b.converted[strings.ToLower(t.String())+"→f32"]++
	first := !b.warned[t]
	b.warned[t] = true
	b.convMu.Unlock()
	if first {
		b.log.Warn("vulkan: no kernel for this weight type; its matrices are converted to F32 at load (4 bytes a weight, exact values, float activations)",
			"type", t.String())
	}
}

// repackQ8_0 turns 34-byte Q8_0 blocks (FP16 scale, 32 int8) into 36-byte
// ones (the scale widened to float32 bits, then the 32 int8), so that the
// shaders read aligned words.
func repackQ8_0(src []byte) []byte {
	n := len(src) / 34
	out := make([]byte, 36*n)
	for i := range n {
		blk := src[34*i : 34*i+34]
		d := cpu.FP16ToFP32(binary.LittleEndian.Uint16(blk))
		binary.LittleEndian.PutUint32(out[36*i:], math.Float32bits(d))
		copy(out[36*i+4:36*i+36], blk[2:34])
	}
	return out
}

// padBlocks copies blocks of size from into blocks of size to (zero padded).
func padBlocks(src []byte, from, to int) []byte {
	n := len(src) / from
	out := make([]byte, to*n)
	for i := range n {
		copy(out[to*i:], src[from*i:from*(i+1)])
	}
	return out
}

// paramBuf is a norm weight or bias vector uploaded once (hal.Backend: they
// never change for the model's life).
type paramBuf struct {
	buf *buffer
	n   int
}

// param is the device address of v's copy.
func (b *Backend) param(v []float32) uint64 {
	if len(v) == 0 {
		return 0
	}
	k := &v[0]
	if p, ok := b.params[k]; ok && p.n == len(v) {
		return p.buf.addr
	} else if ok {
		b.retired = append(b.retired, p.buf) // a different length at the same address: a new vector
	}
	buf, err := b.newBuffer(uint64(4*len(v)), memDevice)
	if err == nil {
		err = b.write(buf, 0, unsafe.Slice((*byte)(unsafe.Pointer(k)), 4*len(v)))
	}
	if err != nil {
		b.fail(fmt.Errorf("vulkan: a parameter vector of %d values: %w", len(v), err))
		return 0
	}
	b.params[k] = &paramBuf{buf: buf, n: len(v)}
	return buf.addr
}

// ropeTable is the (cos, sin) of every pair at positions 0..cover-1 for one
// RoPE, computed on the host as hal/cpu's ropeCache computes them (angles by
// repeated float32 multiplication, cos and sin in float64): the GPU's own
// trigonometric functions are not that precise at large angles.
type ropeTable struct {
	buf     *buffer
	cover   int32
	dims    int
	recUsed bool // by the recording in progress
}

// minRopeCover is the positions a first table covers; it doubles as needed.
const minRopeCover = 1024

// rope is the table of r covering positions up to maxPos.
func (b *Backend) rope(r *hal.RoPE, maxPos int32) *ropeTable {
	t := b.ropes[r]
	if t != nil && t.cover > maxPos && t.dims == r.Dims {
		return t
	}
	cover := int32(minRopeCover)
	for cover <= maxPos {
		cover *= 2
	}
	pairs := r.Dims / 2
	vals := make([]float32, int(cover)*pairs*2)
	thetaScale := float32(math.Pow(r.Base, -2.0/float64(r.Dims)))
	freqScale := r.FreqScale
	if freqScale == 0 {
		freqScale = 1
	}
	for p := range int(cover) {
		theta := float32(p)
		row := vals[p*pairs*2 : (p+1)*pairs*2]
		for i := range pairs {
			ff := float32(1)
			if r.FreqFactors != nil {
				ff = r.FreqFactors[i]
			}
			th := freqScale * (theta / ff)
			row[2*i] = float32(math.Cos(float64(th)))
			row[2*i+1] = float32(math.Sin(float64(th)))
			theta *= thetaScale
		}
	}
	buf, err := b.newBuffer(uint64(4*len(vals)), memDevice)
	if err == nil {
		err = b.write(buf, 0, unsafe.Slice((*byte)(unsafe.Pointer(&vals[0])), 4*len(vals)))
	}
	if err != nil {
		b.fail(fmt.Errorf("vulkan: RoPE table of %d positions: %w", cover, err))
		return nil
	}
	if t != nil {
		// The captures read the old table: drop them, and keep it until
		// the step being recorded (which may have read it too) has run.
		b.dropCaptures()
		if t.recUsed && b.rec != nil {
			b.rec.dirty = true
		}
		b.retired = append(b.retired, t.buf)
	}
	nt := &ropeTable{buf: buf, cover: cover, dims: r.Dims}
	b.ropes[r] = nt
	return nt
}
