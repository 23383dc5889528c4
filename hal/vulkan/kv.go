package vulkan

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"tandem/hal"
	"tandem/hal/cpu"
)

// kvStore is the paged KV store in one device buffer: for each layer its
// keys, then its values, each Blocks × KVHeads × BlockSize × HeadDim
// elements in hal/cpu's order within a block (keys [head][dim][slot], values
// [head][slot][dim]), float32 or FP16. A block's bytes are therefore
// cpu-kv/1's, and its block I/O is plain copies: a Vulkan engine and a CPU
// engine exchange blocks (disaggregated prefill and decode) unconverted.
type kvStore struct {
	b      *Backend
	layout hal.KVLayout
	buf    *buffer
	per    uint64 // elements of one layer's keys (or values)
	es     uint64 // bytes an element

	// Block I/O runs on the caller's goroutine, beside the forward steps:
	// its own command pool, buffer, fence and staging buffer, and the
	// queue's lock for the submission.
	mu      sync.Mutex
	pool    vkHandle
	cmd     vkHandle
	sub     *submitter
	staging *buffer
	regions []bufferCopy
	begin   commandBufferBeginInfo
	mb      memoryBarrier
}

// NewKVStore allocates a paged KV store of float32 or FP16 elements in
// device memory.
func (b *Backend) NewKVStore(l hal.KVLayout) (hal.KVStore, error) {
	if l.Layers <= 0 || l.Blocks <= 0 || l.BlockSize <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return nil, errf("invalid KV layout %+v", l)
	}
	if l.DType != hal.F32 && l.DType != hal.F16 {
		return nil, errf("KV element type %v is not supported (F32 or F16)", l.DType)
	}
	per := uint64(l.Blocks) * uint64(l.BlockSize) * uint64(l.KVHeads) * uint64(l.HeadDim)
	if per > math.MaxInt32 {
		return nil, errf("KV layout %+v has more than 2³¹ elements a layer", l)
	}
	if l.HeadDim > 256 {
		return nil, errf("KV head size %d: the attention kernel takes heads of at most 256 values", l.HeadDim)
	}
	if l.DType == hal.F16 && per%2 != 0 {
		return nil, errf("an FP16 KV layout needs an even number of elements a layer, %+v has %d", l, per)
	}
	s := &kvStore{b: b, layout: l, per: per, es: uint64(l.ElemBytes())}
	buf, err := b.newBuffer(2*uint64(l.Layers)*per*s.es, memDevice)
	if err != nil {
		return nil, fmt.Errorf("vulkan: KV store of %d bytes: %w", 2*uint64(l.Layers)*per*s.es, err)
	}
	s.buf = buf
	d := b.dev
	pi := &commandPoolCreateInfo{sType: stCommandPoolCreateInfo, flags: poolResetCmdBuffer, family: b.phys.family}
	if err := check("vkCreateCommandPool", vkResult(ccall(d.fn.createCommandPool, d.h, uintptr(unsafe.Pointer(pi)), 0, uintptr(unsafe.Pointer(&s.pool))))); err != nil {
		s.free()
		return nil, err
	}
	ai := &commandBufferAllocateInfo{sType: stCommandBufferAllocateInfo, pool: s.pool, level: cmdLevelPrimary, count: 1}
	if err := check("vkAllocateCommandBuffers", vkResult(ccall(d.fn.allocateCommandBuffers, d.h, uintptr(unsafe.Pointer(ai)), uintptr(unsafe.Pointer(&s.cmd))))); err != nil {
		s.free()
		return nil, err
	}
	if s.sub, err = b.newSubmitter(); err != nil {
		s.free()
		return nil, err
	}
	// Zero the store, as hal/cpu's is: attention never reads a position
	// before it is written, but block I/O may read a block never written.
	// On the device: the host need not touch (or commit) a mapping's pages.
	if err := s.zero(); err != nil {
		s.free()
		return nil, err
	}
	b.stores = append(b.stores, s)
	return s, nil
}

// store is kv as this backend's store.
func (b *Backend) store(kv hal.KVStore) *kvStore {
	s, ok := kv.(*kvStore)
	if !ok || s.b != b {
		panic(fmt.Sprintf("vulkan: a KV store of another backend (%T)", kv))
	}
	return s
}

