package vulkan

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"tandem/hal"
	"tandem/hal/cpu"
)

// Options configure New.
type Options struct {
	// Device is the index of the device among Devices(); negative picks the
	// first usable GPU (discrete, then integrated, then virtual), else the
	// first usable device (lavapipe, a CPU).
	Device int
	// Logger gets the backend's warnings (weights converted at load); nil
	// is slog.Default().
	Logger *slog.Logger
	// NoHostMapping keeps device-local memory unmapped even where the
	// device lets the host map it (lavapipe, integrated GPUs, resizable
	// BAR): every transfer then goes through staging buffers, as on a
	// discrete GPU. Tests use it to run that path on lavapipe.
	NoHostMapping bool
	// NoReplay turns replay off: every step records its ops and runs them,
	// and no capture is kept. For measuring what replay saves.
	NoReplay bool
}

// Backend runs hal ops as Vulkan compute shaders on one device. Weights,
// activations (hal.Bufs) and KV stores live in device memory; a forward
// step is recorded into a command buffer, and a later step of the same
// shape replays the record with new inputs (hal.StepCapturer).
type Backend struct {
	opts Options
	log  *slog.Logger
	in   *instance
	phys *physical
	dev  *device

	layout   vkHandle
	pipes    pipelines
	allPipes []vkHandle
	pool     vkHandle
	imm      vkHandle   // command buffer of the ops issued outside a step
	xfer     vkHandle   // command buffer of uploads and downloads
	sub      *submitter // steps and ops
	xsub     *submitter // uploads and downloads
	queueMu  sync.Mutex // the queue is shared with KV block I/O

	maxGroups uint32
	form      int // the matmul form to use, if ≥ 0 (tests); else matmulForm chooses

	// Reused by the recording calls, so that they allocate nothing.
	ca        callArgs
	pc        push
	mb        memoryBarrier
	region    bufferCopy
	beginInfo commandBufferBeginInfo
	cur       vkHandle // command buffer being recorded; 0 when none
	bound     vkHandle // pipeline bound in cur

	err       error
	allocated atomic.Int64
	waitNanos atomic.Int64
	// submitNanos is the time in vkQueueSubmit: a GPU's driver returns at
	// once, lavapipe's runs the command buffer there.
	submitNanos atomic.Int64

	nextID  uint64
	bufs    map[uint64]*buffer
	weights map[*hal.Weight]*devWeight
	params  map[*float32]*paramBuf
	ropes   map[*hal.RoPE]*ropeTable
	stores  []*kvStore

	xq      *buffer // activations converted to a weight's vec-dot encoding
	xqUsed  bool    // by the recording in progress
	scratch scratch // host-visible inputs of ops whose inputs are not a step's
	logitsB *buffer // host-visible logits of Logits outside a step
	retired []*buffer
	staging *buffer

	// Step capture (capture.go).
	caps     map[captureKey]*capture
	rec      *capture  // the step being recorded; nil outside a step
	spare    *capture  // a capture not kept, for the next recording
	step     *hal.Step // the step between BeginStep and EndStep
	replayed bool
	useClock uint64
	t0       time.Time
	wait0    int64

	dispatches int64
	// Counters read by Stats and StepCounts, from any goroutine (/metrics).
	steps, captures, replays, drops, hostNanos atomic.Int64

	convMu    sync.Mutex
	converted map[string]int
	warned    map[hal.DType]bool
}

var (
	_ hal.Backend        = (*Backend)(nil)
	_ hal.StepCapturer   = (*Backend)(nil)
	_ hal.WeightPreparer = (*Backend)(nil)
	_ hal.MultiMatMuler  = (*Backend)(nil)
)

