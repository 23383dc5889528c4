//go:build !(linux && (amd64 || arm64))

package vulkan

import "fmt"

func openLoader() (uintptr, error) {
	return 0, fmt.Errorf("%w: this build loads the Vulkan loader on 64-bit Linux only", errNoVulkan)
}

func ccall(fn uintptr, args ...uintptr) uintptr { panic("vulkan: no loader") }

type callArgs [12]uintptr

func (a *callArgs) call(fn uintptr, args ...uintptr) uintptr { panic("vulkan: no loader") }