func (s *kvStore) f16() int {
	if s.layout.DType == hal.F16 {
		return 1
	}
	return 0
}

// layerAddr is the device address of layer's keys and of its values.
func (s *kvStore) layerAddr(layer int) (k, v uint64) {
	if layer < 0 || layer >= s.layout.Layers {
		panic(fmt.Sprintf("vulkan: KV layer %d of %d", layer, s.layout.Layers))
	}
	k = s.buf.addr + 2*uint64(layer)*s.per*s.es
	return k, k + s.per*s.es
}

func (s *kvStore) Layout() hal.KVLayout { return s.layout }

// Bytes is the device memory the store holds.
func (s *kvStore) Bytes() int64 { return int64(2 * uint64(s.layout.Layers) * s.per * s.es) }

// Format is hal/cpu's block format, whose bytes these are ("" on a
// big-endian host, as hal/cpu's).
func (s *kvStore) Format() string {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return ""
	}
	return cpu.KVFormat
}

// blockLen is the bytes of one block in one layer's keys (or values).
func (s *kvStore) blockLen() uint64 {
	l := s.layout
	return uint64(l.BlockSize*l.KVHeads*l.HeadDim) * s.es
}

func (s *kvStore) checkIO(block, n int) error {
	switch l := s.layout; {
	case block < 0 || block >= l.Blocks:
		return errf("KV block %d of %d", block, l.Blocks)
	case n != l.BlockBytes():
		return errf("KV block I/O of %d bytes, a block is %d", n, l.BlockBytes())
	case s.buf == nil:
		return errf("KV store used after its backend closed")
	}
	return nil
}

// layerOff is the byte offset of block's keys (v false) or values in layer.
func (s *kvStore) layerOff(layer, block int, v bool) uint64 {
	o := 2*uint64(layer)*s.per*s.es + uint64(block)*s.blockLen()
	if v {
		o += s.per * s.es
	}
	return o
}

