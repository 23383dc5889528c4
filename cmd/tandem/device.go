package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/hal/vulkan"
	"tandem/node"
)

// deviceFlag is --device: where the forward pass runs. "cpu" (hal/cpu, with
// --threads workers) or "vulkan[:N]" (hal/vulkan on Vulkan device N, or the
// first GPU, else the first device, without N).
type deviceFlag struct {
	s        *string
	noReplay bool // Vulkan: run every step's ops (bench-engine --replay=false)
}

func addDeviceFlag(fs *flag.FlagSet) deviceFlag {
	return deviceFlag{s: fs.String("device", "cpu", "where the forward pass runs: cpu, or vulkan[:N] (Vulkan device N; without N the first GPU, else the first device, e.g. Mesa's lavapipe)")}
}

// parse checks the flag and returns the Vulkan device index (-1: any), or
// ok false for the CPU.
func (d deviceFlag) parse() (index int, vk bool, err error) {
	s := strings.ToLower(strings.TrimSpace(*d.s))
	switch {
	case s == "cpu":
		return 0, false, nil
	case s == "vulkan":
		return -1, true, nil
	case strings.HasPrefix(s, "vulkan:"):
		n, err := strconv.Atoi(s[len("vulkan:"):])
		if err != nil || n < 0 {
			return 0, false, fmt.Errorf("--device %q: want vulkan:N with N a device number (tandem devices lists them)", *d.s)
		}
		return n, true, nil
	}
	return 0, false, fmt.Errorf("--device %q: want cpu or vulkan[:N]", *d.s)
}

func (d deviceFlag) vulkan() bool {
	_, vk, _ := d.parse()
	return vk
}

// open starts the backend --device names.
func (d deviceFlag) open(threads int, log *slog.Logger) (hal.Backend, error) {
	index, vk, err := d.parse()
	if err != nil {
		return nil, err
	}
	if !vk {
		return cpu.New(threads), nil
	}
	be, err := vulkan.New(vulkan.Options{Device: index, Logger: log, NoReplay: d.noReplay})
	if errors.Is(err, vulkan.ErrUnavailable) {
		return nil, fmt.Errorf("--device %s: %w (Debian's mesa-vulkan-drivers gives a CPU device, lavapipe; a GPU needs its vendor's Vulkan driver)", *d.s, err)
	}
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", *d.s, err)
	}
	return be, nil
}

// backendThreads is the CPU threads a backend computes with (1 for a device,
// which computes with its own).
func backendThreads(be hal.Backend) int {
	if c, ok := be.(*cpu.Backend); ok {
		return c.Threads()
	}
	return 1
}

// backendKind names a backend in bench-engine's table: the CPU kernels'
// instruction set, or the Vulkan device's number (tandem devices names it).
func backendKind(be hal.Backend) string {
	if v, ok := be.(*vulkan.Backend); ok {
		return fmt.Sprintf("vulkan:%d", v.Device().Index)
	}
	return cpu.KernelISA()
}

// deviceKVBudget is the default KV budget on a device backend: the node's
// default (host memory, capped by what the context needs), but no more
// than 90% of the device memory the weights left. 0 for the CPU, whose
// default is the node's.
func deviceKVBudget(be hal.Backend, perToken int64, maxTokens int) int64 {
	v, ok := be.(*vulkan.Backend)
	if !ok {
		return 0
	}
	heap, used := v.DeviceMemory()
	return max(perToken, min(node.DefaultKVBudget(perToken, maxTokens), (heap-used)/10*9))
}

// cpuDevice is --device cpu, for commands that compute nothing.
func cpuDevice() deviceFlag {
	s := "cpu"
	return deviceFlag{s: &s}
}

// deviceSteps is a device backend's step counters (zero for the CPU).
func deviceSteps(be hal.Backend) vulkan.Stats {
	if v, ok := be.(*vulkan.Backend); ok {
		return v.Stats()
	}
	return vulkan.Stats{}
}

// devicesCmd lists the devices --device can name: tandem devices.
func devicesCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("takes no arguments")
	}
	c := cpu.New(0)
	fmt.Fprintf(stdout, "cpu: %s\n", c.Name())
	c.Close()
	ds, err := vulkan.Devices()
	if err != nil {
		fmt.Fprintf(stdout, "vulkan: %v\n", err)
		return nil
	}
	if len(ds) == 0 {
		fmt.Fprintln(stdout, "vulkan: no devices")
	}
	for _, d := range ds {
		use := ""
		if !d.Usable {
			use = " — not usable: " + d.Why
		}
		fmt.Fprintf(stdout, "vulkan:%d: %s (%s, Vulkan %s, %s device memory)%s\n", d.Index, d.Name, d.Type, d.APIVersion, formatBytes(d.DeviceMemory), use)
	}
	return nil
}
