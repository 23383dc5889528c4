//go:build linux && (amd64 || arm64)

package vulkan

import (
	"fmt"
	"sync"

	"github.com/ebitengine/purego"
)

// The loader is opened once per process (dlopen of libvulkan.so.1) and never
// closed: its drivers keep threads and state for the process's life.
var loader struct {
	once sync.Once
	gipa uintptr // vkGetInstanceProcAddr
	err  error
}

func openLoader() (uintptr, error) {
	loader.once.Do(func() {
		var lib uintptr
		var err error
		for _, name := range []string{"libvulkan.so.1", "libvulkan.so"} {
			if lib, err = purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
				break
			}
		}
		if err != nil {
			loader.err = fmt.Errorf("%w: %v", errNoVulkan, err)
			return
		}
		if loader.gipa, err = purego.Dlsym(lib, "vkGetInstanceProcAddr"); err != nil {
			loader.err = fmt.Errorf("%w: %v", errNoVulkan, err)
		}
	})
	return loader.gipa, loader.err
}

// ccall calls the C function fn with integer and pointer arguments and
// returns its integer result. Pointers passed as uintptr(unsafe.Pointer(p))
// in the call stay live and in place for the call (go:uintptrescapes).
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// callArgs holds a call's arguments in memory that outlives the call, so
// that the calls of the hot paths (recording a dispatch, submitting,
// waiting) allocate nothing: ccall's variadic arguments escape, and each
// call would allocate their slice. The pointers among the arguments must
// point to memory that stays reachable and in place by other means (fields
// of the backend, its submitters and stores). One goroutine at a time.
type callArgs [12]uintptr

func (a *callArgs) call(fn uintptr, args ...uintptr) uintptr {
	n := copy(a[:], args)
	r, _, _ := purego.SyscallN(fn, a[:n]...)
	return r
}
