package vulkan

import (
	"errors"
	"fmt"
	"unsafe"

	"tandem/hal"
)

// ErrUnavailable is wrapped by the error of New and Devices on a machine
// where Vulkan cannot run this backend: no loader, no device, or no device
// with what the backend needs (Vulkan 1.2 with buffer device addresses).
var ErrUnavailable = errors.New("vulkan: backend unavailable")

// DeviceInfo describes a Vulkan physical device.
type DeviceInfo struct {
	Index      int    // its place in the driver's enumeration: the N of --device vulkan:N
	Name       string // as the driver names it, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
	Type       string // "discrete GPU", "integrated GPU", "virtual GPU", "CPU" or "other"
	APIVersion string // the Vulkan version it supports, e.g. "1.3.230"
	// DeviceMemory is the size of its largest device-local heap, in bytes.
	DeviceMemory int64
	// Usable is false when the device lacks what the backend needs (Why says what).
	Usable bool
	Why    string
}

func deviceTypeName(t uint32) string {
	switch t {
	case deviceTypeDiscrete:
		return "discrete GPU"
	case deviceTypeIntegrated:
		return "integrated GPU"
	case deviceTypeVirtual:
		return "virtual GPU"
	case deviceTypeCPU:
		return "CPU"
	}
	return "other"
}

func versionString(v uint32) string {
	return fmt.Sprintf("%d.%d.%d", v>>22&0x7f, v>>12&0x3ff, v&0xfff)
}

// instance is a VkInstance and the functions loaded through it.
type instance struct {
	h    vkHandle
	gipa uintptr
	fn   instanceFuncs
}

type instanceFuncs struct {
	destroyInstance, enumeratePhysicalDevices, getProperties, getQueueFamilies,
	getMemoryProperties, getFeatures2, createDevice, getDeviceProcAddr uintptr
}

func newInstance() (*instance, error) {
	gipa, err := openLoader()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	create := procAddr(gipa, 0, "vkCreateInstance")
	if create == 0 {
		return nil, fmt.Errorf("%w: the loader has no vkCreateInstance", ErrUnavailable)
	}
	app := &applicationInfo{sType: stApplicationInfo, appName: cstr("tandem"), engineName: cstr("tandem"), apiVersion: vkAPIVersion12}
	ci := &instanceCreateInfo{sType: stInstanceCreateInfo, appInfo: app}
	in := &instance{gipa: gipa}
	if r := vkResult(ccall(create, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&in.h)))); r != vkSuccess {
		return nil, fmt.Errorf("%w: vkCreateInstance: %v (no Vulkan driver installed?)", ErrUnavailable, r)
	}
	f := &in.fn
	for _, p := range []struct {
		fn   *uintptr
		name string
	}{
		{&f.destroyInstance, "vkDestroyInstance"},
		{&f.enumeratePhysicalDevices, "vkEnumeratePhysicalDevices"},
		{&f.getProperties, "vkGetPhysicalDeviceProperties"},
		{&f.getQueueFamilies, "vkGetPhysicalDeviceQueueFamilyProperties"},
		{&f.getMemoryProperties, "vkGetPhysicalDeviceMemoryProperties"},
		{&f.getFeatures2, "vkGetPhysicalDeviceFeatures2"},
		{&f.createDevice, "vkCreateDevice"},
		{&f.getDeviceProcAddr, "vkGetDeviceProcAddr"},
	} {
		if *p.fn = procAddr(gipa, in.h, p.name); *p.fn == 0 {
			in.close()
			return nil, fmt.Errorf("%w: the loader has no %s", ErrUnavailable, p.name)
		}
	}
	return in, nil
}

func procAddr(gipa uintptr, inst vkHandle, name string) uintptr {
	return ccall(gipa, inst, uintptr(unsafe.Pointer(cstr(name))))
}

func (in *instance) close() {
	if in.h != 0 && in.fn.destroyInstance != 0 {
		ccall(in.fn.destroyInstance, in.h, 0)
	}
	in.h = 0
}

// physical is a physical device and what the backend reads of it.
type physical struct {
	h        vkHandle
	info     DeviceInfo
	props    physicalDeviceProperties
	mem      physicalDeviceMemoryProperties
	family   uint32 // a queue family with compute
	bdaFeats bool
}

