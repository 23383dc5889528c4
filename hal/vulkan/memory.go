package vulkan

import (
	"fmt"
	"unsafe"
)

// buffer is a VkBuffer with memory of its own, its device address and, when
// the memory is host-visible (and mapping is allowed), its host mapping.
type buffer struct {
	h, mem vkHandle
	size   uint64 // bytes asked for (rounded up to 16)
	alloc  uint64 // bytes of memory behind it
	addr   uint64
	mapped unsafe.Pointer
}

// bytes is the host mapping as a byte slice (nil if not mapped).
func (b *buffer) bytes() []byte {
	if b.mapped == nil {
		return nil
	}
	return unsafe.Slice((*byte)(b.mapped), b.size)
}

// memKind says where a buffer lives.
type memKind int

const (
	// memDevice: device-local (weights, activations, KV). Mapped when the
	// device makes it host-visible too and Options.NoHostMapping is unset.
	memDevice memKind = iota
	// memHost: host-visible and coherent, for what the host writes or reads
	// every step (inputs, logits) and for staging.
	memHost
)

// memoryType picks the memory type for kind among typeBits.
func (p *physical) memoryType(kind memKind, typeBits uint32) (uint32, bool) {
	best, bestScore := uint32(0), -1
	for i := uint32(0); i < min(p.mem.typeCount, 32); i++ {
		if typeBits&(1<<i) == 0 {
			continue
		}
		f := p.mem.types[i].flags
		score := -1
		switch kind {
		case memDevice:
			if f&memDeviceLocal != 0 {
				score = 2
				if f&memHostVisible != 0 {
					score = 3 // shared memory (lavapipe, integrated, resizable BAR)
				}
			} else {
				score = 0
			}
		case memHost:
			if f&(memHostVisible|memHostCoherent) == memHostVisible|memHostCoherent {
				score = 1
				if f&memHostCached != 0 {
					score = 2 // the host reads logits back
				}
			}
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	return best, bestScore >= 0
}

// newBuffer creates a buffer of size bytes (at least 16) of kind, with
// device addressing and transfer use.
func (b *Backend) newBuffer(size uint64, kind memKind) (*buffer, error) {
	size = max(16, (size+15)&^15)
	d := b.dev
	ci := &bufferCreateInfo{sType: stBufferCreateInfo, size: size,
		usage: bufStorage | bufTransferSrc | bufTransferDst | bufDeviceAddress, sharingMode: sharingExclusive}
	buf := &buffer{size: size}
	if err := check("vkCreateBuffer", vkResult(ccall(d.fn.createBuffer, d.h, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&buf.h))))); err != nil {
		return nil, fmt.Errorf("vulkan: a buffer of %d bytes: %w", size, err)
	}
	var req memoryRequirements
	ccall(d.fn.getBufferMemReq, d.h, buf.h, uintptr(unsafe.Pointer(&req)))
	ti, ok := b.phys.memoryType(kind, req.typeBits)
	if !ok {
		ccall(d.fn.destroyBuffer, d.h, buf.h, 0)
		return nil, fmt.Errorf("vulkan: no memory type for a buffer of %d bytes", size)
	}
	flags := &memoryAllocateFlagsInfo{sType: stMemoryAllocateFlagsInfo, flags: memAllocAddress}
	ai := &memoryAllocateInfo{sType: stMemoryAllocateInfo, pNext: unsafe.Pointer(flags), size: req.size, typeIndex: ti}
	if err := check("vkAllocateMemory", vkResult(ccall(d.fn.allocateMemory, d.h, uintptr(unsafe.Pointer(ai)), 0, uintptr(unsafe.Pointer(&buf.mem))))); err != nil {
		ccall(d.fn.destroyBuffer, d.h, buf.h, 0)
		return nil, fmt.Errorf("vulkan: %d bytes of memory: %w", req.size, err)
	}
	if err := check("vkBindBufferMemory", vkResult(ccall(d.fn.bindBufferMemory, d.h, buf.h, buf.mem, 0))); err != nil {
		b.freeBuffer(buf)
		return nil, err
	}
	ia := &bufferDeviceAddressInfo{sType: stBufferDeviceAddressInfo, buffer: buf.h}
	buf.addr = uint64(ccall(d.fn.getBufferAddress, d.h, uintptr(unsafe.Pointer(ia))))
	hostVisible := b.phys.mem.types[ti].flags&memHostVisible != 0
	if hostVisible && (kind == memHost || !b.opts.NoHostMapping) {
		var p unsafe.Pointer
		if err := check("vkMapMemory", vkResult(ccall(d.fn.mapMemory, d.h, buf.mem, 0, uintptr(wholeSize), 0, uintptr(unsafe.Pointer(&p))))); err != nil {
			b.freeBuffer(buf)
			return nil, err
		}
		buf.mapped = p
	}
	if kind == memHost && buf.mapped == nil {
		b.freeBuffer(buf)
		return nil, fmt.Errorf("vulkan: no host-visible memory for a buffer of %d bytes", size)
	}
	buf.alloc = req.size
	b.allocated.Add(int64(req.size))
	return buf, nil
}

func (b *Backend) freeBuffer(buf *buffer) {
	if buf == nil || buf.h == 0 {
		return
	}
	d := b.dev
	if buf.mapped != nil {
		ccall(d.fn.unmapMemory, d.h, buf.mem)
	}
	ccall(d.fn.destroyBuffer, d.h, buf.h, 0)
	if buf.mem != 0 {
		ccall(d.fn.freeMemory, d.h, buf.mem, 0)
		b.allocated.Add(-int64(buf.alloc))
	}
	*buf = buffer{}
}
