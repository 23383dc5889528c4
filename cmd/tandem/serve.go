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
	"syscall"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/httpserve"
	"tandem/internal/statefile"
	"tandem/internal/version"
	"tandem/kvcache"
	"tandem/kvtier"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/node"
	"tandem/openai"
	"tandem/orpc"
	"tandem/pipeline"
	"tandem/respstore"
	"tandem/sim"
	"tandem/sla"
	"tandem/worker"
)

func serveCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem serve", flag.ContinueOnError)
	modelPath := fs.String("model", "", "GGUF file or Hugging Face model directory (default: the built-in demo model)")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8080, "port to listen on (0 picks a free one)")
	servedName := fs.String("served-model-name", "", "model id in the API (default: the model file's or directory's name, without .gguf)")
	kvMem := fs.String("kv-cache-memory", "", "KV cache budget, e.g. 4GiB (default: 40% of available memory, at most what --max-seqs full contexts need)")
	maxModelLen := fs.Int("max-model-len", 0, "context length (default: the model's)")
	maxBatch := fs.Int("max-batch-tokens", engine.DefaultMaxBatchTokens, "token budget of one engine step")
	maxSeqs := fs.Int("max-seqs", engine.DefaultMaxSeqs, "most sequences running at once")
	maxQueue := fs.Int("max-queue", engine.DefaultMaxQueue, "most requests waiting; past it 429")
	blockSize := fs.Int("block-size", engine.DefaultBlockSize, "KV cache block size in tokens")
	itlFlag := fs.String("itl-target", defaultITLTarget, "inter-token latency target: a step that carries the streams' next tokens reads only the prompt tokens that keep its predicted time within it; a duration (100ms), a multiple of the time the step's decodes alone take (2.5x), or 0 (none: prompts are read --max-batch-tokens at a time)")
	stepProfile := fs.String("step-profile", "", "with --itl-target: the forward step's cost, a JSON file from tandem profile (default: measured at start, in a few seconds; with --backend sim, its --sim-profile), corrected live")
	kvt := addKVTypeFlag(fs)
	kvHostMem := fs.String("kv-host-memory", "", "KV host-memory tier: blocks leaving the KV cache are kept in this much host memory and loaded back when a prompt needs them, e.g. 64GiB (default none; docs/kv-tiers.md)")
	kvDiskDir := fs.String("kv-disk-dir", "", "KV disk tier: a directory of block files (blocks used twice), kept across restarts; needs --kv-disk-size")
	kvDiskSize := fs.String("kv-disk-size", "", "size of the KV disk tier, e.g. 1TB")
	kvOffload := fs.String("kv-offload", "write-back", "when KV blocks are copied to host memory: write-back (as they are evicted) or write-through (as they are computed)")
	kvSharedDir := fs.String("kv-shared-dir", "", "KV shared tier: a directory every node mounts (a network filesystem); blocks used twice are written there and any node loads them")
	kvDiskUses := fs.Int("kv-disk-min-uses", 2, "frequency filter: a block goes to the disk and shared tiers only once used this many times (1: every block)")
	threads := fs.Int("threads", 0, "worker threads (0: all cores)")
	dev := addDeviceFlag(fs)
	apiKey := fs.String("api-key", "", "require this key as a Bearer token on the API (/v1, /tokenize, /detokenize) and on /metrics (not on /health)")
	publicMetrics := fs.Bool("public-metrics", false, "with --api-key: serve /metrics without the key")
	slaTargets := sla.AddFlags(fs)
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
	stateDir := fs.String("state-dir", "", "where the stored responses and the cluster identity earned with --join-token are kept, one per process (default: $XDG_STATE_HOME/tandem/serve-NAME, NAME the --node-name, else the --port; ~/.local/state without XDG_STATE_HOME; with --port 0 and neither, responses are kept in memory)")
	responseTTL := fs.Duration("response-ttl", 24*time.Hour, "how long the Responses API keeps a stored response (0: until deleted)")
	pooling := fs.String("pooling", "auto", "how /v1/embeddings pools the hidden states: auto (the model's metadata, else last), last or mean")
	allowedOrigins := fs.String("allowed-origins", "", "comma-separated origins allowed to call the API from a browser (CORS; \"*\": any; default none)")
	metricsPrefix := fs.String("metrics-prefix", "tandem", "also serve every tandem: metric under this prefix, for dashboards made for it: "+strings.Join(metrics.MetricsPrefixes, ", "))
	role := fs.String("role", cluster.RoleBoth, "cluster role: both, prefill or decode")
	nodeName := fs.String("node-name", "", "this engine's name in the cluster (default: host name and ORPC port)")
	kvHold := fs.Duration("kv-hold", worker.DefaultKVHold, "prefill role: the longest prefilled KV blocks wait for the decode worker's pull (the router may ask for less)")
	kvEventInterval := fs.Duration("kv-event-interval", worker.DefaultEventInterval, "the least time between two KV event batches sent to a router (a load report, or a sequence's end, sends those waiting at once; 0: every batch as soon as its events come)")
	kvSendRate := fs.String("kv-send-rate", "", "cap on the bandwidth KV pulls are served at, per pull, e.g. 1GB (bytes per second; default unlimited)")
	advertise := fs.String("advertise", "", "ORPC address routers dial (default: --host and the ORPC port; an unspecified host means the address used to reach the router)")
	toolParser := fs.String("tool-call-parser", "auto", "the format the model writes tool calls in: "+strings.Join(openai.ToolCallParsers, ", ")+" (auto: chosen from the chat template)")
	reasoningParser := fs.String("reasoning-parser", "auto", "split the reasoning off the answer: "+strings.Join(openai.ReasoningParsers, ", ")+" (auto: when the chat template writes <think>)")
	var loras stringList
	fs.Var(&loras, "lora", "a LoRA adapter NAME=PATH (a llama.cpp GGUF adapter or a PEFT directory) requests name in the model field (repeatable)")
	maxLoras := fs.Int("max-loras", engine.DefaultMaxAdapters, "LoRA adapters kept in memory at once; the least recently used past it are read again when asked for")
	runtimeLora := fs.Bool("allow-runtime-lora", false, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read paths the client names)")
	specMethod := fs.String("speculative", engine.SpecOff, "speculative decoding: off, ngram (prompt lookup) or draft (--draft-model); the tokens are the same as without")
	draftModel := fs.String("draft-model", "", "a smaller model of the same vocabulary that drafts tokens for speculative decoding (implies --speculative draft)")
	specTokens := fs.Int("num-speculative-tokens", 4, "with --speculative: the most tokens drafted per step")
	specBatch := fs.Int("speculative-max-batch", 8, "with --speculative: draft only while at most this many sequences run")
	bk := addBackendFlags(fs)
	wf := addWeightsFlags(fs)
	var sf stageFlags
	fs.IntVar(&sf.count, "stages", 1, "run one replica of the model across this many processes, a pipeline stage each, which split its layers (docs/pipeline.md)")
	fs.IntVar(&sf.index, "stage", 0, "with --stages: the stage this process runs (0, the head, serves the API, schedules, samples and joins the routers; the others run their layers only)")
	fs.StringVar(&sf.layers, "stage-layers", "", "with --stages: the layers of each stage, e.g. 12,12 (default: as even as possible, the earlier stages taking one more); every stage must be given the same")
	fs.StringVar(&sf.listen, "stage-listen", "", "with --stage 1 or more: the address (host:port) this stage listens on for the stage before it")
	fs.StringVar(&sf.next, "stage-next", "", "with --stages, on all but the last stage: the next stage's --stage-listen address")
	fs.IntVar(&sf.micro, "micro-batches", 0, "with --stages, on the head: the steps kept in flight (default: one a stage, so that every stage has one to run; 1: one at a time)")
	fs.StringVar(&sf.ca, "stage-ca", "", "with --stages: the directory of the replica's CA, shared by its stages (made by the first to start): the links are mutual TLS under it")
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
	if err := slaTargets.Check(); err != nil {
		return err
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
	if *pooling != "auto" && !slices.Contains(llm.Poolings, llm.Pooling(*pooling)) {
		return fmt.Errorf("--pooling %q: want auto, last or mean", *pooling)
	}
	if !slices.Contains(metrics.MetricsPrefixes, *metricsPrefix) {
		return fmt.Errorf("--metrics-prefix %q: want one of %s", *metricsPrefix, strings.Join(metrics.MetricsPrefixes, ", "))
	}
	if *responseTTL < 0 {
		return fmt.Errorf("--response-ttl %v: want a duration of 0 or more", *responseTTL)
	}
	var adapters []node.LoRA
	for _, l := range loras {
		name, path, ok := strings.Cut(l, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("--lora %q: want NAME=PATH", l)
		}
		adapters = append(adapters, node.LoRA{Name: name, Path: path})
	}
	if *maxLoras < 1 {
		return fmt.Errorf("--max-loras %d: want at least 1", *maxLoras)
	}
	if !slices.Contains(engine.SpecMethods, *specMethod) {
		return fmt.Errorf("--speculative %q: want one of %s", *specMethod, strings.Join(engine.SpecMethods, ", "))
	}
	switch {
	case *draftModel != "" && *specMethod == engine.SpecOff:
		*specMethod = engine.SpecDraft
	case *draftModel != "" && *specMethod != engine.SpecDraft:
		return fmt.Errorf("--draft-model drafts for --speculative draft, not %s", *specMethod)
	case *draftModel == "" && *specMethod == engine.SpecDraft:
		return errors.New("--speculative draft needs --draft-model")
	}
	if *specTokens < 1 || *specTokens > 64 {
		return fmt.Errorf("--num-speculative-tokens %d: want 1..64", *specTokens)
	}
	var sendRate int64
	if *kvSendRate != "" {
		var err error
		if sendRate, err = parseBytes(*kvSendRate); err != nil {
			return fmt.Errorf("--kv-send-rate: %w", err)
		}
	}
	tiers, err := tierFlags(*kvHostMem, *kvDiskDir, *kvDiskSize, *kvOffload, *kvSharedDir, *kvDiskUses)
	if err != nil {
		return err
	}
	if len(joins) > 0 && *stateDir == "" && *nodeName == "" && *port == 0 {
		return errors.New("--join with --port 0 and no --node-name needs --state-dir: the default state directory is named after the node or the port")
	}
	if *stateDir == "" && (*nodeName != "" || *port != 0) {
		name := *nodeName
		if name == "" {
			name = strconv.Itoa(*port)
		}
		dir, err := statefile.DefaultDir("serve-" + name)
		if err != nil {
			return err
		}
		*stateDir = dir
	}
	if *stateDir != "" {
		// One process per state directory: two engines in one would take each other's
		// identity and name.
		release, err := statefile.Lock(*stateDir)
		if err != nil {
			return fmt.Errorf("--state-dir: %w", err)
		}
		defer release()
	}
	if len(joins) > 0 && *joinToken == "" {
		if _, err := os.Stat(filepath.Join(*stateDir, orpc.NodeCertFile)); err != nil {
			return errors.New("--join needs --join-token (or an identity in --state-dir from an earlier join)")
		}
	}

	if _, err := bk.check(joins, *advertise, *orpcPort); err != nil {
		return err
	}
	itl, err := parseITLTarget(*itlFlag)
	if err != nil {
		return err
	}
	var stepCost *sim.Timing
	if *stepProfile != "" {
		t, err := loadTiming(*stepProfile)
		if err != nil {
			return fmt.Errorf("--step-profile: %w", err)
		}
		stepCost = &t
	}
	if _, _, err := dev.parse(); err != nil {
		return err
	}
	if bk.sim() && dev.vulkan() {
		return errors.New("--device vulkan runs the forward pass; --backend sim models it instead")
	}
	weights, err := wf.parse(joins, bk.sim())
	if err != nil {
		return err
	}
	kvType, err := kvt.parse()
	if err != nil {
		return err
	}
	stageSpec, err := sf.spec()
	if err != nil {
		return err
	}
	if sf.count > 1 && (itl.abs > 0 || itl.decodes > 0) {
		explicit := false
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "itl-target" })
		if explicit {
			return errors.New("--itl-target with --stages: a pipeline replica has no step profile yet (the quick profile runs the whole model); drop it or give 0")
		}
		// The default target needs that profile too: a replica reads prompts by the token
		// budget alone, as with --itl-target 0.
		log.Info("--stages: no ITL target (the default needs a step profile of the whole model); prompts are read --max-batch-tokens at a time")
		itl = itlTarget{}
	}
	if sf.count > 1 {
		switch {
		case bk.sim():
			return errors.New("--stages runs the model's layers in several processes; --backend sim models a forward pass instead")
		case *bk.replicas > 1:
			return errors.New("--stages makes one replica of several processes; --replicas is for the sim backend")
		case tiers.Enabled():
			return errors.New("--stages: the KV tiers (--kv-host-memory, --kv-disk-dir, --kv-shared-dir) of a pipeline replica are not built (its stages hold the KV); drop them")
		case weights.PackCache != "" || len(weights.From) > 0:
			return errors.New("--stages: a stage holds part of the weights; --pack-cache and --weights-from hold them whole")
		case len(loras) > 0 || *runtimeLora:
			return errors.New("--stages: LoRA adapters on a pipeline replica are not built (its stages hold none); drop --lora and --allow-runtime-lora")
		case *draftModel != "" || *specMethod != engine.SpecOff && *specMethod != "":
			return errors.New("--stages: speculative decoding on a pipeline replica is not built (drop --speculative and --draft-model)")
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	name := *servedName
	if name == "" {
		// As vLLM names a model by its path: the file's or directory's name, not the
		// GGUF's general.name (which many files share: "llama").
		name = modelName(*modelPath, "")
	}
	if sf.index > 0 {
		return serveStage(ctx, stageServe{flags: &sf, spec: stageSpec, modelPath: *modelPath, name: name, blockSize: *blockSize,
			httpAddr: net.JoinHostPort(*host, strconv.Itoa(*port)), dev: dev, threads: bk.threads(*threads)}, stderr, log)
	}
	var headCfg *pipeline.HeadConfig
	if sf.count > 1 {
		id, err := sf.identity(log)
		if err != nil {
			return err
		}
		headCfg = &pipeline.HeadConfig{Next: sf.next, Identity: id, MicroBatches: sf.micro}
	}

	t0 := time.Now()
	be, m, closeModel, err := openModelStage(*modelPath, dev, bk.threads(*threads), log, stageSpec)
	if err != nil {
		return err
	}
	defer closeModel()
	openTime := time.Since(t0) // node.Start prepares the weights (the sim backend never reads them)
	weights.Progress = progressPrinters(stderr)

	var draft *model.Model
	if *draftModel != "" {
		if draft, err = model.Load(*draftModel, be); err != nil {
			return fmt.Errorf("--draft-model: %w", err)
		}
		defer draft.Close() // the engine checks that it has the model's vocabulary
	}

	pool := llm.Pooling(*pooling)
	if pool == "auto" {
		switch p := m.Config.Pooling; p {
		case "last", "mean":
			pool = llm.Pooling(p)
		case "", "none":
			pool = llm.PoolLast
		default:
			log.Warn("the model's metadata asks for a pooling this server lacks; embeddings pool the last token (set --pooling)", "pooling", p)
			pool = llm.PoolLast
		}
	}
	responses := node.Responses{TTL: *responseTTL}
	if *stateDir != "" {
		if err := os.MkdirAll(*stateDir, 0o700); err != nil {
			return fmt.Errorf("--state-dir: %w", err)
		}
		responses.Path = filepath.Join(*stateDir, respstore.FileName)
	}
	var origins []string
	for _, o := range strings.Split(*allowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	m.KVType = kvType
	var budget int64
	if *kvMem != "" {
		if budget, err = parseBytes(*kvMem); err != nil {
			return fmt.Errorf("--kv-cache-memory: %w", err)
		}
	} else {
		ctxLen := m.Config.ContextLen
		if *maxModelLen > 0 {
			ctxLen = *maxModelLen
		}
		seqs := *maxSeqs
		if seqs <= 0 {
			seqs = engine.DefaultMaxSeqs
		}
		budget = deviceKVBudget(be, m.KVBytesPerToken(), seqs*ctxLen) // the device's memory, not the host's
	}
	n, err := node.Start(ctx, node.Config{
		Model: m, Backend: be, ModelPath: *modelPath, Name: name,
		KVBudget: budget, MaxModelLen: *maxModelLen, BlockSize: *blockSize,
		MaxBatchTokens: *maxBatch, MaxSeqs: *maxSeqs, MaxQueue: *maxQueue,
		KVTiers: tiers, Sim: bk.simTiming(), Replicas: *bk.replicas, SLA: *slaTargets, ITLTarget: itl.abs, ITLTargetDecodes: itl.decodes, StepCost: stepCost,
		Pipeline:       headCfg,
		ToolCallParser: *toolParser, ReasoningParser: *reasoningParser, Pooling: pool, Responses: responses,
		LoRA: adapters, MaxLoRAs: *maxLoras, RuntimeLoRA: *runtimeLora,
		Speculation: engine.Speculation{Method: *specMethod, Tokens: *specTokens, MaxBatch: *specBatch, Draft: draft},
		HTTP: node.HTTP{
			Addr: net.JoinHostPort(*host, strconv.Itoa(*port)), TLSCert: *tlsCert, TLSKey: *tlsKey,
			APIKey: *apiKey, PublicMetrics: *publicMetrics, BodyReadTimeout: *bodyTimeout, MinBodyRate: *minBodyRate,
			AllowedOrigins: origins, MetricsPrefix: *metricsPrefix,
		},
		Cluster: node.Cluster{
			Routers: joins, Token: *joinToken, StateDir: *stateDir, Role: *role, NodeName: *nodeName,
			Host: *host, ORPCPort: *orpcPort, Advertise: *advertise, KVHold: *kvHold, KVSendRate: float64(sendRate),
			EventInterval: eventInterval(*kvEventInterval),
		},
		Logger: log, Weights: weights, Started: processStart, OpenTime: openTime,
	})
	if err != nil {
		return err
	}
	st := n.Startup()
	blocks, perToken := n.KVBlocks(), m.KVBytesPerToken()
	itlText := "none"
	if itl.abs > 0 || itl.decodes > 0 {
		itlText = *itlFlag
	}
	fmt.Fprintf(stderr, "tandem serve: %s\n  version: %s\n  model: %s (%s, %s, %d layers) from %s\n  KV cache: %d tokens (%d blocks of %d, %s %v), context %d\n  load time: %v, backend %s, ITL target %s\n  weights: %s\n  start-up: %s\n",
		n.URL(), version.String(), name, m.Config.Arch, m.FileType, m.Config.Layers, sourceName(*modelPath),
		blocks**blockSize, blocks, *blockSize, formatBytes(int64(blocks)*int64(*blockSize)*perToken), kvType, n.ContextLen(),
		st.Total.Round(time.Millisecond), be.Name(), itlText, weightsLine(st), phasesLine(st))
	if responses.Path != "" {
		fmt.Fprintf(stderr, "  responses: stored in %s (TTL %v)\n", responses.Path, *responseTTL)
	} else {
		fmt.Fprintf(stderr, "  responses: kept in memory only (--port 0 without --state-dir or --node-name)\n")
	}
	if headCfg != nil {
		micro := sf.micro
		if micro <= 0 {
			micro = sf.count
		}
		fmt.Fprintf(stderr, "  pipeline: %s, split %s, next stage at %s, %d micro-batches\n", m.Stage, model.FormatSizes(m.Split), sf.next, micro)
	}
	if bk.sim() {
		fmt.Fprintf(stderr, "  sim backend: %d replica%s, modelled compute %+v\n", len(n.Engines()), plural(len(n.Engines())), bk.timing)
	}

	var fatal error
	select {
	case <-ctx.Done():
	case err := <-n.Fatal():
		// A member that cannot join (a wrong token, a refused card) should not
		// linger outside its cluster looking healthy.
		fatal = fmt.Errorf("joining the cluster: %w", err)
	}
	log.Info("shutting down: draining (running requests finish, routers send nothing new)", "deadline", *drain)
	dctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	err = n.Shutdown(dctx)
	if fatal != nil {
		return fatal
	}
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("drain deadline passed; the remaining requests were cut (those from routers migrate)")
		return nil
	}
	return err
}

// tierFlags reads the KV tier flags.
func tierFlags(hostMem, diskDir, diskSize, offload, sharedDir string, minUses int) (kvtier.Config, error) {
	var c kvtier.Config
	var err error
	if hostMem != "" {
		if c.HostBytes, err = parseBytes(hostMem); err != nil {
			return c, fmt.Errorf("--kv-host-memory: %w", err)
		}
	}
	if (diskDir == "") != (diskSize == "") {
		return c, errors.New("--kv-disk-dir and --kv-disk-size go together")
	}
	if diskDir != "" {
		c.DiskDir = diskDir
		if c.DiskBytes, err = parseBytes(diskSize); err != nil {
			return c, fmt.Errorf("--kv-disk-size: %w", err)
		}
	}
	if c.Offload, err = kvcache.ParseOffload(offload); err != nil {
		return c, fmt.Errorf("--kv-offload: %w", err)
	}
	if minUses < 1 {
		return c, fmt.Errorf("--kv-disk-min-uses %d: want 1 or more", minUses)
	}
	c.SharedDir, c.DiskMinUses = sharedDir, minUses
	return c, nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// eventInterval is --kv-event-interval as worker.Config.EventInterval, where 0 is the default
// and a negative duration means none.
func eventInterval(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
