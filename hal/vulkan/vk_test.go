package vulkan

import (
	"testing"
	"unsafe"
)

// The structures this package hands the driver have the sizes of Vulkan's
// headers on a 64-bit platform (measured with sizeof from vulkan_core.h,
// 1.3.239), so that a field added, dropped or mistyped shows here rather
// than as a corrupted call.
func TestStructSizes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layouts are declared for 64-bit platforms")
	}
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"VkApplicationInfo", unsafe.Sizeof(applicationInfo{}), 48},
		{"VkInstanceCreateInfo", unsafe.Sizeof(instanceCreateInfo{}), 64},
		{"VkPhysicalDeviceProperties", unsafe.Sizeof(physicalDeviceProperties{}), 824},
		{"VkPhysicalDeviceProperties.limits", unsafe.Offsetof(physicalDeviceProperties{}.limits), 296},
		{"VkQueueFamilyProperties", unsafe.Sizeof(queueFamilyProperties{}), 24},
		{"VkPhysicalDeviceMemoryProperties", unsafe.Sizeof(physicalDeviceMemoryProperties{}), 520},
		{"VkPhysicalDeviceMemoryProperties.memoryHeaps", unsafe.Offsetof(physicalDeviceMemoryProperties{}.heaps), 264},
		{"VkDeviceQueueCreateInfo", unsafe.Sizeof(deviceQueueCreateInfo{}), 40},
		{"VkDeviceCreateInfo", unsafe.Sizeof(deviceCreateInfo{}), 72},
		{"VkPhysicalDeviceBufferDeviceAddressFeatures", unsafe.Sizeof(bufferDeviceAddressFeatures{}), 32},
		{"VkPhysicalDeviceFeatures2", unsafe.Sizeof(physicalDeviceFeatures2{}), 240},
		{"VkBufferCreateInfo", unsafe.Sizeof(bufferCreateInfo{}), 56},
		{"VkBufferCreateInfo.size", unsafe.Offsetof(bufferCreateInfo{}.size), 24},
		{"VkMemoryRequirements", unsafe.Sizeof(memoryRequirements{}), 24},
		{"VkMemoryAllocateInfo", unsafe.Sizeof(memoryAllocateInfo{}), 32},
		{"VkMemoryAllocateFlagsInfo", unsafe.Sizeof(memoryAllocateFlagsInfo{}), 24},
		{"VkBufferDeviceAddressInfo", unsafe.Sizeof(bufferDeviceAddressInfo{}), 24},
		{"VkShaderModuleCreateInfo", unsafe.Sizeof(shaderModuleCreateInfo{}), 40},
		{"VkPushConstantRange", unsafe.Sizeof(pushConstantRange{}), 12},
		{"VkPipelineLayoutCreateInfo", unsafe.Sizeof(pipelineLayoutCreateInfo{}), 48},
		{"VkSpecializationMapEntry", unsafe.Sizeof(specializationMapEntry{}), 16},
		{"VkSpecializationInfo", unsafe.Sizeof(specializationInfo{}), 32},
		{"VkPipelineShaderStageCreateInfo", unsafe.Sizeof(pipelineShaderStageCreateInfo{}), 48},
		{"VkComputePipelineCreateInfo", unsafe.Sizeof(computePipelineCreateInfo{}), 96},
		{"VkComputePipelineCreateInfo.stage", unsafe.Offsetof(computePipelineCreateInfo{}.stage), 24},
		{"VkComputePipelineCreateInfo.layout", unsafe.Offsetof(computePipelineCreateInfo{}.layout), 72},
		{"VkCommandPoolCreateInfo", unsafe.Sizeof(commandPoolCreateInfo{}), 24},
		{"VkCommandBufferAllocateInfo", unsafe.Sizeof(commandBufferAllocateInfo{}), 32},
		{"VkCommandBufferBeginInfo", unsafe.Sizeof(commandBufferBeginInfo{}), 32},
		{"VkMemoryBarrier", unsafe.Sizeof(memoryBarrier{}), 24},
		{"VkBufferCopy", unsafe.Sizeof(bufferCopy{}), 24},
		{"VkSubmitInfo", unsafe.Sizeof(submitInfo{}), 72},
		{"VkFenceCreateInfo", unsafe.Sizeof(fenceCreateInfo{}), 24},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, the header's %d", c.name, c.got, c.want)
		}
	}
}

// The limits read from VkPhysicalDeviceLimits by offset are the device's:
// lavapipe's are known (and any device's are at least Vulkan's minimums).
func TestDeviceLimits(t *testing.T) {
	b := testBackend(t, Options{Device: -1})
	p := &b.phys.props
	if got := p.limit(limitMaxPushConstantsSize); got < 128 {
		t.Errorf("maxPushConstantsSize %d, Vulkan's minimum is 128", got)
	}
	if got := p.limit(limitMaxComputeSharedMemory); got < 16384 {
		t.Errorf("maxComputeSharedMemorySize %d, Vulkan's minimum is 16384", got)
	}
	if got := p.limit(limitMaxComputeWorkGroupInvocs); got < 128 {
		t.Errorf("maxComputeWorkGroupInvocations %d, Vulkan's minimum is 128", got)
	}
	if got := p.limit(limitMaxComputeWorkGroupCount); got < 65535 {
		t.Errorf("maxComputeWorkGroupCount[0] %d, Vulkan's minimum is 65535", got)
	}
	ds, err := Devices()
	if err != nil || len(ds) == 0 || ds[0].Name == "" || ds[0].APIVersion < "1.2" {
		t.Errorf("Devices() = %+v, %v", ds, err)
	}
	if b.Name() == "" || b.Device().Name != b.phys.info.Name {
		t.Errorf("Name %q, Device %+v", b.Name(), b.Device())
	}
}
