package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/hal"
	"tandem/model"
	"tandem/sim"
	"tandem/worker"
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

// transferTime is the workers' modelled KV transfer time: the timing model's, with the sim
// backend, whose blocks cross the wire without payload (docs/disaggregation.md).
func (b *backendFlags) transferTime() func(int64) time.Duration {
	if !b.sim() {
		return nil
	}
	return b.timing.Transfer
}

// threads is the CPU threads to start: the sim backend computes nothing.
func (b *backendFlags) threads(n int) int {
	if b.sim() {
		return 1
	}
	return n
}

// newEngines builds the engine, or with the sim backend its replicas; only the first
// keeps cfg.Metrics (the engine metrics are per process, and the HTTP API is replica 0's).
func (b *backendFlags) newEngines(m *model.Model, be hal.Backend, timing sim.Timing, cfg engine.Config) ([]*engine.Engine, error) {
	if !b.sim() {
		e, err := engine.New(m, be, cfg)
		return []*engine.Engine{e}, err
	}
	tok := m.Tokenizer
	var out []*engine.Engine
	for i := range *b.replicas {
		step, err := simstep.New(simstep.Config{Timing: timing, Vocab: m.Config.VocabSize,
			Skip: func(id int32) bool { return tok.IsEOG(id) || tok.IsControl(id) }})
		if err != nil {
			return nil, err
		}
		c := cfg
		if i > 0 {
			c.Metrics = nil
			c.Logger = cfg.Logger.With("replica", i)
		}
		e, err := engine.NewWithForwarder(m, step, c)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// startWorkers makes each engine a cluster member, with base's card and routers. A node's
// name is the one in its certificate, so each replica has its own identity: replica 0's in
// the state directory, replica i's in its subdirectory replica-i. Replica
// i listens on orpcPort+i (a free port when orpcPort is 0) and is named node-i (default
// names already differ by port). fatal receives the first error that ends a member; done is
// closed when all have returned. With the sim backend, the workers model KV transfer time.
func (b *backendFlags) startWorkers(ctx context.Context, engines []*engine.Engine, base worker.Config, host string, orpcPort int, log *slog.Logger) (done <-chan struct{}, fatal <-chan error, err error) {
	n := len(engines)
	ws := make([]*worker.Worker, n)
	advHost := ""
	if base.Advertise != "" && n > 1 {
		if advHost, _, err = net.SplitHostPort(base.Advertise); err != nil {
			return nil, nil, fmt.Errorf("--advertise: %w", err)
		}
	}
	for i, e := range engines {
		c := base
		c.Engine = e
		c.KVTransferTime = b.transferTime()
		port := 0
		if orpcPort > 0 {
			port = orpcPort + i
		}
		c.Listen = net.JoinHostPort(host, strconv.Itoa(port))
		c.StateDir = replicaStateDir(base.StateDir, i)
		if n > 1 {
			if c.Node != "" {
				c.Node = fmt.Sprintf("%s-%d", base.Node, i)
			}
			if advHost != "" {
				c.Advertise = net.JoinHostPort(advHost, strconv.Itoa(port))
			}
			c.Logger = base.Logger.With("replica", i)
		}
		if ws[i], err = worker.New(c); err != nil {
			if n > 1 {
				err = fmt.Errorf("replica %d: %w", i, err)
			}
			return nil, nil, err
		}
	}
	doneCh := make(chan struct{})
	fatalCh := make(chan error, n)
	results := make(chan error, n)
	run := func(w *worker.Worker) {
		err := w.Run(ctx)
		if err != nil && ctx.Err() == nil {
			log.Error("cluster membership failed", "err", err)
			fatalCh <- err
		}
		results <- err
	}
	go func() {
		defer close(doneCh)
		for _, w := range ws {
			go run(w)
		}
		for range n {
			<-results
		}
	}()
	return doneCh, fatalCh, nil
}

// replicaStateDir is the state directory of sim replica i: dir itself for replica 0 (where
// a single engine keeps its identity), dir/replica-i for the others.
func replicaStateDir(dir string, i int) string {
	if i == 0 || dir == "" {
		return dir
	}
	return filepath.Join(dir, "replica-"+strconv.Itoa(i))
}
