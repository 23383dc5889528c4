package vulkan

import (
	"errors"
	"fmt"
	"structs"
	"unsafe"
)

// The part of the Vulkan API this backend calls, declared by hand: the
// structures with the C layout of a 64-bit platform (Go lays out these field
// types as C does there; vk_test.go holds the sizes to those of the
// headers), the constants it uses, and the functions, loaded from the
// system's loader at run time (loader_*.go), so that building needs neither
// the headers nor cgo.

type (
	vkResult int32
	// Dispatchable handles are pointers; the others are 64-bit values.
	vkHandle = uintptr
)

const (
	vkSuccess                 vkResult = 0
	vkNotReady                vkResult = 1
	vkTimeout                 vkResult = 2
	vkIncomplete              vkResult = 5
	vkErrorOutOfHostMemory    vkResult = -1
	vkErrorOutOfDeviceMemory  vkResult = -2
	vkErrorInitFailed         vkResult = -3
	vkErrorDeviceLost         vkResult = -4
	vkErrorIncompatibleDriver vkResult = -9
)

func (r vkResult) String() string {
	switch r {
	case vkSuccess:
		return "VK_SUCCESS"
	case vkNotReady:
		return "VK_NOT_READY"
	case vkTimeout:
		return "VK_TIMEOUT"
	case vkIncomplete:
		return "VK_INCOMPLETE"
	case vkErrorOutOfHostMemory:
		return "VK_ERROR_OUT_OF_HOST_MEMORY"
	case vkErrorOutOfDeviceMemory:
		return "VK_ERROR_OUT_OF_DEVICE_MEMORY"
	case vkErrorInitFailed:
		return "VK_ERROR_INITIALIZATION_FAILED"
	case vkErrorDeviceLost:
		return "VK_ERROR_DEVICE_LOST"
	case vkErrorIncompatibleDriver:
		return "VK_ERROR_INCOMPATIBLE_DRIVER"
	}
	return fmt.Sprintf("VkResult(%d)", int32(r))
}

// errVk is the error of a failed call: out-of-memory results wrap
// hal.ErrOutOfMemory and a lost device hal.ErrDeviceLost (see check).
type errVk struct {
	call string
	r    vkResult
}

func (e *errVk) Error() string { return fmt.Sprintf("vulkan: %s: %v", e.call, e.r) }

var errNoVulkan = errors.New("vulkan: no Vulkan loader (libvulkan) on this machine")

// Structure types.
const (
	stApplicationInfo             = 0
	stInstanceCreateInfo          = 1
	stDeviceQueueCreateInfo       = 2
	stDeviceCreateInfo            = 3
	stSubmitInfo                  = 4
	stMemoryAllocateInfo          = 5
	stFenceCreateInfo             = 8
	stBufferCreateInfo            = 12
	stShaderModuleCreateInfo      = 16
	stPipelineShaderStageCreate   = 18
	stComputePipelineCreateInfo   = 29
	stPipelineLayoutCreateInfo    = 30
	stCommandPoolCreateInfo       = 39
	stCommandBufferAllocateInfo   = 40
	stCommandBufferBeginInfo      = 42
	stMemoryBarrier               = 46
	stPhysicalDeviceFeatures2     = 1000059000
	stMemoryAllocateFlagsInfo     = 1000060000
	stBufferDeviceAddressInfo     = 1000244001
	stBufferDeviceAddressFeatures = 1000257000
)

