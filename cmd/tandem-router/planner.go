package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"tandem/k8s/connector"
	"tandem/planner"
	"tandem/planner/local"
	"tandem/router/live"
	"tandem/sim"
	"tandem/sla"
)

// plannerFlags are the SLA planner's flags (docs/planner.md).
type plannerFlags struct {
	on            *bool
	connector     *string
	engine        *string
	timing        *string
	disaggregated *bool
	goal          *float64
	interval      *time.Duration
	loadInterval  *time.Duration
	predictor     *string
	startup       *time.Duration
	cooldown      *time.Duration
	minPool       *int
	maxPool       *int
	maxTotal      *int
	engineDrain   *time.Duration
	dir           *string
	model         *string
	k8sCluster    *string
}

func addPlannerFlags(fs *flag.FlagSet) *plannerFlags {
	return &plannerFlags{
		on:            fs.Bool("planner", false, "run the SLA planner: size the engine pools to --sla-ttft and --sla-itl, starting and draining engines through --planner-connector"),
		connector:     fs.String("planner-connector", "local", "how the planner starts and stops engines: local (tandem serve processes on this machine, from --planner-engine) or kubernetes (the TandemCluster's pools through their scale subresource, from a pod tandem-operator runs; docs/kubernetes.md)"),
		k8sCluster:    fs.String("planner-k8s-cluster", os.Getenv("TANDEM_K8S_CLUSTER"), "kubernetes connector: the TandemCluster whose pools the planner sizes (default: $TANDEM_K8S_CLUSTER, which tandem-operator sets)"),
		engine:        fs.String("planner-engine", "", "local connector: the engine command without the flags it adds (--port 0, --join, --join-token, --state-dir, --node-name, --role, --drain-timeout), e.g. \"tandem serve --model m.gguf --threads 2\""),
		timing:        fs.String("planner-timing", "gpu", "one engine's performance model: gpu, cpu or a JSON file from tandem profile"),
		disaggregated: fs.Bool("planner-disaggregated", false, "size a prefill and a decode pool (engines --role prefill and decode) instead of one pool of both"),
		goal:          fs.Float64("planner-goal", 0.95, "the fraction of requests that should meet both SLA targets"),
		interval:      fs.Duration("planner-interval", time.Minute, "throughput loop: predict the load and size the pools this often"),
		loadInterval:  fs.Duration("planner-load-interval", 5*time.Second, "load loop: correct the pools from measured TTFT and ITL this often"),
		predictor:     fs.String("planner-predictor", "kalman", "load predictor: constant, holt or kalman"),
		startup:       fs.Duration("planner-startup", 10*time.Second, "how long a new engine takes to serve, until one is measured: replicas are asked for this much earlier"),
		cooldown:      fs.Duration("planner-down-cooldown", 0, "a pool that grew does not shrink for this long (0: one --planner-interval)"),
		minPool:       fs.Int("planner-min", 1, "fewest engines in each pool"),
		maxPool:       fs.Int("planner-max", 8, "most engines in each pool"),
		maxTotal:      fs.Int("planner-max-total", 0, "most engines over all pools (0: no limit beyond --planner-max)"),
		engineDrain:   fs.Duration("planner-engine-drain-timeout", 30*time.Second, "a removed engine's --drain-timeout: its running requests finish within it, or migrate"),
		dir:           fs.String("planner-state-dir", "", "local connector: the engines' state directories and logs (default: STATE-DIR/planner)"),
		model:         fs.String("planner-model", "", "the model whose requests the planner sizes for (default: every request)"),
	}
}

