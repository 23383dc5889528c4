// Package vulkantest opens the Vulkan backend for tests: where Vulkan cannot
// run it the test is skipped, saying why, unless TANDEM_VULKAN=required.
//
// CI installs Mesa's lavapipe (mesa-vulkan-drivers) and sets
// TANDEM_VULKAN=required, so that a broken installation fails the tests
// instead of skipping them.
package vulkantest

import (
	"errors"
	"os"
	"testing"

	"tandem/hal/vulkan"
)

// Required reports whether TANDEM_VULKAN=required is set.
func Required() bool { return os.Getenv("TANDEM_VULKAN") == "required" }

// New opens a backend with opts and closes it when the test ends; it skips
// the test where Vulkan is unavailable (vulkan.ErrUnavailable), unless
// Required.
func New(tb testing.TB, opts vulkan.Options) *vulkan.Backend {
	tb.Helper()
	b, err := vulkan.New(opts)
	if errors.Is(err, vulkan.ErrUnavailable) && !Required() {
		tb.Skipf("Vulkan unavailable here (Debian's mesa-vulkan-drivers provides lavapipe): %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	return b
}

// Skip skips the test where Vulkan is unavailable (unless Required), and
// returns the device list otherwise: for tests that start a process with
// --device vulkan.
func Skip(tb testing.TB) []vulkan.DeviceInfo {
	tb.Helper()
	ds, err := vulkan.Devices()
	if err == nil {
		for _, d := range ds {
			if d.Usable {
				return ds
			}
		}
		err = errors.New("no usable Vulkan device")
	}
	if Required() {
		tb.Fatalf("TANDEM_VULKAN=required: %v", err)
	}
	tb.Skipf("Vulkan unavailable here (Debian's mesa-vulkan-drivers provides lavapipe): %v", err)
	return nil
}