// Flags and enumerations.
const (
	vkAPIVersion12 = 1<<22 | 2<<12

	deviceTypeOther      = 0
	deviceTypeIntegrated = 1
	deviceTypeDiscrete   = 2
	deviceTypeVirtual    = 3
	deviceTypeCPU        = 4

	queueCompute = 2

	memDeviceLocal  = 1
	memHostVisible  = 2
	memHostCoherent = 4
	memHostCached   = 8
	heapDeviceLocal = 1

	bufTransferSrc   = 1
	bufTransferDst   = 2
	bufStorage       = 32
	bufDeviceAddress = 0x20000
	memAllocAddress  = 2 // VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT

	stageCompute     = 0x800
	stageTransfer    = 0x1000
	stageHost        = 0x4000
	stageAllCommands = 0x10000

	accessShaderRead    = 0x20
	accessShaderWrite   = 0x40
	accessTransferRead  = 0x800
	accessTransferWrite = 0x1000
	accessHostRead      = 0x2000
	accessHostWrite     = 0x4000
	accessMemoryRead    = 0x8000
	accessMemoryWrite   = 0x10000

	shaderStageCompute  = 0x20
	bindPointCompute    = 1
	poolResetCmdBuffer  = 2
	cmdOneTimeSubmit    = 1
	cmdLevelPrimary     = 0
	sharingExclusive    = 0
	wholeSize           = ^uint64(0)
	fenceForever        = ^uint64(0)
	maxPushConstantSize = 128
)

type applicationInfo struct {
	_             structs.HostLayout
	sType         uint32
	pNext         unsafe.Pointer
	appName       *byte
	appVersion    uint32
	engineName    *byte
	engineVersion uint32
	apiVersion    uint32
}

type instanceCreateInfo struct {
	_                     structs.HostLayout
	sType                 uint32
	pNext                 unsafe.Pointer
	flags                 uint32
	appInfo               *applicationInfo
	enabledLayerCount     uint32
	enabledLayerNames     unsafe.Pointer
	enabledExtensionCount uint32
	enabledExtensionNames unsafe.Pointer
}

// physicalDeviceProperties is VkPhysicalDeviceProperties with the limits
// this backend reads named and the rest as bytes.
type physicalDeviceProperties struct {
	_             structs.HostLayout
	apiVersion    uint32
	driverVersion uint32
	vendorID      uint32
	deviceID      uint32
	deviceType    uint32
	deviceName    [256]byte
	cacheUUID     [16]byte
	limits        [63]uint64 // VkPhysicalDeviceLimits: 504 bytes, 8-byte aligned (it holds VkDeviceSizes)
	sparse        [5]uint32
}

// Offsets into VkPhysicalDeviceLimits.
const (
	limitMaxStorageBufferRange     = 28
	limitMaxPushConstantsSize      = 32
	limitMaxMemoryAllocationCount  = 36
	limitMaxComputeSharedMemory    = 216
	limitMaxComputeWorkGroupCount  = 220
	limitMaxComputeWorkGroupInvocs = 232
)

func (p *physicalDeviceProperties) limit(off int) uint32 {
	return *(*uint32)(unsafe.Add(unsafe.Pointer(&p.limits), off))
}

type queueFamilyProperties struct {
	_          structs.HostLayout
	queueFlags uint32
	queueCount uint32
	tsBits     uint32
	gran       [3]uint32
}

type memoryType struct {
	_         structs.HostLayout
	flags     uint32
	heapIndex uint32
}

type memoryHeap struct {
	_     structs.HostLayout
	size  uint64
	flags uint32
}

type physicalDeviceMemoryProperties struct {
	_         structs.HostLayout
	typeCount uint32
	types     [32]memoryType
	heapCount uint32
	heaps     [16]memoryHeap
}

type bufferDeviceAddressFeatures struct {
	_                   structs.HostLayout
	sType               uint32
	pNext               unsafe.Pointer
	bufferDeviceAddress uint32
	captureReplay       uint32
	multiDevice         uint32
}

type physicalDeviceFeatures2 struct {
	_        structs.HostLayout
	sType    uint32
	pNext    unsafe.Pointer
	features [55]uint32 // VkPhysicalDeviceFeatures
}

type deviceQueueCreateInfo struct {
	_           structs.HostLayout
	sType       uint32
	pNext       unsafe.Pointer
	flags       uint32
	family      uint32
	count       uint32
	pPriorities *float32
}

type deviceCreateInfo struct {
	_                     structs.HostLayout
	sType                 uint32
	pNext                 unsafe.Pointer
	flags                 uint32
	queueCreateInfoCount  uint32
	queueCreateInfos      *deviceQueueCreateInfo
	enabledLayerCount     uint32
	enabledLayerNames     unsafe.Pointer
	enabledExtensionCount uint32
	enabledExtensionNames unsafe.Pointer
	enabledFeatures       unsafe.Pointer
}

