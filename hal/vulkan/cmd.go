package vulkan

import (
	"fmt"
	"time"
	"unsafe"
)

// Command buffers. Ops record dispatches into the current command buffer
// (b.cur): a captured step's own (capture.go) between BeginStep and EndStep,
// otherwise b.imm, which is submitted and waited for at the end of each op.
// Uploads and downloads use b.xfer, submitted at once, so that they may
// happen while a step is being recorded.

// submitter submits one command buffer at a time and waits for it, with
// its own fence; the structures it hands the driver live with it, so a
// submission allocates nothing.
type submitter struct {
	ca     callArgs
	fence  vkHandle
	cmd    vkHandle // the one being submitted
	submit submitInfo
}

func (b *Backend) newSubmitter() (*submitter, error) {
	s := &submitter{}
	fi := &fenceCreateInfo{sType: stFenceCreateInfo}
	if err := check("vkCreateFence", vkResult(ccall(b.dev.fn.createFence, b.dev.h, uintptr(unsafe.Pointer(fi)), 0, uintptr(unsafe.Pointer(&s.fence))))); err != nil {
		return nil, err
	}
	s.submit = submitInfo{sType: stSubmitInfo, cmdBufferCount: 1, cmdBuffers: &s.cmd}
	return s, nil
}

// run submits cmd and waits for it to finish.
func (b *Backend) run(s *submitter, cmd vkHandle) error {
	d := b.dev
	s.cmd = cmd
	t0 := time.Now()
	b.queueMu.Lock()
	r := vkResult(s.ca.call(d.fn.queueSubmit, d.queue, 1, uintptr(unsafe.Pointer(&s.submit)), s.fence))
	b.queueMu.Unlock()
	b.submitNanos.Add(int64(time.Since(t0))) // lavapipe runs the work in the submission
	if err := check("vkQueueSubmit", r); err != nil {
		return err
	}
	t0 = time.Now()
	r = vkResult(s.ca.call(d.fn.waitForFences, d.h, 1, uintptr(unsafe.Pointer(&s.fence)), 1, uintptr(fenceForever)))
	b.waitNanos.Add(int64(time.Since(t0)))
	if err := check("vkWaitForFences", r); err != nil {
		return err
	}
	return check("vkResetFences", vkResult(s.ca.call(d.fn.resetFences, d.h, 1, uintptr(unsafe.Pointer(&s.fence)))))
}

func (b *Backend) allocCmd() (vkHandle, error) {
	ai := &commandBufferAllocateInfo{sType: stCommandBufferAllocateInfo, pool: b.pool, level: cmdLevelPrimary, count: 1}
	var h vkHandle
	err := check("vkAllocateCommandBuffers", vkResult(ccall(b.dev.fn.allocateCommandBuffers, b.dev.h, uintptr(unsafe.Pointer(ai)), uintptr(unsafe.Pointer(&h)))))
	return h, err
}

func (b *Backend) freeCmd(h vkHandle) {
	if h != 0 {
		ccall(b.dev.fn.freeCommandBuffers, b.dev.h, b.pool, 1, uintptr(unsafe.Pointer(&h)))
	}
}

// beginCmd starts recording into h (reset first), as b.cur.
func (b *Backend) beginCmd(h vkHandle, oneTime bool) error {
	d := b.dev
	if err := check("vkResetCommandBuffer", vkResult(b.ca.call(d.fn.resetCommandBuffer, h, 0))); err != nil {
		return err
	}
	b.beginInfo = commandBufferBeginInfo{sType: stCommandBufferBeginInfo}
	if oneTime {
		b.beginInfo.flags = cmdOneTimeSubmit
	}
	if err := check("vkBeginCommandBuffer", vkResult(b.ca.call(d.fn.beginCommandBuffer, h, uintptr(unsafe.Pointer(&b.beginInfo))))); err != nil {
		return err
	}
	b.cur, b.bound = h, 0
	// What earlier submissions wrote (uploads, a step, block I/O) is
	// available once their fences signalled; make it visible to this one.
	b.mb = memoryBarrier{sType: stMemoryBarrier, src: accessMemoryWrite, dst: accessMemoryRead | accessMemoryWrite}
	b.ca.call(d.fn.cmdPipelineBarrier, h, stageAllCommands, stageAllCommands, 0, 1, uintptr(unsafe.Pointer(&b.mb)), 0, 0, 0, 0)
	return nil
}

// endCmd ends the recording of b.cur, with a barrier that makes its writes
// visible to the host once its fence signals.
func (b *Backend) endCmd() error {
	h := b.cur
	b.cur, b.bound = 0, 0
	b.barrierTo(h, stageHost, accessHostRead)
	return check("vkEndCommandBuffer", vkResult(b.ca.call(b.dev.fn.endCommandBuffer, h)))
}

// barrierTo orders everything before it in h (compute and transfer writes)
// before the stage after it.
func (b *Backend) barrierTo(h vkHandle, dstStage, dstAccess uint32) {
	b.mb = memoryBarrier{sType: stMemoryBarrier, src: accessShaderWrite | accessTransferWrite, dst: dstAccess}
	b.ca.call(b.dev.fn.cmdPipelineBarrier, h, stageCompute|stageTransfer, uintptr(dstStage), 0, 1, uintptr(unsafe.Pointer(&b.mb)), 0, 0, 0, 0)
}

// dispatch records pipeline pl over groups (x, y, z) with the push
// constants in b.pc, and a barrier after it, so that every op sees the
// writes of those before it.
func (b *Backend) dispatch(pl vkHandle, x, y, z uint32) {
	h, d := b.cur, b.dev
	if x == 0 || y == 0 || z == 0 || pl == 0 {
		return
	}
	if b.bound != pl {
		b.ca.call(d.fn.cmdBindPipeline, h, bindPointCompute, pl)
		b.bound = pl
	}
	b.ca.call(d.fn.cmdPushConstants, h, b.layout, shaderStageCompute, 0, uintptr(maxPushConstantSize), uintptr(unsafe.Pointer(&b.pc.b[0])))
	b.ca.call(d.fn.cmdDispatch, h, uintptr(x), uintptr(y), uintptr(z))
	b.barrierTo(h, stageCompute|stageTransfer, accessShaderRead|accessShaderWrite|accessTransferRead|accessTransferWrite)
	b.dispatches++
}

// fold splits n workgroups along x into (x, z) under the device's limit;
// the shader recovers the index as x + z·tilesX (foldedGroup).
func (b *Backend) fold(n uint32) (x, z uint32) {
	if n <= b.maxGroups {
		return n, 1
	}
	return b.maxGroups, (n + b.maxGroups - 1) / b.maxGroups
}

// copyBuffer records a copy of size bytes into b.cur.
func (b *Backend) copyBuffer(h vkHandle, src, dst *buffer, srcOff, dstOff, size uint64) {
	b.region = bufferCopy{srcOffset: srcOff, dstOffset: dstOff, size: size}
	b.ca.call(b.dev.fn.cmdCopyBuffer, h, src.h, dst.h, 1, uintptr(unsafe.Pointer(&b.region)))
}

func ceilDiv(a, b int) uint32 { return uint32((a + b - 1) / b) }

func errf(format string, args ...any) error { return fmt.Errorf("vulkan: "+format, args...) }