// New opens the Vulkan device opts.Device and prepares the backend's
// pipelines. Where Vulkan cannot run it (no loader, no driver, no usable
// device) the error wraps ErrUnavailable.
func New(opts Options) (*Backend, error) {
	in, err := newInstance()
	if err != nil {
		return nil, err
	}
	ps, err := in.physicalDevices()
	if err != nil {
		in.close()
		return nil, err
	}
	p, err := choose(ps, opts.Device)
	if err != nil {
		in.close()
		return nil, err
	}
	b := &Backend{opts: opts, log: opts.Logger, in: in, phys: p, form: -1,
		bufs: map[uint64]*buffer{}, weights: map[*hal.Weight]*devWeight{}, params: map[*float32]*paramBuf{},
		ropes: map[*hal.RoPE]*ropeTable{}, caps: map[captureKey]*capture{},
		converted: map[string]int{}, warned: map[hal.DType]bool{}}
	if b.log == nil {
		b.log = slog.Default()
	}
	b.maxGroups = min(p.props.limit(limitMaxComputeWorkGroupCount), 65535)
	if b.dev, err = in.newDevice(p); err != nil {
		in.close()
		return nil, err
	}
	if err := b.setup(); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) setup() error {
	d := b.dev
	pi := &commandPoolCreateInfo{sType: stCommandPoolCreateInfo, flags: poolResetCmdBuffer, family: b.phys.family}
	if err := check("vkCreateCommandPool", vkResult(ccall(d.fn.createCommandPool, d.h, uintptr(unsafe.Pointer(pi)), 0, uintptr(unsafe.Pointer(&b.pool))))); err != nil {
		return err
	}
	var err error
	if b.imm, err = b.allocCmd(); err != nil {
		return err
	}
	if b.xfer, err = b.allocCmd(); err != nil {
		return err
	}
	if b.sub, err = b.newSubmitter(); err != nil {
		return err
	}
	if b.xsub, err = b.newSubmitter(); err != nil {
		return err
	}
	return b.createLayout()
}

// Name is "vulkan" and the device's name and kind.
func (b *Backend) Name() string {
	return fmt.Sprintf("vulkan:%d (%s, %s)", b.phys.info.Index, b.phys.info.Name, b.phys.info.Type)
}

// Device describes the device the backend runs on.
func (b *Backend) Device() DeviceInfo { return b.phys.info }

// DeviceMemory is the size of the device's largest device-local heap and the
// bytes the backend has allocated on the device so far.
func (b *Backend) DeviceMemory() (heap, allocated int64) {
	return b.phys.info.DeviceMemory, b.allocated.Load()
}

// Err is the first failure of a compute op, nil if none.
func (b *Backend) Err() error { return b.err }

// fail records the first failure; later ops are skipped.
func (b *Backend) fail(err error) {
	if b.err == nil && err != nil {
		b.err = err
		b.log.Error("vulkan: device failure; the backend's ops are skipped from now on", "device", b.phys.info.Name, "err", err)
	}
}

// Close releases everything the backend made on the device.
func (b *Backend) Close() error {
	if b.dev == nil {
		if b.in != nil {
			b.in.close()
		}
		return nil
	}
	d := b.dev
	ccall(d.fn.deviceWaitIdle, d.h)
	b.dropCaptures()
	for _, c := range []*capture{b.rec, b.spare} {
		if c != nil {
			b.freeCapture(c)
		}
	}
	b.rec, b.spare = nil, nil
	for _, w := range b.weights {
		b.freeBuffer(w.buf)
	}
	for _, p := range b.params {
		b.freeBuffer(p.buf)
	}
	for _, r := range b.ropes {
		b.freeBuffer(r.buf)
	}
	for _, buf := range b.bufs {
		b.freeBuffer(buf)
	}
	for _, s := range b.stores {
		s.free()
	}
	b.releaseRetired()
	for _, buf := range []*buffer{b.xq, b.scratch.buf, b.logitsB, b.staging} {
		b.freeBuffer(buf)
	}
	for _, p := range b.allPipes {
		ccall(d.fn.destroyPipeline, d.h, p, 0)
	}
	for _, m := range b.pipes.modules {
		ccall(d.fn.destroyShaderModule, d.h, m, 0)
	}
	if b.layout != 0 {
		ccall(d.fn.destroyPipelineLayout, d.h, b.layout, 0)
	}
	for _, s := range []*submitter{b.sub, b.xsub} {
		if s != nil {
			ccall(d.fn.destroyFence, d.h, s.fence, 0)
		}
	}
	if b.pool != 0 {
		ccall(d.fn.destroyCommandPool, d.h, b.pool, 0)
	}
	ccall(d.fn.destroyDevice, d.h, 0)
	b.in.close()
	b.dev, b.in = nil, nil
	b.bufs, b.weights, b.params, b.ropes, b.stores = nil, nil, nil, nil, nil
	return nil
}

