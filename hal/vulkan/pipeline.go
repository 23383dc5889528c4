package vulkan

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Every pipeline shares one layout: no descriptor sets, 128 bytes of push
// constants (the buffers' device addresses and the sizes).

// The device encodings of weights (the shaders' W_* constants).
const (
	encF32 = iota
	encF16
	encQ8_0
	encQ4_K
	encQ6_K
	encBF16
	numEnc
)

// The activation conversions of quantize.comp.
const (
	convQ8_0 = iota
	convQ8_K
	convF16
	convBF16
	numConv
)

// The ops of elementwise.comp.
const (
	opAdd = iota
	opSiLUMul
	opCopyRows
	numElementwise
)

// The matmul forms: matrix-vector products for one or two rows, computing
// 2, 8 or 32 outputs a workgroup, and a tile of 8 rows × 4 outputs for
// more rows. They differ in the outputs a workgroup computes, never in how
// one output is reduced (matmul.comp), so the choice is free: by the
// device and the matrix, not by anything that would change a row's bits.
const (
	formVec2 = iota
	formVec8
	formVec32
	formTile
	numForms
)

// tileRows and tileCols are each form's TM and TN.
var tileRows, tileCols = [numForms]uint32{1, 1, 1, 8}, [numForms]uint32{2, 8, 32, 4}

// matmulForm picks the form for rows × n outputs: the tile for more than
// two rows; else as many outputs a workgroup as leave 2048 workgroups or
// more (a GPU's cores all busy), and always 32 on a CPU device (lavapipe),
// where each workgroup costs a context switch per barrier.
func (b *Backend) matmulForm(rows, n int) int {
	switch {
	case b.form >= 0:
		return b.form // tests
	case rows > 2:
		return formTile
	case b.phys.props.deviceType == deviceTypeCPU || n >= 2048*32:
		return formVec32
	case n >= 2048*8:
		return formVec8
	}
	return formVec2
}

type pipelines struct {
	matmul      [numEnc][numForms]vkHandle
	embed       [numEnc]vkHandle
	quantize    [numConv]vkHandle
	elementwise [numElementwise]vkHandle
	storeKV     [2]vkHandle // F32, F16 store
	attention   [2]vkHandle
	rmsNorm     vkHandle
	rope        vkHandle
}

func (b *Backend) createPipelines() error {
	d := b.dev
	pr := &pushConstantRange{stageFlags: shaderStageCompute, size: maxPushConstantSize}
	li := &pipelineLayoutCreateInfo{sType: stPipelineLayoutCreateInfo, pushRangeCount: 1, pushConstantRang: pr}
	if err := check("vkCreatePipelineLayout", vkResult(ccall(d.fn.createPipelineLayout, d.h, uintptr(unsafe.Pointer(li)), 0, uintptr(unsafe.Pointer(&b.layout))))); err != nil {
		return err
	}
	p := &b.pipes
	type want struct {
		dst  *vkHandle
		spec []uint32
	}
	jobs := map[string][]want{}
	for e := range numEnc {
		for f := range numForms {
			jobs["matmul"] = append(jobs["matmul"], want{&p.matmul[e][f], []uint32{uint32(e), tileRows[f], tileCols[f]}})
		}
		jobs["embed"] = append(jobs["embed"], want{&p.embed[e], []uint32{uint32(e)}})
	}
	for c := range numConv {
		jobs["quantize"] = append(jobs["quantize"], want{&p.quantize[c], []uint32{uint32(c)}})
	}
	for o := range numElementwise {
		jobs["elementwise"] = append(jobs["elementwise"], want{&p.elementwise[o], []uint32{uint32(o)}})
	}
	for f := range 2 {
		jobs["storekv"] = append(jobs["storekv"], want{&p.storeKV[f], []uint32{uint32(f)}})
		jobs["attention"] = append(jobs["attention"], want{&p.attention[f], []uint32{uint32(f)}})
	}
	jobs["rmsnorm"] = []want{{&p.rmsNorm, nil}}
	jobs["rope"] = []want{{&p.rope, nil}}
	for name, ws := range jobs {
		code, err := spirv.ReadFile("shaders/" + name + ".spv")
		if err != nil {
			return fmt.Errorf("vulkan: shader %s: %w", name, err)
		}
		words := make([]uint32, len(code)/4)
		for i := range words {
			words[i] = binary.LittleEndian.Uint32(code[4*i:])
		}
		mi := &shaderModuleCreateInfo{sType: stShaderModuleCreateInfo, codeSize: uintptr(len(words) * 4), code: &words[0]}
		var mod vkHandle
		if err := check("vkCreateShaderModule "+name, vkResult(ccall(d.fn.createShaderModule, d.h, uintptr(unsafe.Pointer(mi)), 0, uintptr(unsafe.Pointer(&mod))))); err != nil {
			return err
		}
		for _, w := range ws {
			h, err := b.createPipeline(mod, w.spec)
			if err != nil {
				ccall(d.fn.destroyShaderModule, d.h, mod, 0)
				return fmt.Errorf("vulkan: pipeline %s %v: %w", name, w.spec, err)
			}
			*w.dst = h
			b.allPipes = append(b.allPipes, h)
		}
		ccall(d.fn.destroyShaderModule, d.h, mod, 0)
	}
	return nil
}

func (b *Backend) createPipeline(mod vkHandle, spec []uint32) (vkHandle, error) {
	si := &specializationInfo{}
	if len(spec) > 0 {
		entries := make([]specializationMapEntry, len(spec))
		for i := range entries {
			entries[i] = specializationMapEntry{constantID: uint32(i), offset: uint32(4 * i), size: 4}
		}
		data := make([]uint32, len(spec))
		copy(data, spec)
		*si = specializationInfo{entryCount: uint32(len(spec)), entries: &entries[0], dataSize: uintptr(4 * len(spec)), data: unsafe.Pointer(&data[0])}
	}
	ci := &computePipelineCreateInfo{
		sType:  stComputePipelineCreateInfo,
		stage:  pipelineShaderStageCreateInfo{sType: stPipelineShaderStageCreate, stage: shaderStageCompute, module: mod, name: cstr("main"), spec: si},
		layout: b.layout, baseIndex: -1,
	}
	var h vkHandle
	d := b.dev
	err := check("vkCreateComputePipelines", vkResult(ccall(d.fn.createComputePipelines, d.h, 0, 1, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&h)))))
	return h, err
}

// push assembles a dispatch's push constants: device addresses first (8-byte
// aligned), then 32-bit values, in the order of the shader's block.
type push struct {
	b [maxPushConstantSize]byte
	n int
}

func (p *push) reset() *push { p.n = 0; return p }

func (p *push) addr(a uint64) *push {
	binary.LittleEndian.PutUint64(p.b[p.n:], a)
	p.n += 8
	return p
}

func (p *push) u32(vs ...uint32) *push {
	for _, v := range vs {
		binary.LittleEndian.PutUint32(p.b[p.n:], v)
		p.n += 4
	}
	return p
}

func (p *push) f32(v float32) *push {
	binary.LittleEndian.PutUint32(p.b[p.n:], *(*uint32)(unsafe.Pointer(&v)))
	p.n += 4
	return p
}