// config checks the flags and returns the planner's configuration.
func (f *plannerFlags) config(targets sla.Targets, minRemote int) (planner.Config, error) {
	switch *f.connector {
	case "local":
	case "kubernetes":
		if *f.k8sCluster == "" {
			return planner.Config{}, errors.New("--planner-connector kubernetes needs --planner-k8s-cluster (or $TANDEM_K8S_CLUSTER): the TandemCluster whose pools it sizes")
		}
	default:
		return planner.Config{}, fmt.Errorf("--planner-connector %q: want local or kubernetes", *f.connector)
	}
	if *f.connector == "local" && strings.TrimSpace(*f.engine) == "" {
		return planner.Config{}, errors.New("--planner needs --planner-engine, the command that starts an engine (e.g. \"tandem serve --model m.gguf\")")
	}
	if *f.minPool < 1 || *f.maxPool < *f.minPool {
		return planner.Config{}, fmt.Errorf("--planner-min %d, --planner-max %d: want 1 ≤ min ≤ max", *f.minPool, *f.maxPool)
	}
	if *f.engineDrain <= 0 {
		return planner.Config{}, fmt.Errorf("--planner-engine-drain-timeout %v: want a positive duration", *f.engineDrain)
	}
	timing, err := readTiming(*f.timing)
	if err != nil {
		return planner.Config{}, fmt.Errorf("--planner-timing: %w", err)
	}
	cfg := planner.Config{
		SLA: targets, Goal: *f.goal, Disaggregated: *f.disaggregated, Perf: timing, MinRemoteTokens: minRemote,
		Interval: *f.interval, LoadInterval: *f.loadInterval, Predictor: *f.predictor, MaxTotal: *f.maxTotal,
		Startup: *f.startup, DownCooldown: *f.cooldown,
	}
	for i := range cfg.Bounds {
		cfg.Bounds[i] = planner.Bounds{Min: *f.minPool, Max: *f.maxPool}
	}
	if err := cfg.Validate(); err != nil {
		return planner.Config{}, fmt.Errorf("--planner: %w", err)
	}
	return cfg, nil
}

func readTiming(name string) (sim.Timing, error) {
	switch name {
	case "", "gpu":
		return sim.GPUTiming(), nil
	case "cpu":
		return sim.CPUTiming(), nil
	}
	fh, err := os.Open(name)
	if err != nil {
		return sim.Timing{}, err
	}
	defer fh.Close()
	return sim.ReadTiming(fh)
}

// start runs the planner with the local connector until ctx ends. The returned stop
// drains the connector's engines (each finishes or migrates its requests) and waits for
// them to exit: call it before the router shuts down, so that it still routes them.
func (f *plannerFlags) start(ctx context.Context, cfg planner.Config, srv *live.Server, stateDir string, out io.Writer, log *slog.Logger) (stop func(), err error) {
	if *f.connector == "kubernetes" {
		return f.startKubernetes(ctx, cfg, srv, log)
	}
	dir := *f.dir
	if dir == "" {
		dir = filepath.Join(stateDir, "planner")
	}
	engines, cancelEngines := context.WithCancel(context.Background())
	conn, err := local.New(engines, local.Config{
		Command: strings.Fields(*f.engine), Join: srv.ORPCAddr, Token: srv.Token.String(), StateDir: dir,
		DrainTimeout: *f.engineDrain, Out: out, Logger: log, SysProcAttr: childProcAttr(), Count: srv.Router.CountLocalEngine,
	})
	if err != nil {
		cancelEngines()
		return nil, fmt.Errorf("--planner-engine: %w", err)
	}
	loop, cancelLoop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Router.RunPlanner(loop, live.PlannerConfig{Planner: cfg, Connector: conn, Model: *f.model}); err != nil {
			log.Error("planner: stopped", "err", err)
		}
	}()
	return func() {
		cancelLoop()
		<-done
		log.Info("planner: draining its engines")
		cancelEngines()
		conn.Wait()
	}, nil
}

// startKubernetes runs the planner with the Kubernetes connector, from the pod's service
// account, until ctx ends. Stopping leaves the pools as they are: their pods are the
// operator's, not the router's.
func (f *plannerFlags) startKubernetes(ctx context.Context, cfg planner.Config, srv *live.Server, log *slog.Logger) (stop func(), err error) {
	kc, err := connector.InCluster(*f.k8sCluster)
	if err != nil {
		return nil, fmt.Errorf("--planner-connector kubernetes: %w", err)
	}
	c, err := connector.New(kc)
	if err != nil {
		return nil, fmt.Errorf("--planner-connector kubernetes: %w", err)
	}
	conn := connector.ForPlanner(c, log, srv.Router.CountConnectorReadError)
	loop, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Router.RunPlanner(loop, live.PlannerConfig{Planner: cfg, Connector: conn, Model: *f.model}); err != nil {
			log.Error("planner: stopped", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}
