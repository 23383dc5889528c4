// Package vulkan is hal's GPU backend: Vulkan compute shaders on any Vulkan 1.2 device (NVIDIA,
// AMD and Intel GPUs; Mesa's lavapipe on the CPU), with each step shape replayed from a command buffer.
//
// The Vulkan loader is opened at run time (no cgo, no headers to build); weights, activations
// and the paged KV store live in device memory, reached by the shaders through buffer device
// addresses; every op reduces each output in an order fixed by the shapes of one row, so a
// sequence's results do not depend on its batch. docs/architecture.md, "The Vulkan backend",
// has the design and what it was measured against.
package vulkan
