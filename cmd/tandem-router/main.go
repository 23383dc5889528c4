// Command tandem-router turns several tandem engines into one service: engines dial it
// (tandem serve --join HOST:ORPC_PORT --join-token T), and it serves the OpenAI API, routing
// each request to the worker that holds its prefix unless that worker is too busy.
// It is pure Go (CGO_ENABLED=0) and needs no model files.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/httpserve"
	"tandem/internal/statefile"
	"tandem/internal/version"
	"tandem/metrics"
	"tandem/planner"
	"tandem/router"
	"tandem/router/live"
	"tandem/sla"
	"tandem/web"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "tandem-router:", err)
		}
		os.Exit(2)
	}
}

func run(args []string, stderr io.Writer) error {
	def := router.DefaultConfig()
	fs := flag.NewFlagSet("tandem-router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem-router [--host H] [--port P] [--orpc-port P] [--state-dir DIR] [--routing MODE] [flags]")
		fmt.Fprintln(stderr, "\nServes the OpenAI API in front of the engines that join it (tandem serve --join HOST:ORPC_PORT --join-token T).")
		fs.PrintDefaults()
	}
	showVersion := fs.Bool("version", false, "print the build's version and exit")
	host := fs.String("host", "127.0.0.1", "address to listen on (HTTP and ORPC)")
	port := fs.Int("port", 8000, "HTTP port for the OpenAI API (0 picks a free one)")
	orpcPort := fs.Int("orpc-port", 7001, "ORPC (QUIC/UDP) port engines connect to (0 picks a free one)")
	stateDir := fs.String("state-dir", "", "directory of the cluster CA and join token, created on first start, one per process (default: $XDG_STATE_HOME/tandem/router-PORT; ~/.local/state without XDG_STATE_HOME)")
	joinToken := fs.String("join-token", "", "join token engines must present, id.secret (default: the stored one, or a new one)")
	routing := fs.String("routing", string(router.ModeKV), "routing mode: kv, round-robin, random or least-loaded")
	overlap := fs.Float64("overlap-weight", def.OverlapWeight, "cost = overlap-weight × prefill blocks + decode blocks")
	temp := fs.Float64("temperature", def.Temperature, "softmax temperature over normalised costs (0: cheapest worker)")
	hostWeight := fs.Float64("host-weight", def.HostWeight, "fraction of a block's prefill saved by a host-tier copy, until the worker reports its measured load cost")
	diskWeight := fs.Float64("disk-weight", def.DiskWeight, "fraction of a block's prefill saved by a disk-tier copy, until the worker reports its measured load cost")
	remoteWeight := fs.Float64("remote-weight", def.RemoteWeight, "fraction of a block's prefill saved by a shared-directory copy, until the worker reports its measured load cost")
	peerPulls := fs.Bool("peer-pulls", def.PeerPulls, "tell the chosen worker to pull the prompt's prefix from the worker that holds it when pulling is cheaper than computing (docs/kv-tiers.md)")
	peerWeight := fs.Float64("peer-weight", def.PeerWeight, "fraction of a block's prefill saved by pulling it from a peer, until the worker reports its measured pull cost")
	peerMin := fs.Int("peer-min-blocks", def.PeerMinBlocks, "the fewest blocks worth a peer pull")
	busyKV := fs.Float64("busy-kv-usage", def.BusyKVUsage, "a worker at or above this predicted KV usage is busy (0 disables)")
	busyWaiting := fs.Int("busy-waiting", def.BusyWaiting, "a worker with this many predicted waiting requests is busy (0 disables)")
	affinity := fs.Duration("session-ttl", def.AffinityTTL, "how long a session (X-Session-Id or user) stays on its worker after its last request (0 disables)")
	queueTimeout := fs.Duration("queue-timeout", 5*time.Second, "how long a request waits when every worker is busy (then 429) or none is healthy (then 503)")
	maxQueue := fs.Int("max-queue", 1024, "most requests waiting for a worker; past it 429 at once")
	maxMigrations := fs.Int("max-migrations", live.DefaultMaxMigrations, "most times one request moves to another worker when its worker fails mid-stream (0: never)")
	heartbeat := fs.Duration("heartbeat", 250*time.Millisecond, "heartbeat interval asked of workers")
	hbTimeout := fs.Duration("heartbeat-timeout", 0, "a worker whose load reports stop this long is declared dead: removed, and its requests retried or migrated elsewhere (0: 8 heartbeat intervals, at least 2s)")
	runtimeLora := fs.Bool("allow-runtime-lora", false, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter: the router loads an adapter (a path on the workers' machines) on a worker, and again where none serves it")
	apiKey := fs.String("api-key", "", "require this key as a Bearer token on the API (/v1, /tokenize, /detokenize) and on /metrics (not on /health)")
	publicMetrics := fs.Bool("public-metrics", false, "with --api-key: serve /metrics without the key")
	slaTargets := sla.AddFlags(fs)
	bodyTimeout := fs.Duration("body-timeout", httpserve.DefaultBodyReadTimeout, "a request body must arrive within this, plus 1 s per --min-body-rate bytes (negative: no limit)")
	minBodyRate := fs.Int64("min-body-rate", httpserve.DefaultMinBodyRate, "the slowest a request body may arrive, in bytes per second, after --body-timeout")
	name := fs.String("name", "tandem-router", "this router's name in the cluster")
	drain := fs.Duration("drain-timeout", 30*time.Second, "on SIGTERM, how long running requests may take to finish")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	responseTTL := fs.Duration("response-ttl", 24*time.Hour, "how long the Responses API keeps a stored response, in --state-dir (0: until deleted)")
	allowedOrigins := fs.String("allowed-origins", "", "comma-separated origins allowed to call the API from a browser (CORS; \"*\": any; default none)")
	metricsPrefix := fs.String("metrics-prefix", "tandem", "also serve every tandem_router: metric under this prefix: "+strings.Join(metrics.MetricsPrefixes, ", "))
	requireKV := fs.Bool("require-kv-events", false, "kv routing: send no requests to a worker whose KV events are missing (load but no events for a while, or a failed snapshot) instead of counting its cache as unknown")
	dis := router.DefaultDisaggConfig()
	fs.IntVar(&dis.MinRemoteTokens, "disagg-min-tokens", dis.MinRemoteTokens, "with prefill workers: prefill on one only when the decode worker lacks at least this many prompt tokens")
	fs.BoolVar(&dis.Strict, "disagg-strict", dis.Strict, "fail a request whose remote prefill or KV transfer fails, instead of prefilling on the decode worker")
	fs.DurationVar(&dis.Hold, "kv-hold", dis.Hold, "how long a prefill worker keeps a prompt's KV blocks for the decode worker's pull")
	fs.DurationVar(&dis.TransferTimeout, "kv-transfer-timeout", dis.TransferTimeout, "deadline of a KV pull, which overlaps the prefill it pulls from; past it the transfer is abandoned and the decode worker computes")
	streamInterval := fs.Int("stream-interval", 1, "stream tokens this many at a time: workers send them so and the API writes them so, the first token at once (as vLLM's and SGLang's --stream-interval): fewer packets and writes per token for a little latency; every token's event is still sent")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the router's whole run to this file (go tool pprof), until it exits")
	plan := addPlannerFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *showVersion {
		fmt.Fprintln(stderr, "tandem-router", version.String())
		return nil
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer stop()
	}
	if *stateDir == "" {
		if *port == 0 {
			return errors.New("--port 0 needs --state-dir: the default state directory is named after the port")
		}
		dir, err := statefile.DefaultDir("router-" + strconv.Itoa(*port))
		if err != nil {
			return err
		}
		*stateDir = dir
	}
	// One process per state directory (several routers of one cluster each get a copy).
	release, err := statefile.Lock(*stateDir)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	defer release()
	if *minBodyRate <= 0 {
		return fmt.Errorf("--min-body-rate %d: want a positive number of bytes per second", *minBodyRate)
	}
	if err := slaTargets.Check(); err != nil {
		return err
	}
	if *streamInterval < 1 || *streamInterval > live.MaxStreamInterval {
		return fmt.Errorf("--stream-interval %d: want 1 to %d tokens", *streamInterval, live.MaxStreamInterval)
	}
	if *heartbeat <= 0 {
		return fmt.Errorf("--heartbeat %v: want a positive interval", *heartbeat)
	}
	if *hbTimeout != 0 && *hbTimeout < 2**heartbeat {
		return fmt.Errorf("--heartbeat-timeout %v is under two heartbeat intervals (%v): workers would be declared dead between two reports", *hbTimeout, *heartbeat)
	}
	var planCfg planner.Config
	if *plan.on {
		if planCfg, err = plan.config(*slaTargets, dis.MinRemoteTokens); err != nil {
			return err
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	mode, err := router.ParseMode(*routing)
	if err != nil {
		return fmt.Errorf("--routing: %w", err)
	}
	pol := def
	pol.Mode, pol.OverlapWeight, pol.Temperature, pol.HostWeight = mode, *overlap, *temp, *hostWeight
	pol.DiskWeight, pol.RemoteWeight, pol.PeerPulls, pol.PeerWeight, pol.PeerMinBlocks = *diskWeight, *remoteWeight, *peerPulls, *peerWeight, *peerMin
	pol.BusyKVUsage, pol.BusyWaiting, pol.AffinityTTL = *busyKV, *busyWaiting, *affinity
	pol.RequireKVEvents = *requireKV
	planCfg.PrefillRouting = pol.WeighsPrefill() // the planner's TTFT model follows the policy (docs/planner.md)

	var dash *web.Dashboard
	if !slices.Contains(metrics.MetricsPrefixes, *metricsPrefix) {
		return fmt.Errorf("--metrics-prefix %q: want one of %s", *metricsPrefix, strings.Join(metrics.MetricsPrefixes, ", "))
	}
	if *responseTTL < 0 {
		return fmt.Errorf("--response-ttl %v: want a duration of 0 or more", *responseTTL)
	}
	var origins []string
	for _, o := range strings.Split(*allowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	srv, err := live.StartServer(live.ServerConfig{
		Host: *host, Port: *port, ORPCPort: *orpcPort, StateDir: *stateDir, JoinToken: *joinToken,
		Router: live.Config{
			Policy: pol, Name: *name, Heartbeat: *heartbeat, HeartbeatTimeout: *hbTimeout,
			QueueTimeout: *queueTimeout, MaxQueue: *maxQueue, APIKey: *apiKey, MaxMigrations: noneIfZero(*maxMigrations),
			Disagg: dis, RuntimeLoRA: *runtimeLora, StreamInterval: *streamInterval,
		},
		DrainTimeout:    *drain,
		BodyReadTimeout: *bodyTimeout,
		MinBodyRate:     *minBodyRate,
		PublicMetrics:   *publicMetrics,
		ResponseTTL:     *responseTTL,
		AllowedOrigins:  origins,
		MetricsPrefix:   *metricsPrefix,
		Logger:          log,
		WrapHandler: func(api http.Handler, reg *prometheus.Registry) (http.Handler, error) {
			var err error
			dash, err = web.New(web.Config{Kind: web.Router, Name: *name, Source: reg, Registerer: reg, APIKey: *apiKey, SLA: *slaTargets, Logger: log})
			if err != nil {
				return nil, err
			}
			return dash.Wrap(api), nil // the dashboard at /dashboard, the API elsewhere
		},
	})
	if err != nil {
		return err
	}
	dash.StopWhen(srv.HTTP.Draining) // open dashboards must not hold the drain
	created := ""
	if srv.CACreated {
		created = " (new cluster CA)"
	}
	tokNote := ""
	if srv.TokCreated {
		tokNote = " (generated; stored in " + *stateDir + ")"
	}
	fmt.Fprintf(stderr, "tandem-router: %s\n  version: %s\n  state: %s\n  ORPC for engines: %s%s\n  routing: %s\n  join token: %s%s\n  engines join with: tandem serve --join %s --join-token %s\n",
		srv.URL(), version.String(), *stateDir, srv.ORPCAddr, created, mode, srv.Token, tokNote, srv.ORPCAddr, srv.Token)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopPlanner := func() {}
	if *plan.on {
		if stopPlanner, err = plan.start(ctx, planCfg, srv, *stateDir, stderr, log); err != nil {
			srv.Shutdown(context.Background())
			return err
		}
	}
	<-ctx.Done()
	stopPlanner() // its engines drain while the router still routes their requests
	log.Info("shutting down: finishing running requests", "deadline", *drain)
	dctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// noneIfZero maps a flag's 0 ("never") to LiveConfig's negative, whose 0 means the default.
func noneIfZero(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// startCPUProfile profiles the process into path until the returned function is called:
// where the router's CPU goes under a live load (docs/routing.md, "The front end").
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