func (in *instance) physicalDevices() ([]*physical, error) {
	var n uint32
	if r := vkResult(ccall(in.fn.enumeratePhysicalDevices, in.h, uintptr(unsafe.Pointer(&n)), 0)); r != vkSuccess {
		return nil, fmt.Errorf("%w: vkEnumeratePhysicalDevices: %v", ErrUnavailable, r)
	}
	if n == 0 {
		return nil, nil
	}
	hs := make([]vkHandle, n)
	if r := vkResult(ccall(in.fn.enumeratePhysicalDevices, in.h, uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&hs[0])))); r != vkSuccess && r != vkIncomplete {
		return nil, fmt.Errorf("%w: vkEnumeratePhysicalDevices: %v", ErrUnavailable, r)
	}
	var out []*physical
	for i, h := range hs[:n] {
		p := &physical{h: h}
		ccall(in.fn.getProperties, h, uintptr(unsafe.Pointer(&p.props)))
		ccall(in.fn.getMemoryProperties, h, uintptr(unsafe.Pointer(&p.mem)))
		var nq uint32
		ccall(in.fn.getQueueFamilies, h, uintptr(unsafe.Pointer(&nq)), 0)
		qs := make([]queueFamilyProperties, max(nq, 1))
		ccall(in.fn.getQueueFamilies, h, uintptr(unsafe.Pointer(&nq)), uintptr(unsafe.Pointer(&qs[0])))
		p.family = ^uint32(0)
		for j, q := range qs[:nq] {
			if q.queueFlags&queueCompute != 0 && q.queueCount > 0 {
				p.family = uint32(j)
				break
			}
		}
		bda := &bufferDeviceAddressFeatures{sType: stBufferDeviceAddressFeatures}
		f2 := &physicalDeviceFeatures2{sType: stPhysicalDeviceFeatures2, pNext: unsafe.Pointer(bda)}
		if p.props.apiVersion >= vkAPIVersion12 {
			ccall(in.fn.getFeatures2, h, uintptr(unsafe.Pointer(f2)))
		}
		p.bdaFeats = bda.bufferDeviceAddress != 0
		p.info = DeviceInfo{
			Index: i, Name: gostr(p.props.deviceName[:]), Type: deviceTypeName(p.props.deviceType),
			APIVersion: versionString(p.props.apiVersion), DeviceMemory: p.deviceHeap(),
		}
		switch {
		case p.props.apiVersion < vkAPIVersion12:
			p.info.Why = "Vulkan " + p.info.APIVersion + " (the backend needs 1.2)"
		case !p.bdaFeats:
			p.info.Why = "no buffer device addresses (bufferDeviceAddress)"
		case p.family == ^uint32(0):
			p.info.Why = "no compute queue"
		case p.props.limit(limitMaxPushConstantsSize) < maxPushConstantSize:
			p.info.Why = "push constants smaller than 128 bytes"
		default:
			p.info.Usable = true
		}
		out = append(out, p)
	}
	return out, nil
}

// deviceHeap is the size of the largest device-local heap.
func (p *physical) deviceHeap() int64 {
	var best uint64
	for _, h := range p.mem.heaps[:min(p.mem.heapCount, 16)] {
		if h.flags&heapDeviceLocal != 0 {
			best = max(best, h.size)
		}
	}
	return int64(best)
}

// Devices lists the Vulkan devices of this machine, usable by the backend or
// not, in the driver's order. It fails, wrapping ErrUnavailable, where there
// is no Vulkan loader or driver.
func Devices() ([]DeviceInfo, error) {
	in, err := newInstance()
	if err != nil {
		return nil, err
	}
	defer in.close()
	ps, err := in.physicalDevices()
	if err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, len(ps))
	for i, p := range ps {
		out[i] = p.info
	}
	return out, nil
}