// SupportsWeight reports whether MatMul, Logits and Embed take weights of
// type t: the types with kernels of their own (F32, F16, Q8_0, Q4_K, Q6_K)
// and every other type hal/cpu can dequantize, converted to F32 at upload.
func (b *Backend) SupportsWeight(t hal.DType) bool { return cpu.SupportedWeight(t) }

// Dequantize converts on the host, as hal/cpu does.
func (b *Backend) Dequantize(dst []float32, t hal.DType, src []byte) { cpu.DequantizeRow(t, src, dst) }

// NewBuf allocates n float32 values of device memory.
func (b *Backend) NewBuf(n int) (hal.Buf, error) {
	if n < 0 {
		return hal.Buf{}, errf("buffer of %d values", n)
	}
	buf, err := b.newBuffer(uint64(n)*4, memDevice)
	if err != nil {
		return hal.Buf{}, err
	}
	b.nextID++
	b.bufs[b.nextID] = buf
	return hal.DeviceBuf(b.nextID, n), nil
}

// FreeBuf releases a buffer of NewBuf and drops the captured steps.
func (b *Backend) FreeBuf(hb hal.Buf) {
	id, _ := hb.Device()
	buf, ok := b.bufs[id]
	if !ok {
		return
	}
	delete(b.bufs, id)
	b.dropCaptures()
	if b.rec != nil {
		b.rec.dirty = true
		b.retired = append(b.retired, buf)
		return
	}
	b.freeBuffer(buf)
}

// addr is the device address of hb's first value. A Buf of another backend
// (host values, or an id this one did not make) is a programming error.
func (b *Backend) addr(hb hal.Buf) uint64 {
	if hb.Host() != nil {
		panic("vulkan: a host buffer (of another backend) given to the Vulkan backend")
	}
	id, off := hb.Device()
	buf, ok := b.bufs[id]
	if !ok {
		if hb.Len() == 0 {
			return 0
		}
		panic(fmt.Sprintf("vulkan: buffer %d is not one of this backend's (freed, or another backend's)", id))
	}
	return buf.addr + uint64(off)*4
}

// bufOf is the buffer behind hb and hb's byte offset in it.
func (b *Backend) bufOf(hb hal.Buf) (*buffer, uint64) {
	id, off := hb.Device()
	buf, ok := b.bufs[id]
	if !ok {
		panic(fmt.Sprintf("vulkan: buffer %d is not one of this backend's", id))
	}
	return buf, uint64(off) * 4
}

// WriteBuf copies src into dst.
func (b *Backend) WriteBuf(dst hal.Buf, src []float32) error {
	if len(src) > dst.Len() {
		return errf("%d values into a buffer of %d", len(src), dst.Len())
	}
	if len(src) == 0 {
		return b.err
	}
	buf, off := b.bufOf(dst)
	return b.write(buf, off, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
}

// ReadBuf copies src into dst.
func (b *Backend) ReadBuf(dst []float32, src hal.Buf) error {
	if len(dst) > src.Len() {
		return errf("%d values from a buffer of %d", len(dst), src.Len())
	}
	if len(dst) == 0 {
		return b.err
	}
	buf, off := b.bufOf(src)
	return b.read(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), buf, off)
}

// stagingChunk bounds the staging buffer of uploads and downloads.
const stagingChunk = 32 << 20

