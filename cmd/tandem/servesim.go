package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"tandem/sim"
)

// backendFlags are serve's choice of compute: the model's forward pass on the CPU, or the
// sim backend's timing model (real scheduler, KV cache, KV events and ORPC; modelled
// compute), optionally as several replicas in one process.
type backendFlags struct {
	backend  *string
	profile  *string
	replicas *int
	timing   sim.Timing // loaded by check
}

func addBackendFlags(fs *flag.FlagSet) *backendFlags {
	return &backendFlags{
		backend:  fs.String("backend", "cpu", "compute backend: cpu (the model's forward pass) or sim (modelled time, deterministic tokens; weights are not read)"),
		profile:  fs.String("sim-profile", "", "with --backend sim: timing model, a JSON file from tandem profile, or gpu or cpu (default gpu: ≈8B on an H100)"),
		replicas: fs.Int("replicas", 1, "with --backend sim: simulated workers in this process, each its own engine and ORPC endpoint (needs --join; the HTTP API serves replica 0)"),
	}
}

func (b *backendFlags) sim() bool { return *b.backend == "sim" }

// check validates the flags and loads the sim timing model.
func (b *backendFlags) check(joins []string, advertise string, orpcPort int) (sim.Timing, error) {
	switch *b.backend {
	case "cpu":
		if *b.profile != "" || *b.replicas != 1 {
			return sim.Timing{}, errors.New("--sim-profile and --replicas need --backend sim")
		}
		return sim.Timing{}, nil
	case "sim":
	default:
		return sim.Timing{}, fmt.Errorf("--backend %q: want cpu or sim", *b.backend)
	}
	if *b.replicas < 1 || *b.replicas > 1024 {
		return sim.Timing{}, fmt.Errorf("--replicas %d: want 1 to 1024", *b.replicas)
	}
	if *b.replicas > 1 && len(joins) == 0 {
		return sim.Timing{}, errors.New("--replicas > 1 needs --join: replicas other than the first are reached through a router")
	}
	if *b.replicas > 1 && advertise != "" && orpcPort == 0 {
		return sim.Timing{}, errors.New("--advertise with --replicas > 1 needs --orpc-port (replica i advertises the host with port --orpc-port + i)")
	}
	if orpcPort > 0 && orpcPort+*b.replicas-1 > 65535 {
		return sim.Timing{}, fmt.Errorf("--orpc-port %d + %d replicas runs past port 65535", orpcPort, *b.replicas)
	}
	t, err := loadTiming(*b.profile)
	b.timing = t
	return t, err
}

// loadTiming reads a timing model: "gpu" or "" (the default), "cpu", or a JSON file.
func loadTiming(name string) (sim.Timing, error) {
	switch name {
	case "", "gpu":
		return sim.GPUTiming(), nil
	case "cpu":
		return sim.CPUTiming(), nil
	}
	f, err := os.Open(name)
	if err != nil {
		return sim.Timing{}, err
	}
	defer f.Close()
	return sim.ReadTiming(f)
}

// simTiming is the sim backend's timing model, or nil for the forward pass. The node's
// workers also time their (payload-free) KV pulls with it.
func (b *backendFlags) simTiming() *sim.Timing {
	if !b.sim() {
		return nil
	}
	t := b.timing
	return &t
}

// threads is the CPU threads to start: the sim backend computes nothing.
func (b *backendFlags) threads(n int) int {
	if b.sim() {
		return 1
	}
	return n
}