// ReadBlock copies block's keys and values, layer by layer, into dst.
func (s *kvStore) ReadBlock(block int, dst []byte) error {
	if err := s.checkIO(block, len(dst)); err != nil {
		return err
	}
	bl := s.blockLen()
	if m := s.buf.bytes(); m != nil {
		for l := range s.layout.Layers {
			copy(dst[2*uint64(l)*bl:], m[s.layerOff(l, block, false):][:bl])
			copy(dst[(2*uint64(l)+1)*bl:], m[s.layerOff(l, block, true):][:bl])
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.copyRegions(block, false); err != nil {
		return err
	}
	copy(dst, s.staging.bytes())
	return nil
}

// WriteBlock stores src as block's keys and values.
func (s *kvStore) WriteBlock(block int, src []byte) error {
	if err := s.checkIO(block, len(src)); err != nil {
		return err
	}
	bl := s.blockLen()
	if m := s.buf.bytes(); m != nil {
		for l := range s.layout.Layers {
			copy(m[s.layerOff(l, block, false):][:bl], src[2*uint64(l)*bl:])
			copy(m[s.layerOff(l, block, true):][:bl], src[(2*uint64(l)+1)*bl:])
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ensureStaging(); err != nil {
		return err
	}
	copy(s.staging.bytes(), src)
	return s.copyRegions(block, true)
}

func (s *kvStore) ensureStaging() error {
	if s.staging != nil {
		return nil
	}
	st, err := s.b.newBuffer(uint64(s.layout.BlockBytes()), memHost)
	if err != nil {
		return fmt.Errorf("vulkan: KV staging: %w", err)
	}
	s.staging = st
	return nil
}

// copyRegions copies block between the store and the staging buffer (in
// block-I/O order), toStore saying which way, and waits.
func (s *kvStore) copyRegions(block int, toStore bool) error {
	if err := s.ensureStaging(); err != nil {
		return err
	}
	bl := s.blockLen()
	s.regions = s.regions[:0]
	for l := range s.layout.Layers {
		for i, v := range []bool{false, true} {
			st := (2*uint64(l) + uint64(i)) * bl
			kv := s.layerOff(l, block, v)
			r := bufferCopy{srcOffset: kv, dstOffset: st, size: bl}
			if toStore {
				r.srcOffset, r.dstOffset = st, kv
			}
			s.regions = append(s.regions, r)
		}
	}
	src, dst := s.buf, s.staging
	if toStore {
		src, dst = dst, src
	}
	return s.submitCopy(src, dst)
}

// submitCopy copies s.regions from src to dst on the device and waits.
func (s *kvStore) submitCopy(src, dst *buffer) error {
	return s.runCmd(func(cmd vkHandle) {
		ccall(s.b.dev.fn.cmdCopyBuffer, cmd, src.h, dst.h, uintptr(len(s.regions)), uintptr(unsafe.Pointer(&s.regions[0])))
	})
}

// runCmd records into the store's command buffer, with a barrier after it,
// runs it on the shared queue and waits.
func (s *kvStore) runCmd(record func(cmd vkHandle)) error {
	d := s.b.dev
	if err := check("vkResetCommandBuffer", vkResult(ccall(d.fn.resetCommandBuffer, s.cmd, 0))); err != nil {
		return err
	}
	s.begin = commandBufferBeginInfo{sType: stCommandBufferBeginInfo, flags: cmdOneTimeSubmit}
	if err := check("vkBeginCommandBuffer", vkResult(ccall(d.fn.beginCommandBuffer, s.cmd, uintptr(unsafe.Pointer(&s.begin))))); err != nil {
		return err
	}
	s.mb = memoryBarrier{sType: stMemoryBarrier, src: accessMemoryWrite, dst: accessMemoryRead | accessMemoryWrite}
	ccall(d.fn.cmdPipelineBarrier, s.cmd, stageAllCommands, stageAllCommands, 0, 1, uintptr(unsafe.Pointer(&s.mb)), 0, 0, 0, 0)
	record(s.cmd)
	s.mb = memoryBarrier{sType: stMemoryBarrier, src: accessTransferWrite, dst: accessHostRead | accessShaderRead | accessShaderWrite}
	ccall(d.fn.cmdPipelineBarrier, s.cmd, stageTransfer, stageHost|stageCompute, 0, 1, uintptr(unsafe.Pointer(&s.mb)), 0, 0, 0, 0)
	if err := check("vkEndCommandBuffer", vkResult(ccall(d.fn.endCommandBuffer, s.cmd))); err != nil {
		return err
	}
	return s.b.run(s.sub, s.cmd)
}

// CopyBlock copies every layer's keys and values of block src to block dst.
func (s *kvStore) CopyBlock(dst, src int) {
	if err := s.checkIO(dst, s.layout.BlockBytes()); err != nil {
		panic(err)
	}
	if err := s.checkIO(src, s.layout.BlockBytes()); err != nil {
		panic(err)
	}
	bl := s.blockLen()
	if m := s.buf.bytes(); m != nil {
		for l := range s.layout.Layers {
			for _, v := range []bool{false, true} {
				copy(m[s.layerOff(l, dst, v):][:bl], m[s.layerOff(l, src, v):][:bl])
			}
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.regions = s.regions[:0]
	for l := range s.layout.Layers {
		for _, v := range []bool{false, true} {
			s.regions = append(s.regions, bufferCopy{srcOffset: s.layerOff(l, src, v), dstOffset: s.layerOff(l, dst, v), size: bl})
		}
	}
	if err := s.submitCopy(s.buf, s.buf); err != nil {
		s.b.fail(fmt.Errorf("vulkan: KV CopyBlock: %w", err))
	}
}

// zero clears the store on the device.
func (s *kvStore) zero() error {
	return s.runCmd(func(cmd vkHandle) {
		ccall(s.b.dev.fn.cmdFillBuffer, cmd, s.buf.h, 0, uintptr(wholeSize), 0)
	})
}

func (s *kvStore) free() {
	b := s.b
	if b.dev == nil {
		return
	}
	b.freeBuffer(s.buf)
	b.freeBuffer(s.staging)
	s.buf, s.staging = nil, nil
	if s.sub != nil {
		ccall(b.dev.fn.destroyFence, b.dev.h, s.sub.fence, 0)
		s.sub = nil
	}
	if s.pool != 0 {
		ccall(b.dev.fn.destroyCommandPool, b.dev.h, s.pool, 0)
		s.pool = 0
	}
}