// write copies src into buf at off: directly where buf is mapped, else
// through the staging buffer and the transfer command buffer.
func (b *Backend) write(buf *buffer, off uint64, src []byte) error {
	if b.err != nil {
		return b.err
	}
	if m := buf.bytes(); m != nil {
		copy(m[off:], src)
		return nil
	}
	for len(src) > 0 {
		n := min(len(src), stagingChunk)
		st, err := b.stagingBuf(uint64(n))
		if err != nil {
			return err
		}
		copy(st.bytes(), src[:n])
		if err := b.transfer(st, buf, 0, off, uint64(n)); err != nil {
			return err
		}
		src, off = src[n:], off+uint64(n)
	}
	return nil
}

// read copies len(dst) bytes of buf at off into dst.
func (b *Backend) read(dst []byte, buf *buffer, off uint64) error {
	if b.err != nil {
		return b.err
	}
	if m := buf.bytes(); m != nil {
		copy(dst, m[off:])
		return nil
	}
	for len(dst) > 0 {
		n := min(len(dst), stagingChunk)
		st, err := b.stagingBuf(uint64(n))
		if err != nil {
			return err
		}
		if err := b.transfer(buf, st, off, 0, uint64(n)); err != nil {
			return err
		}
		copy(dst[:n], st.bytes())
		dst, off = dst[n:], off+uint64(n)
	}
	return nil
}

func (b *Backend) stagingBuf(n uint64) (*buffer, error) {
	if b.staging != nil && b.staging.size >= n {
		return b.staging, nil
	}
	b.freeBuffer(b.staging)
	b.staging = nil
	st, err := b.newBuffer(max(n, 1<<20), memHost)
	if err != nil {
		return nil, err
	}
	b.staging = st
	return st, nil
}

// transfer copies size bytes from src to dst on the device and waits.
func (b *Backend) transfer(src, dst *buffer, srcOff, dstOff, size uint64) error {
	cur, bound := b.cur, b.bound // a step may be being recorded
	defer func() { b.cur, b.bound = cur, bound }()
	if err := b.beginCmd(b.xfer, true); err != nil {
		b.fail(err)
		return err
	}
	b.copyBuffer(b.xfer, src, dst, srcOff, dstOff, size)
	if err := b.endCmd(); err != nil {
		b.fail(err)
		return err
	}
	if err := b.run(b.xsub, b.xfer); err != nil {
		b.fail(err)
		return err
	}
	return nil
}

func (b *Backend) releaseRetired() {
	for _, buf := range b.retired {
		b.freeBuffer(buf)
	}
	clear(b.retired)
	b.retired = b.retired[:0]
}

// Stats are the backend's counters since New.
type Stats struct {
	Steps, Captures, Replays, Drops int64 // forward steps; recorded and kept; replayed; captures dropped
	Dispatches                      int64 // compute dispatches recorded
	// HostTime is the time steps spent on the host's own work (recording
	// the ops, or writing the inputs of a replay, and reading the logits
	// back), without the submissions and the waits for the device;
	// SubmitTime the time in vkQueueSubmit (a GPU driver's returns at once;
	// lavapipe runs the work there) and WaitTime the waits for the device,
	// steps and ops alike.
	HostTime, SubmitTime, WaitTime time.Duration
}

// Stats returns the counters. Dispatches is read on the backend's goroutine
// only; the rest may be read from any.
func (b *Backend) Stats() Stats {
	return Stats{Steps: b.steps.Load(), Captures: b.captures.Load(), Replays: b.replays.Load(), Drops: b.drops.Load(),
		Dispatches: b.dispatches, HostTime: time.Duration(b.hostNanos.Load()),
		SubmitTime: time.Duration(b.submitNanos.Load()), WaitTime: time.Duration(b.waitNanos.Load())}
}

// StepCounts is the steps captured, replayed and dropped, for /metrics.
func (b *Backend) StepCounts() (captures, replays, drops int64) {
	return b.captures.Load(), b.replays.Load(), b.drops.Load()
}

// ConvertedWeights counts the weight matrices converted at upload, by
// conversion ("q4_0→f32"): the types without kernels of their own.
func (b *Backend) ConvertedWeights() map[string]int {
	b.convMu.Lock()
	defer b.convMu.Unlock()
	out := make(map[string]int, len(b.converted))
	for k, v := range b.converted {
		out[k] = v
	}
	return out
}
