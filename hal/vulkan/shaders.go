package vulkan

import "embed"

// The compute shaders, GLSL in shaders/, compiled to SPIR-V by glslc (Debian's
// glslc package) and committed: building needs no shader compiler, and CI
// regenerates them and fails on a difference (.ci/run).
//
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/matmul.spv shaders/matmul.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/quantize.spv shaders/quantize.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/embed.spv shaders/embed.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/rmsnorm.spv shaders/rmsnorm.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/rope.spv shaders/rope.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/elementwise.spv shaders/elementwise.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/storekv.spv shaders/storekv.comp
//go:generate glslc --target-env=vulkan1.2 -O -o shaders/attention.spv shaders/attention.comp

//go:embed shaders/*.spv
var spirv embed.FS
