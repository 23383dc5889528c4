// Command tandem-operator runs Tandem clusters on Kubernetes: it reconciles
// TandemClusters into Secrets, routers and engine pools placed by gang and topology.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"tandem/internal/version"
	"tandem/k8s/operator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "tandem-operator:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem-operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "print the build's version and exit")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in the cluster, else $KUBECONFIG or ~/.kube/config)")
	metricsAddr := fs.String("metrics-addr", ":8080", "address of /metrics (0: off)")
	healthAddr := fs.String("health-addr", ":8081", "address of /healthz and /readyz (0: off)")
	leaderElect := fs.Bool("leader-elect", false, "elect one active operator among replicas (a Lease in --leader-election-namespace)")
	leaderNS := fs.String("leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	namespace := fs.String("namespace", "", "watch only this namespace (default: all)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *showVersion {
		fmt.Fprintln(stderr, "tandem-operator", version.String())
		return nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))

	if *kubeconfig != "" {
		os.Setenv("KUBECONFIG", *kubeconfig)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	scheme, err := operator.NewScheme()
	if err != nil {
		return err
	}
	opts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *healthAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "tandem-operator.tandem.dev",
		LeaderElectionNamespace: *leaderNS,
	}
	if *namespace != "" {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{*namespace: {}}
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return fmt.Errorf("start the manager: %w", err)
	}
	m, err := operator.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return err
	}
	if err := operator.Setup(mgr, log, m); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	log.Info("tandem-operator starting", "version", version.String(), "server", cfg.Host, "leader-elect", *leaderElect)
	return mgr.Start(ctx)
}