type bufferCreateInfo struct {
	_                  structs.HostLayout
	sType              uint32
	pNext              unsafe.Pointer
	flags              uint32
	size               uint64
	usage              uint32
	sharingMode        uint32
	queueFamilyCount   uint32
	queueFamilyIndices unsafe.Pointer
}

type memoryRequirements struct {
	_         structs.HostLayout
	size      uint64
	alignment uint64
	typeBits  uint32
}

type memoryAllocateInfo struct {
	_         structs.HostLayout
	sType     uint32
	pNext     unsafe.Pointer
	size      uint64
	typeIndex uint32
}

type memoryAllocateFlagsInfo struct {
	_          structs.HostLayout
	sType      uint32
	pNext      unsafe.Pointer
	flags      uint32
	deviceMask uint32
}

type bufferDeviceAddressInfo struct {
	_      structs.HostLayout
	sType  uint32
	pNext  unsafe.Pointer
	buffer vkHandle
}

type shaderModuleCreateInfo struct {
	_        structs.HostLayout
	sType    uint32
	pNext    unsafe.Pointer
	flags    uint32
	codeSize uintptr
	code     *uint32
}

type pushConstantRange struct {
	_          structs.HostLayout
	stageFlags uint32
	offset     uint32
	size       uint32
}

type pipelineLayoutCreateInfo struct {
	_                structs.HostLayout
	sType            uint32
	pNext            unsafe.Pointer
	flags            uint32
	setLayoutCount   uint32
	setLayouts       unsafe.Pointer
	pushRangeCount   uint32
	pushConstantRang *pushConstantRange
}

type specializationMapEntry struct {
	_          structs.HostLayout
	constantID uint32
	offset     uint32
	size       uintptr
}

type specializationInfo struct {
	_          structs.HostLayout
	entryCount uint32
	entries    *specializationMapEntry
	dataSize   uintptr
	data       unsafe.Pointer
}

type pipelineShaderStageCreateInfo struct {
	_      structs.HostLayout
	sType  uint32
	pNext  unsafe.Pointer
	flags  uint32
	stage  uint32
	module vkHandle
	name   *byte
	spec   *specializationInfo
}

type computePipelineCreateInfo struct {
	_         structs.HostLayout
	sType     uint32
	pNext     unsafe.Pointer
	flags     uint32
	stage     pipelineShaderStageCreateInfo
	layout    vkHandle
	basePipe  vkHandle
	baseIndex int32
}

type commandPoolCreateInfo struct {
	_      structs.HostLayout
	sType  uint32
	pNext  unsafe.Pointer
	flags  uint32
	family uint32
}

type commandBufferAllocateInfo struct {
	_     structs.HostLayout
	sType uint32
	pNext unsafe.Pointer
	pool  vkHandle
	level uint32
	count uint32
}

type commandBufferBeginInfo struct {
	_           structs.HostLayout
	sType       uint32
	pNext       unsafe.Pointer
	flags       uint32
	inheritance unsafe.Pointer
}

type memoryBarrier struct {
	_     structs.HostLayout
	sType uint32
	pNext unsafe.Pointer
	src   uint32
	dst   uint32
}

type bufferCopy struct {
	_         structs.HostLayout
	srcOffset uint64
	dstOffset uint64
	size      uint64
}

type submitInfo struct {
	_                structs.HostLayout
	sType            uint32
	pNext            unsafe.Pointer
	waitCount        uint32
	waitSemaphores   unsafe.Pointer
	waitStages       unsafe.Pointer
	cmdBufferCount   uint32
	cmdBuffers       *vkHandle
	signalCount      uint32
	signalSemaphores unsafe.Pointer
}

type fenceCreateInfo struct {
	_     structs.HostLayout
	sType uint32
	pNext unsafe.Pointer
	flags uint32
}

// cstr is s as a NUL-terminated C string (memory the collector keeps while
// the caller holds the pointer).
func cstr(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// gostr is the NUL-terminated string at the start of b.
func gostr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