// choose picks device index (or, for index < 0, the first usable GPU,
// discrete before integrated, else the first usable device).
func choose(ps []*physical, index int) (*physical, error) {
	if len(ps) == 0 {
		return nil, fmt.Errorf("%w: no Vulkan devices", ErrUnavailable)
	}
	if index >= 0 {
		if index >= len(ps) {
			return nil, fmt.Errorf("vulkan: device %d: there are %d (0 to %d)", index, len(ps), len(ps)-1)
		}
		if p := ps[index]; !p.info.Usable {
			return nil, fmt.Errorf("%w: device %d (%s): %s", ErrUnavailable, index, p.info.Name, p.info.Why)
		}
		return ps[index], nil
	}
	for _, want := range []uint32{deviceTypeDiscrete, deviceTypeIntegrated, deviceTypeVirtual} {
		for _, p := range ps {
			if p.info.Usable && p.props.deviceType == want {
				return p, nil
			}
		}
	}
	for _, p := range ps {
		if p.info.Usable {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w: no usable device (%s: %s)", ErrUnavailable, ps[0].info.Name, ps[0].info.Why)
}

// device is a VkDevice, its queue and the functions loaded through it.
type device struct {
	h     vkHandle
	queue vkHandle
	fn    deviceFuncs
}

type deviceFuncs struct {
	destroyDevice, getDeviceQueue, deviceWaitIdle,
	createBuffer, destroyBuffer, getBufferMemReq, allocateMemory, freeMemory, bindBufferMemory,
	mapMemory, unmapMemory, getBufferAddress,
	createShaderModule, destroyShaderModule, createPipelineLayout, destroyPipelineLayout,
	createComputePipelines, destroyPipeline,
	createCommandPool, destroyCommandPool, allocateCommandBuffers, freeCommandBuffers,
	beginCommandBuffer, endCommandBuffer, resetCommandBuffer,
	cmdBindPipeline, cmdPushConstants, cmdDispatch, cmdPipelineBarrier, cmdCopyBuffer, cmdFillBuffer,
	queueSubmit, createFence, destroyFence, waitForFences, resetFences uintptr
}

func (in *instance) newDevice(p *physical) (*device, error) {
	prio := new(float32)
	*prio = 1
	q := &deviceQueueCreateInfo{sType: stDeviceQueueCreateInfo, family: p.family, count: 1, pPriorities: prio}
	bda := &bufferDeviceAddressFeatures{sType: stBufferDeviceAddressFeatures, bufferDeviceAddress: 1}
	ci := &deviceCreateInfo{sType: stDeviceCreateInfo, pNext: unsafe.Pointer(bda), queueCreateInfoCount: 1, queueCreateInfos: q}
	d := &device{}
	if r := vkResult(ccall(in.fn.createDevice, p.h, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&d.h)))); r != vkSuccess {
		return nil, fmt.Errorf("vulkan: vkCreateDevice on %s: %v", p.info.Name, r)
	}
	f := &d.fn
	for _, e := range []struct {
		fn   *uintptr
		name string
	}{
		{&f.destroyDevice, "vkDestroyDevice"}, {&f.getDeviceQueue, "vkGetDeviceQueue"}, {&f.deviceWaitIdle, "vkDeviceWaitIdle"},
		{&f.createBuffer, "vkCreateBuffer"}, {&f.destroyBuffer, "vkDestroyBuffer"},
		{&f.getBufferMemReq, "vkGetBufferMemoryRequirements"}, {&f.allocateMemory, "vkAllocateMemory"},
		{&f.freeMemory, "vkFreeMemory"}, {&f.bindBufferMemory, "vkBindBufferMemory"},
		{&f.mapMemory, "vkMapMemory"}, {&f.unmapMemory, "vkUnmapMemory"},
		{&f.getBufferAddress, "vkGetBufferDeviceAddress"},
		{&f.createShaderModule, "vkCreateShaderModule"}, {&f.destroyShaderModule, "vkDestroyShaderModule"},
		{&f.createPipelineLayout, "vkCreatePipelineLayout"}, {&f.destroyPipelineLayout, "vkDestroyPipelineLayout"},
		{&f.createComputePipelines, "vkCreateComputePipelines"}, {&f.destroyPipeline, "vkDestroyPipeline"},
		{&f.createCommandPool, "vkCreateCommandPool"}, {&f.destroyCommandPool, "vkDestroyCommandPool"},
		{&f.allocateCommandBuffers, "vkAllocateCommandBuffers"}, {&f.freeCommandBuffers, "vkFreeCommandBuffers"},
		{&f.beginCommandBuffer, "vkBeginCommandBuffer"}, {&f.endCommandBuffer, "vkEndCommandBuffer"},
		{&f.resetCommandBuffer, "vkResetCommandBuffer"},
		{&f.cmdBindPipeline, "vkCmdBindPipeline"}, {&f.cmdPushConstants, "vkCmdPushConstants"},
		{&f.cmdDispatch, "vkCmdDispatch"}, {&f.cmdPipelineBarrier, "vkCmdPipelineBarrier"},
		{&f.cmdCopyBuffer, "vkCmdCopyBuffer"}, {&f.cmdFillBuffer, "vkCmdFillBuffer"},
		{&f.queueSubmit, "vkQueueSubmit"}, {&f.createFence, "vkCreateFence"}, {&f.destroyFence, "vkDestroyFence"},
		{&f.waitForFences, "vkWaitForFences"}, {&f.resetFences, "vkResetFences"},
	} {
		if *e.fn = ccall(in.fn.getDeviceProcAddr, d.h, uintptr(unsafe.Pointer(cstr(e.name)))); *e.fn == 0 {
			if f.destroyDevice != 0 {
				ccall(f.destroyDevice, d.h, 0)
			}
			return nil, fmt.Errorf("vulkan: the device has no %s", e.name)
		}
	}
	ccall(f.getDeviceQueue, d.h, uintptr(p.family), 0, uintptr(unsafe.Pointer(&d.queue)))
	return d, nil
}

// check turns a failed result into an error: out of memory wraps
// hal.ErrOutOfMemory, a lost device hal.ErrDeviceLost.
func check(call string, r vkResult) error {
	switch r {
	case vkSuccess:
		return nil
	case vkErrorOutOfDeviceMemory, vkErrorOutOfHostMemory:
		return fmt.Errorf("%w: %w", &errVk{call, r}, hal.ErrOutOfMemory)
	case vkErrorDeviceLost:
		return fmt.Errorf("%w: %w", &errVk{call, r}, hal.ErrDeviceLost)
	}
	return &errVk{call, r}
}
