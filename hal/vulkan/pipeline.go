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

// pipelines are made on first use (a model needs a fraction of them, and
// each costs the driver a compilation: lavapipe's JIT takes tens of
// milliseconds).
type pipelines struct {
	matmul      [numEnc][numForms]vkHandle
	embed       [numEnc]vkHandle
	quantize    [numConv]vkHandle
	elementwise [numElementwise]vkHandle
	storeKV     [2]vkHandle // F32, F16 store
	attention   [2]vkHandle
	rmsNorm     vkHandle
	rope        vkHandle

	modules map[string]vkHandle
}

func (b *Backend) createLayout() error {
	d := b.dev
	pr := &pushConstantRange{stageFlags: shaderStageCompute, size: maxPushConstantSize}
	li := &pipelineLayoutCreateInfo{sType: stPipelineLayoutCreateInfo, pushRangeCount: 1, pushConstantRang: pr}
	return check("vkCreatePipelineLayout", vkResult(ccall(d.fn.createPipelineLayout, d.h, uintptr(unsafe.Pointer(li)), 0, uintptr(unsafe.Pointer(&b.layout)))))
}

// pipeline is *slot, the pipeline of shader name with spec constants spec,
// made now if it is not yet; 0 after a failure (recorded for Err).
func (b *Backend) pipeline(slot *vkHandle, name string, spec ...uint32) vkHandle {
	if *slot != 0 || b.err != nil {
		return *slot
	}
	mod, err := b.module(name)
	if err == nil {
		*slot, err = b.createPipeline(mod, spec)
	}
	if err != nil {
		b.fail(fmt.Errorf("vulkan: pipeline %s %v: %w", name, spec, err))
		return 0
	}
	b.allPipes = append(b.allPipes, *slot)
	return *slot
}

// module is the shader module of name, made from its SPIR-V on first use.
func (b *Backend) module(name string) (vkHandle, error) {
	if m, ok := b.pipes.modules[name]; ok {
		return m, nil
	}
	code, err := spirv.ReadFile("shaders/" + name + ".spv")
	if err != nil {
		return 0, fmt.Errorf("vulkan: shader %s: %w", name, err)
	}
	words := make([]uint32, len(code)/4)
	for i := range words {
		words[i] = binary.LittleEndian.Uint32(code[4*i:])
	}
	d := b.dev
	mi := &shaderModuleCreateInfo{sType: stShaderModuleCreateInfo, codeSize: uintptr(len(words) * 4), code: &words[0]}
	var mod vkHandle
	if err := check("vkCreateShaderModule "+name, vkResult(ccall(d.fn.createShaderModule, d.h, uintptr(unsafe.Pointer(mi)), 0, uintptr(unsafe.Pointer(&mod))))); err != nil {
		return 0, err
	}
	if b.pipes.modules == nil {
		b.pipes.modules = map[string]vkHandle{}
	}
	b.pipes.modules[name] = mod
	return mod, nil
}

// The pipelines of each op.
func (b *Backend) matmulPipe(enc, form int) vkHandle {
	return b.pipeline(&b.pipes.matmul[enc][form], "matmul", uint32(enc), tileRows[form], tileCols[form])
}
func (b *Backend) embedPipe(enc int) vkHandle {
	return b.pipeline(&b.pipes.embed[enc], "embed", uint32(enc))
}
func (b *Backend) quantizePipe(conv int) vkHandle {
	return b.pipeline(&b.pipes.quantize[conv], "quantize", uint32(conv))
}
func (b *Backend) elementwisePipe(op int) vkHandle {
	return b.pipeline(&b.pipes.elementwise[op], "elementwise", uint32(op))
}
func (b *Backend) storeKVPipe(f16 int) vkHandle {
	return b.pipeline(&b.pipes.storeKV[f16], "storekv", uint32(f16))
}
func (b *Backend) attentionPipe(f16 int) vkHandle {
	return b.pipeline(&b.pipes.attention[f16], "attention", uint32(f16))
}
func (b *Backend) rmsNormPipe() vkHandle { return b.pipeline(&b.pipes.rmsNorm, "rmsnorm") }
func (b *Backend) ropePipe() vkHandle    { return b.pipeline(&b.pipes.rope, "rope") }

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
