package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/gguf"
	"tandem/httpserve"
	"tandem/kvcache"
	"tandem/metrics"
	"tandem/modelgen"
	"tandem/openai"
	"tandem/orpc"
	"tandem/worker"
)

func serveCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem serve", flag.ContinueOnError)
	modelPath := fs.String("model", "", "GGUF file or Hugging Face model directory (default: the built-in demo model)")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8080, "port to listen on (0 picks a free one)")
	servedName := fs.String("served-model-name", "", "model name in the API (default: the model's name)")
	kvMem := fs.String("kv-cache-memory", "", "KV cache budget, e.g. 4GiB (default: 40% of available memory, at most what --max-seqs full contexts need)")
	maxModelLen := fs.Int("max-model-len", 0, "context length (default: the model's)")
	maxBatch := fs.Int("max-batch-tokens", engine.DefaultMaxBatchTokens, "token budget of one engine step")
	maxSeqs := fs.Int("max-seqs", engine.DefaultMaxSeqs, "most sequences running at once")
	maxQueue := fs.Int("max-queue", engine.DefaultMaxQueue, "most requests waiting; past it 429")
	blockSize := fs.Int("block-size", engine.DefaultBlockSize, "KV cache block size in tokens")
	kvt := addKVTypeFlag(fs)
	threads := fs.Int("threads", 0, "worker threads (0: all cores)")
	apiKey := fs.String("api-key", "", "require this key as a Bearer token on the API (/v1, /tokenize, /detokenize) and on /metrics (not on /health)")
	publicMetrics := fs.Bool("public-metrics", false, "with --api-key: serve /metrics without the key")
	bodyTimeout := fs.Duration("body-timeout", httpserve.DefaultBodyReadTimeout, "a request body must arrive within this, plus 1 s per --min-body-rate bytes (negative: no limit)")
	minBodyRate := fs.Int64("min-body-rate", httpserve.DefaultMinBodyRate, "the slowest a request body may arrive, in bytes per second, after --body-timeout")
	tlsCert := fs.String("tls-cert", "", "TLS certificate file: serve HTTPS, HTTP/2 and HTTP/3")
	tlsKey := fs.String("tls-key", "", "TLS key file")
	drain := fs.Duration("drain-timeout", 30*time.Second, "on SIGTERM, how long running requests may take to finish")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var joins stringList
	fs.Var(&joins, "join", "a tandem-router's ORPC address HOST:PORT to register with (repeatable)")
	joinToken := fs.String("join-token", "", "the cluster's join token (printed by tandem-router)")
	orpcPort := fs.Int("orpc-port", 0, "ORPC (QUIC/UDP) port routers call this engine on, with --join (0 picks a free one)")
	stateDir := fs.String("state-dir", "tandem-state", "where the cluster identity earned with --join-token is kept")
	role := fs.String("role", cluster.RoleBoth, "cluster role: both, prefill or decode")
	nodeName := fs.String("node-name", "", "this engine's name in the cluster (default: host name and ORPC port)")
	kvHold := fs.Duration("kv-hold", worker.DefaultKVHold, "prefill role: the longest prefilled KV blocks wait for the decode worker's pull (the router may ask for less)")
	kvSendRate := fs.String("kv-send-rate", "", "cap on the bandwidth KV pulls are served at, per pull, e.g. 1GB (bytes per second; default unlimited)")
	advertise := fs.String("advertise", "", "ORPC address routers dial (default: --host and the ORPC port; an unspecified host means the address used to reach the router)")
	toolParser := fs.String("tool-call-parser", "auto", "the format the model writes tool calls in: "+strings.Join(openai.ToolCallParsers, ", ")+" (auto: chosen from the chat template)")
	reasoningParser := fs.String("reasoning-parser", "auto", "split the reasoning off the answer: "+strings.Join(openai.ReasoningParsers, ", ")+" (auto: when the chat template writes <think>)")
	bk := addBackendFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem serve [--model PATH] [--host H] [--port P] [flags]")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args, stderr); err != nil {
		return err
	} else if len(pos) > 0 {
		if *modelPath != "" || len(pos) > 1 {
			return fmt.Errorf("unexpected arguments %q", pos)
		}
		*modelPath = pos[0] // `tandem serve MODEL`, as with vllm serve
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if (*tlsCert == "") != (*tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if *minBodyRate <= 0 {
		return fmt.Errorf("--min-body-rate %d: want a positive number of bytes per second", *minBodyRate)
	}
	if *port < 0 || *port > 65535 {
		return fmt.Errorf("--port %d out of range", *port)
	}
	if *orpcPort < 0 || *orpcPort > 65535 {
		return fmt.Errorf("--orpc-port %d out of range", *orpcPort)
	}
	switch *role {
	case cluster.RoleBoth, cluster.RolePrefill, cluster.RoleDecode:
	default:
		return fmt.Errorf("--role %q: want both, prefill or decode", *role)
	}
	if !slices.Contains(openai.ToolCallParsers, *toolParser) {
		return fmt.Errorf("--tool-call-parser %q: want one of %s", *toolParser, strings.Join(openai.ToolCallParsers, ", "))
	}
	if !slices.Contains(openai.ReasoningParsers, *reasoningParser) {
		return fmt.Errorf("--reasoning-parser %q: want one of %s", *reasoningParser, strings.Join(openai.ReasoningParsers, ", "))
	}
	var sendRate int64
	if *kvSendRate != "" {
		var err error
		if sendRate, err = parseBytes(*kvSendRate); err != nil {
			return fmt.Errorf("--kv-send-rate: %w", err)
		}
	}
	if len(joins) > 0 && *joinToken == "" {
		if _, err := os.Stat(filepath.Join(*stateDir, orpc.NodeCertFile)); err != nil {
			return errors.New("--join needs --join-token (or an identity in --state-dir from an earlier join)")
		}
	}

	timing, err := bk.check(joins, *advertise, *orpcPort)
	if err != nil {
		return err
	}
	kvType, err := kvt.parse()
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	t0 := time.Now()
	be, m, closeModel, err := openModel(*modelPath, bk.threads(*threads))
	if err != nil {
		return err
	}
	defer closeModel()
	if !bk.sim() { // the sim backend never reads the weights
		m.Prefault(be, progressPrinter(stderr, "loading weights"))
	}
	loadTime := time.Since(t0)

	name := *servedName
	if name == "" {
		name = m.Config.Name
		if *modelPath == "" || name == "" {
			name = modelName(*modelPath, m.Config.Name)
		}
	}
	if *maxModelLen > 0 {
		m.Config.ContextLen = *maxModelLen
	}
	m.KVType = kvType
	perToken := m.KVBytesPerToken()
	budget, err := kvBudget(*kvMem, perToken, *maxSeqs*m.Config.ContextLen)
	if err != nil {
		return err
	}
	blocks := int(budget / (perToken * int64(*blockSize)))
	if blocks*(*blockSize) < m.Config.ContextLen {
		log.Warn("KV cache smaller than the context; lowering the context length", "kv_tokens", blocks**blockSize, "context", m.Config.ContextLen)
		m.Config.ContextLen = blocks * *blockSize
	}
	if blocks < 1 || m.Config.ContextLen < 2 {
		return fmt.Errorf("a KV budget of %d bytes holds no useful context (%d bytes per token)", budget, perToken)
	}
	reg := metrics.NewRegistry()
	engines, err := bk.newEngines(m, be, timing, engine.Config{
		MaxBatchTokens: *maxBatch,
		MaxSeqs:        *maxSeqs,
		MaxQueue:       *maxQueue,
		BlockSize:      *blockSize,
		KVBlocks:       blocks,
		Salt:           kvcache.Salt(name, "", ""),
		Metrics:        metrics.NewEngine(reg, name),
		Logger:         log,
	})
	if err != nil {
		return err
	}
	eng := engines[0]
	metrics.RegisterKVState(reg, name, func() float64 { return float64(eng.Pool().Stats().Used) },
		func() float64 { h, _ := eng.HeldStats(); return float64(h) },
		func() float64 { _, x := eng.HeldStats(); return float64(x) })
	engineCtx, stopEngine := context.WithCancel(context.Background())
	engineDone := make(chan error, len(engines))
	for _, e := range engines {
		go func() { engineDone <- e.Run(engineCtx) }()
	}

	api := openai.NewHandler([]*openai.Model{{
		ID:         name,
		Tokenizer:  m.Tokenizer,
		ContextLen: m.Config.ContextLen,
		Created:    time.Now().Unix(),
		OwnedBy:    "tandem",
		Backend:    eng,

		ToolCallParser:  *toolParser,
		ReasoningParser: *reasoningParser,
	}}, openai.Options{APIKey: *apiKey, Logger: log, Metrics: metrics.NewHTTP(reg, "tandem")})
	metricsToken := *apiKey
	if *publicMetrics {
		metricsToken = ""
	}
	var ready atomic.Bool
	srv, err := httpserve.New(httpserve.Config{
		Addr:            net.JoinHostPort(*host, strconv.Itoa(*port)),
		Handler:         api,
		TLSCert:         *tlsCert,
		TLSKey:          *tlsKey,
		Ready:           ready.Load,
		Metrics:         metrics.Handler(reg),
		MetricsToken:    metricsToken,
		DrainTimeout:    *drain,
		BodyReadTimeout: *bodyTimeout,
		MinBodyRate:     *minBodyRate,
		Logger:          log,
	})
	if err != nil {
		stopEngine()
		return err
	}
	if err := srv.Start(); err != nil {
		stopEngine()
		return err
	}
	ready.Store(true)
	var workerDone <-chan struct{}
	var workerFatal <-chan error
	if len(joins) > 0 {
		tokFormat, tokFiles, err := tokenizerCard(*modelPath)
		if err != nil {
			srv.Shutdown(context.Background())
			stopEngine()
			return err
		}
		workerCtx, stopWorker := context.WithCancel(ctx)
		defer stopWorker()
		workerDone, workerFatal, err = bk.startWorkers(workerCtx, engines, worker.Config{
			Card: cluster.ModelCard{
				Model: name, Role: *role, HashVersion: kvcache.HashVersion, BlockSize: *blockSize,
				Salt: kvcache.Salt(name, "", ""), KVBlocks: blocks, ContextLen: m.Config.ContextLen,
				TokenizerFormat: tokFormat, TokenizerFiles: tokFiles, ChatTemplate: m.ChatTemplate,
				GrammarFormat: cluster.GrammarGBNF, ToolCallParser: *toolParser, ReasoningParser: *reasoningParser,
			},
			Node:       *nodeName,
			Routers:    joins,
			Token:      *joinToken,
			StateDir:   *stateDir,
			Advertise:  *advertise,
			KVMetrics:  metrics.NewKVTransfer(reg, name),
			KVHold:     *kvHold,
			KVSendRate: float64(sendRate),
			Logger:     log,
		}, *host, *orpcPort, log)
		if err != nil {
			srv.Shutdown(context.Background())
			stopEngine()
			return err
		}
	}
	fmt.Fprintf(stderr, "tandem serve: %s\n  model: %s (%s, %s, %d layers) from %s\n  KV cache: %d tokens (%d blocks of %d, %s %v), context %d\n  load time: %v, backend %s\n",
		srv.URL(), name, m.Config.Arch, m.FileType, m.Config.Layers, sourceName(*modelPath),
		blocks**blockSize, blocks, *blockSize, formatBytes(int64(blocks)*int64(*blockSize)*perToken), kvType, m.Config.ContextLen,
		loadTime.Round(time.Millisecond), be.Name())
	if bk.sim() {
		fmt.Fprintf(stderr, "  sim backend: %d replica(s), modelled compute %+v\n", len(engines), timing)
	}

	var fatal error
	select {
	case <-ctx.Done():
	case err := <-workerFatal:
		// A member that cannot join (a wrong token, a refused card) should not
		// linger outside its cluster looking healthy.
		fatal = fmt.Errorf("joining the cluster: %w", err)
	}
	log.Info("shutting down: finishing running requests", "deadline", *drain)
	dctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	err = srv.Shutdown(dctx)
	if workerDone != nil {
		<-workerDone
	}
	stopEngine()
	for range engines {
		<-engineDone
	}
	if fatal != nil {
		return fatal
	}
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("drain deadline passed; remaining requests were cut")
		return nil
	}
	return err
}

// tokenizerCard returns the tokenizer of the model at path (the demo model when path is
// empty) as a cluster model card carries it.
func tokenizerCard(path string) (string, []cluster.File, error) {
	if path != "" {
		return worker.TokenizerFor(path)
	}
	data, err := modelgen.DemoGGUF()
	if err != nil {
		return "", nil, fmt.Errorf("demo model: %w", err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return "", nil, fmt.Errorf("demo model: %w", err)
	}
	return worker.TokenizerGGUF(f)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }
