// Package node is one engine process as a value: its KV budget, its engine (or the sim
// backend's replicas), the HTTP API, its cluster membership, and the ordered drain that
// ends them. cmd/tandem turns flags into a Config; tests start nodes the same way.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/cluster"
	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/gguf"
	"tandem/hal"
	"tandem/httpserve"
	"tandem/internal/filehash"
	"tandem/internal/version"
	"tandem/kvcache"
	"tandem/kvtier"
	"tandem/llm"
	"tandem/metrics"
	"tandem/model"
	"tandem/modelgen"
	"tandem/openai"
	"tandem/orpc"
	"tandem/pipeline"
	"tandem/respstore"
	"tandem/sim"
	"tandem/sla"
	"tandem/web"
	"tandem/worker"
)

// Config describes a node. Zero values take the engine's and httpserve's defaults.
type Config struct {
	// Model and Backend are loaded by the caller, which closes them after Shutdown.
	Model   *model.Model
	Backend hal.Backend
	// ModelPath is where Model came from ("": the built-in demo model); a cluster card
	// carries the tokenizer read from it.
	ModelPath string
	// Name is the model's name in the API and the cluster (required).
	Name string

	// KVBudget is the KV cache size in bytes; 0 takes DefaultKVBudget.
	KVBudget       int64
	MaxModelLen    int // 0: the model's
	BlockSize      int
	MaxBatchTokens int
	MaxSeqs        int
	MaxQueue       int

	// KVTiers are the KV cache's lower tiers (docs/kv-tiers.md): host memory, a disk
	// directory, a shared directory. The real backends only: the sim backend keeps no KV.
	KVTiers kvtier.Config

	// Sim, when set, replaces the forward pass by this timing model (the sim backend),
	// with Replicas engines in the process (default 1; more need Cluster.Routers).
	Sim      *sim.Timing
	Replicas int

	// ITLTarget bounds the predicted time of an engine step that carries decode tokens
	// (engine.Config.ITLTarget); 0: none. ITLTargetDecodes, when positive, sets it instead,
	// at every step, to that many times what the step's decodes alone take, as the
	// engine's corrected step cost predicts them (engine.Config.ITLDecodes). StepCost is
	// the forward step's profile the target reads (tandem profile's fit); nil: the sim
	// backend's timing, or, for a real backend, a quick profile measured at start
	// (simstep.QuickPlan), within StepProfileBudget (0: DefaultStepProfileBudget; past it
	// the built-in CPU profile stands in). Either way the engine corrects it with every
	// step it measures.
	ITLTarget         time.Duration
	ITLTargetDecodes  float64
	StepCost          *sim.Timing
	StepProfileBudget time.Duration

	// Pipeline, when set, makes the node the head of a pipeline replica (package
	// pipeline): Model is stage 0 of it (model.LoadStage), and the engine's forward
	// passes go through the other stages, each a process of its own. Start fills its
	// block size, block count, metrics and Changed; the card says the split.
	Pipeline *pipeline.HeadConfig

	HTTP    HTTP
	Cluster Cluster     // no Routers: a node on its own
	SLA     sla.Targets // drawn on the dashboard
	// ToolCallParser and ReasoningParser name the formats of the model's tool calls and
	// reasoning (openai.ToolCallParsers, ReasoningParsers; "auto" or "": from the chat
	// template); routers take them from the card.
	ToolCallParser, ReasoningParser string
	// Pooling is how embeddings pool the hidden states (llm.Poolings; "": last token).
	Pooling llm.Pooling
	// Responses configures the Responses API's store.
	Responses Responses
	Logger    *slog.Logger
	// LoRA are the adapters loaded at start; MaxLoRAs how many stay in memory at once
	// (0: engine.DefaultMaxAdapters); RuntimeLoRA serves the run-time load and unload API.
	LoRA        []LoRA
	MaxLoRAs    int
	RuntimeLoRA bool
	// Speculation configures speculative decoding (engine.Speculation; zero: off).
	Speculation engine.Speculation

	// Weights says where the prepared weights may come from besides the model file
	// (weights.go); Start makes them ready before the engine starts.
	Weights Weights
	// Started is when the process started (zero: when Start was called), OpenTime how
	// long the caller took to open Model: the start-up's first phase.
	Started  time.Time
	OpenTime time.Duration
}

// LoRA is an adapter loaded at start: requests name it in the model field.
type LoRA struct {
	Name, Path string
}

// Responses configures the store of the Responses API's stored responses.
type Responses struct {
	Path string        // the database file ("": in memory, lost at exit)
	TTL  time.Duration // how long a response is kept (0: until deleted)
}

// HTTP configures the node's API server.
type HTTP struct {
	Addr            string // host:port; port 0 picks one
	TLSCert, TLSKey string
	APIKey          string
	PublicMetrics   bool // /metrics without the API key
	BodyReadTimeout time.Duration
	MinBodyRate     int64
	AllowedOrigins  []string // CORS (httpserve.Config.AllowedOrigins)
	MetricsPrefix   string   // an alias prefix for /metrics (metrics.Aliased), e.g. "vllm"
}

// Cluster configures the node's membership; see worker.Config.
type Cluster struct {
	Routers    []string
	Token      string
	StateDir   string
	Role       string // cluster.RoleBoth (default), RolePrefill or RoleDecode
	NodeName   string
	Host       string // the ORPC listen host
	ORPCPort   int    // replica i listens on ORPCPort+i; 0 picks free ports
	Advertise  string
	KVHold     time.Duration
	KVSendRate float64 // bytes per second a KV pull is served at (0: unlimited)
	// EventInterval is the least time between two KV event batches to a router
	// (worker.Config.EventInterval).
	EventInterval time.Duration
}

// deviceBackend is a backend on a device (hal/vulkan) that counts, for /metrics, the weights
// it converted at load and the forward steps it captured and replayed.
type deviceBackend interface {
	ConvertedWeights() map[string]int
	StepCounts() (captures, replays, drops int64)
}

// Node is a running engine process.
type Node struct {
	cfg       Config
	log       *slog.Logger
	reg       *prometheus.Registry
	engines   []*engine.Engine
	workers   []*worker.Worker
	http      *httpserve.Server
	store     *respstore.Store
	stopSweep context.CancelFunc

	blocks     int
	contextLen int

	head        *pipeline.Head // with Config.Pipeline
	headDone    chan struct{}
	workersMu   sync.Mutex // guards workers against healthChanged
	stopEngines context.CancelFunc
	enginesDone chan error
	workersDone sync.WaitGroup
	fatal       chan error
	shutOnce    sync.Once
	shutErr     error

	// Start-up and the weights (weights.go).
	startup         cluster.Startup
	startupFrom     string
	startupMet      *metrics.Startup
	total           time.Duration // process start to serving
	fallbacks       []string
	packed          int
	imported        int
	hash            filehash.Sum     // the model's content hash (zero: not computed)
	weights         *preparedWeights // served to peers
	identity        *orpc.Identity   // earned before a pull
	weightsTransfer *metrics.WeightsTransfer
	stopSave        context.CancelFunc // ends a pack cache write
	saveDone        chan struct{}
}

// DefaultKVBudget is 40% of the memory available now (2 GiB when unknown), but no more
// than maxTokens positions of perToken bytes need.
func DefaultKVBudget(perToken int64, maxTokens int) int64 {
	b := availableMemory() * 2 / 5
	if b == 0 {
		b = 2 << 30
	}
	return min(b, perToken*int64(maxTokens))
}

// Start builds the engines, serves the API and joins the cluster; it returns once the API
// answers (membership continues in the background: Fatal reports a failure to join). ctx
// bounds the start alone; the node runs until Shutdown.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.Model == nil || cfg.Name == "" {
		return nil, errors.New("node: a model and its name are needed")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Pipeline != nil && (cfg.ITLTarget > 0 || cfg.ITLTargetDecodes > 0) {
		return nil, errors.New("node: a pipeline replica has no step profile for an ITL target yet (the quick profile runs the whole model)")
	}
	if cfg.Pipeline != nil && (cfg.Sim != nil || cfg.Replicas > 1) {
		return nil, errors.New("node: a pipeline replica runs the forward pass, as one replica")
	}
	if cfg.Pipeline != nil && cfg.KVTiers.Enabled() {
		// Its blocks move through the stages only for a transfer (pipeline.Head's block
		// I/O); the tiers' saves and loads are not built on it.
		return nil, errors.New("node: the KV tiers of a pipeline replica are not built (its stages hold the KV)")
	}
	if cfg.Replicas > 1 && (cfg.Sim == nil || len(cfg.Cluster.Routers) == 0) {
		return nil, errors.New("node: replicas need the sim backend and routers to reach them through")
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = engine.DefaultBlockSize
	}
	if cfg.MaxSeqs <= 0 {
		cfg.MaxSeqs = engine.DefaultMaxSeqs
	}
	m, log := cfg.Model, cfg.Logger
	if cfg.MaxModelLen > 0 {
		m.Config.ContextLen = cfg.MaxModelLen
	}
	started := cfg.Started
	if started.IsZero() {
		started = time.Now()
	}
	n := &Node{cfg: cfg, log: log, reg: metrics.NewRegistry(),
		enginesDone: make(chan error, cfg.Replicas), fatal: make(chan error, cfg.Replicas)}
	// The weights first: the default KV budget is a share of the memory they leave.
	if err := n.prepareWeights(ctx); err != nil {
		n.stopSaving()
		return nil, err
	}
	perToken := m.KVBytesPerToken()
	if d := cfg.Speculation.Draft; d != nil && cfg.Sim == nil {
		// The draft model's KV store has a slot for every slot of the pool: the budget
		// pays for both.
		perToken += d.KVBytesPerToken()
	}
	budget := cfg.KVBudget
	if budget <= 0 {
		budget = DefaultKVBudget(perToken, cfg.MaxSeqs*m.Config.ContextLen)
	}
	blocks := int(budget / (perToken * int64(cfg.BlockSize)))
	if blocks*cfg.BlockSize < m.Config.ContextLen {
		log.Warn("KV cache smaller than the context; lowering the context length", "kv_tokens", blocks*cfg.BlockSize, "context", m.Config.ContextLen)
		m.Config.ContextLen = blocks * cfg.BlockSize
	}
	if blocks < 1 || m.Config.ContextLen < 2 {
		n.stopSaving()
		return nil, fmt.Errorf("node: a KV budget of %d bytes holds no useful context (%d bytes per token)", budget, perToken)
	}
	n.blocks, n.contextLen = blocks, m.Config.ContextLen
	t := time.Now()
	if err := n.newEngines(ctx); err != nil {
		n.stopSaving()
		return nil, err
	}
	if d, ok := cfg.Backend.(deviceBackend); ok && cfg.Sim == nil {
		metrics.RegisterDevice(n.reg, cfg.Name, metrics.DeviceCounters{Converted: d.ConvertedWeights, Steps: d.StepCounts})
	}
	eng := n.engines[0]
	metrics.RegisterKVState(n.reg, cfg.Name, func() float64 { return float64(eng.Pool().Stats().Used) },
		func() float64 { h, _ := eng.HeldStats(); return float64(h) },
		func() float64 { _, x := eng.HeldStats(); return float64(x) })
	engineCtx, stop := context.WithCancel(context.Background())
	n.stopEngines = stop
	for _, e := range n.engines {
		go func() { n.enginesDone <- e.Run(engineCtx) }()
	}
	if n.head != nil {
		n.headDone = make(chan struct{})
		go func() { n.head.Run(engineCtx, n.engines[0].Reset); close(n.headDone) }()
	}
	if err := n.serveHTTP(); err != nil {
		n.closeStore()
		n.stop()
		n.stopSaving()
		return nil, err
	}
	n.phase("engine", time.Since(t))
	n.total = time.Since(started)
	n.startupMet.Seconds.WithLabelValues("total").Set(n.total.Seconds())
	if len(cfg.Cluster.Routers) > 0 {
		if err := n.join(); err != nil {
			n.http.Shutdown(context.Background())
			n.closeStore()
			n.stop()
			n.stopSaving()
			return nil, err
		}
	}
	return n, nil
}

func (n *Node) newEngines(ctx context.Context) error {
	cfg, m := n.cfg, n.cfg.Model
	ecfg := engine.Config{
		MaxBatchTokens: cfg.MaxBatchTokens,
		MaxSeqs:        cfg.MaxSeqs,
		MaxQueue:       cfg.MaxQueue,
		BlockSize:      cfg.BlockSize,
		KVBlocks:       n.blocks,
		Salt:           kvcache.Salt(cfg.Name, "", ""),
		Metrics:        metrics.NewEngine(n.reg, cfg.Name),
		Logger:         n.log,
		ServedName:     cfg.Name,
		MaxAdapters:    cfg.MaxLoRAs,
		Speculation:    cfg.Speculation,
	}
	if cfg.ITLTarget > 0 || cfg.ITLTargetDecodes > 0 {
		ecfg.ITLTarget = cfg.ITLTarget
		source := "file"
		switch {
		case cfg.StepCost != nil:
			ecfg.Cost = *cfg.StepCost
		case cfg.Sim != nil:
			ecfg.Cost, source = *cfg.Sim, "sim"
		default:
			t, src, err := n.measureStepCost(ctx)
			if err != nil {
				return err
			}
			ecfg.Cost, source = t, src
		}
		ecfg.Metrics.StepCostProfile.WithLabelValues(source).Set(1)
		ecfg.ITLDecodes = cfg.ITLTargetDecodes
	}
	if cfg.Pipeline != nil {
		hc := *cfg.Pipeline
		hc.Model, hc.Backend, hc.Name = m, cfg.Backend, cfg.Name
		hc.BlockSize, hc.Blocks = cfg.BlockSize, n.blocks
		hc.Metrics, hc.Logger = metrics.NewPipeline(n.reg), n.log
		hc.Changed = n.healthChanged
		h, err := pipeline.NewHead(ctx, hc)
		if err != nil {
			return err
		}
		e, err := engine.NewWithForwarder(m, h, ecfg)
		if err != nil {
			h.Close()
			return err
		}
		n.head, n.engines = h, []*engine.Engine{e}
		return nil
	}
	if cfg.Sim == nil {
		var eng *engine.Engine
		ecfg.Tiers, ecfg.ModelID = cfg.KVTiers, WeightsFingerprint(m)
		ecfg.TierMetrics = metrics.NewKVTiers(n.reg, cfg.Name, func() metrics.TierSnapshot { return eng.TierSnapshot() })
		e, err := engine.New(m, cfg.Backend, ecfg)
		if err != nil {
			return err
		}
		for _, l := range cfg.LoRA {
			if err := e.LoadAdapter(context.Background(), l.Name, l.Path); err != nil {
				return fmt.Errorf("--lora %s=%s: %w", l.Name, l.Path, err)
			}
		}
		eng = e
		n.engines = []*engine.Engine{e}
		return nil
	}
	if cfg.KVTiers.Enabled() {
		return errors.New("node: the KV tiers (--kv-host-memory, --kv-disk-dir, --kv-shared-dir) need a real backend: the sim backend keeps no KV (tandem simulate models the tiers)")
	}
	if len(cfg.LoRA) > 0 || cfg.RuntimeLoRA {
		return errors.New("node: the sim backend models the forward pass: it cannot apply LoRA adapters")
	}
	tok := m.Tokenizer
	for i := range cfg.Replicas {
		step, err := simstep.New(simstep.Config{Timing: *cfg.Sim, Vocab: m.Config.VocabSize,
			Skip: func(id int32) bool { return tok.IsEOG(id) || tok.IsControl(id) }})
		if err != nil {
			return err
		}
		c := ecfg
		if i > 0 {
			// The engine metrics are per process, and the HTTP API is replica 0's.
			c.Metrics = nil
			c.Logger = n.log.With("replica", i)
		}
		e, err := engine.NewWithForwarder(m, step, c)
		if err != nil {
			return err
		}
		n.engines = append(n.engines, e)
	}
	return nil
}

// adapterServer is the engine as the API's LoRA adapter server; nil for the sim backend,
// which cannot apply them.
func (n *Node) adapterServer() openai.AdapterServer {
	if n.cfg.Sim != nil {
		return nil
	}
	return n.engines[0]
}

func (n *Node) serveHTTP() error {
	cfg := n.cfg
	store, err := n.openStore()
	if err != nil {
		return err
	}
	httpMet := metrics.NewHTTP(n.reg, "tandem")
	metrics.RegisterCacheConfig(n.reg, cfg.Name, map[string]string{"block_size": strconv.Itoa(cfg.BlockSize),
		"num_gpu_blocks": strconv.Itoa(n.blocks), "cache_dtype": cfg.Model.KVType.String(), "max_model_len": strconv.Itoa(n.contextLen)})
	api := openai.NewHandler([]*openai.Model{{
		ID:         cfg.Name,
		Tokenizer:  cfg.Model.Tokenizer,
		ContextLen: n.contextLen,
		Created:    time.Now().Unix(),
		OwnedBy:    "tandem",
		Backend:    n.engines[0],

		ToolCallParser:  cfg.ToolCallParser,
		ReasoningParser: cfg.ReasoningParser,
		Pooling:         cfg.Pooling,
		Adapters:        n.adapterServer(),
	}}, openai.Options{APIKey: cfg.HTTP.APIKey, Logger: n.log, Metrics: httpMet, Responses: store, RuntimeLoRA: cfg.RuntimeLoRA})
	dash, err := web.New(web.Config{Kind: web.Engine, Name: cfg.Name, Source: n.reg, Registerer: n.reg,
		APIKey: cfg.HTTP.APIKey, SLA: cfg.SLA, Logger: n.log})
	if err != nil {
		return err
	}
	metricsToken := cfg.HTTP.APIKey
	if cfg.HTTP.PublicMetrics {
		metricsToken = ""
	}
	var ready atomic.Bool
	srv, err := httpserve.New(httpserve.Config{
		Addr:            cfg.HTTP.Addr,
		Handler:         dash.Wrap(api), // the dashboard at /dashboard, the API elsewhere
		TLSCert:         cfg.HTTP.TLSCert,
		TLSKey:          cfg.HTTP.TLSKey,
		Ready:           func() bool { return ready.Load() && n.health() == nil }, // a pipeline replica's stages answer
		Metrics:         metrics.HandlerFor(metrics.Aliased(n.reg, "tandem", cfg.HTTP.MetricsPrefix)),
		MetricsToken:    metricsToken,
		Version:         version.String(),
		BodyReadTimeout: cfg.HTTP.BodyReadTimeout,
		MinBodyRate:     cfg.HTTP.MinBodyRate,
		AllowedOrigins:  cfg.HTTP.AllowedOrigins,
		OnRefused:       func(reason string) { httpMet.Refused.WithLabelValues(reason).Inc() },
		Logger:          n.log,
	})
	if err != nil {
		return err
	}
	dash.StopWhen(srv.Draining) // an open dashboard does not hold a drain to its deadline
	if err := srv.Start(); err != nil {
		return err
	}
	ready.Store(true)
	n.http = srv
	return nil
}

// closeStore stops the sweep and closes the response store.
func (n *Node) closeStore() {
	if n.store == nil {
		return
	}
	n.stopSweep()
	if err := n.store.Close(); err != nil {
		n.log.Error("closing the response store", "err", err)
	}
	n.store = nil
}

// openStore opens the Responses API's store and starts its TTL sweep.
func (n *Node) openStore() (*respstore.Store, error) {
	rc := n.cfg.Responses
	opts := respstore.Options{TTL: rc.TTL, Metrics: metrics.NewResponses(n.reg, "tandem"), Logger: n.log}
	store := respstore.NewMemory(opts)
	if rc.Path != "" {
		var err error
		if store, err = respstore.Open(rc.Path, opts); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go store.Run(ctx)
	n.store, n.stopSweep = store, cancel
	return store, nil
}

// join makes every engine a cluster member. A node's name is the one in its certificate,
// so each replica has its own identity: replica 0's in the state directory, replica i's in
// its subdirectory replica-i; replica i listens on ORPCPort+i (a free port when 0) and is
// named NodeName-i.
func (n *Node) join() error {
	cfg, m, cc := n.cfg, n.cfg.Model, n.cfg.Cluster
	tokFormat, tokFiles, err := tokenizerCard(cfg.ModelPath)
	if err != nil {
		return err
	}
	role := cc.Role
	if role == "" {
		role = cluster.RoleBoth
	}
	base := worker.Config{
		Card: cluster.ModelCard{
			Model: cfg.Name, Role: role, HashVersion: kvcache.HashVersion, BlockSize: cfg.BlockSize,
			Salt: kvcache.Salt(cfg.Name, "", ""), KVBlocks: n.blocks, ContextLen: n.contextLen,
			TokenizerFormat: tokFormat, TokenizerFiles: tokFiles, ChatTemplate: m.ChatTemplate,
			GrammarFormat: cluster.GrammarGBNF, ToolCallParser: cfg.ToolCallParser, ReasoningParser: cfg.ReasoningParser,
			RequestLevel: cluster.RequestAdapters, Pooling: string(cfg.Pooling),
			Startup: n.startup, Stages: m.Split,
		},
		Node:          cc.NodeName,
		Routers:       cc.Routers,
		Token:         cc.Token,
		StateDir:      cc.StateDir,
		Advertise:     cc.Advertise,
		KVMetrics:     metrics.NewKVTransfer(n.reg, cfg.Name),
		Metrics:       metrics.NewWorker(n.reg),
		KVHold:        cc.KVHold,
		KVSendRate:    cc.KVSendRate,
		EventInterval: cc.EventInterval,
		Logger:        n.log,
	}
	if cfg.Sim != nil {
		// Sim blocks cross the wire without payload, paced to the modelled time.
		base.KVTransferTime = cfg.Sim.Transfer
	}
	count := len(n.engines)
	advHost := ""
	if base.Advertise != "" && count > 1 {
		if advHost, _, err = net.SplitHostPort(base.Advertise); err != nil {
			return fmt.Errorf("node: advertise address: %w", err)
		}
	}
	for i, e := range n.engines {
		c := base
		c.Engine = e
		port := 0
		if cc.ORPCPort > 0 {
			port = cc.ORPCPort + i
		}
		c.Listen = net.JoinHostPort(cc.Host, strconv.Itoa(port))
		c.StateDir = ReplicaStateDir(base.StateDir, i)
		if i == 0 {
			n.serveWeights(&c)
		}
		if count > 1 {
			if c.Node != "" {
				c.Node = fmt.Sprintf("%s-%d", base.Node, i)
			}
			if advHost != "" {
				c.Advertise = net.JoinHostPort(advHost, strconv.Itoa(port))
			}
			c.Logger = base.Logger.With("replica", i)
		}
		c.Health = n.health
		w, err := worker.New(c)
		if err != nil {
			if count > 1 {
				err = fmt.Errorf("replica %d: %w", i, err)
			}
			return err
		}
		n.workersMu.Lock()
		n.workers = append(n.workers, w)
		n.workersMu.Unlock()
	}
	for _, w := range n.workers {
		n.workersDone.Go(func() {
			if err := w.Run(context.Background()); err != nil {
				n.log.Error("cluster membership failed", "err", err)
				n.fatal <- err
			}
		})
	}
	return nil
}

// ReplicaStateDir is the state directory of sim replica i: dir itself for replica 0 (where
// a single engine keeps its identity), dir/replica-i for the others.
func ReplicaStateDir(dir string, i int) string {
	if i == 0 || dir == "" {
		return dir
	}
	return dir + "/replica-" + strconv.Itoa(i)
}

// tokenizerCard returns the tokenizer of the model at path (the demo model when path is
// empty) as a cluster model card carries it.
func tokenizerCard(path string) (string, []cluster.File, error) {
	if path != "" {
		return cluster.EncodeTokenizer(path)
	}
	data, err := modelgen.DemoGGUF()
	if err != nil {
		return "", nil, fmt.Errorf("demo model: %w", err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return "", nil, fmt.Errorf("demo model: %w", err)
	}
	return cluster.EncodeTokenizerGGUF(f)
}

// URL is the API's base URL.
func (n *Node) URL() string { return n.http.URL() }

// KVBlocks is the KV cache's size in blocks; ContextLen the context length served (lowered
// to what the cache holds).
func (n *Node) KVBlocks() int   { return n.blocks }
func (n *Node) ContextLen() int { return n.contextLen }

// Engines are the node's engines: one, or the sim replicas.
func (n *Node) Engines() []*engine.Engine { return n.engines }

// Registry is the node's Prometheus registry, served at /metrics.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Fatal receives an error that ended a cluster membership (a refused join token): a
// member that cannot join should not linger outside its cluster looking healthy.
func (n *Node) Fatal() <-chan error { return n.fatal }

// Shutdown drains the node in order, bounded by ctx: /health answers 503 at once and new
// HTTP connections get 503; every router is told the node is draining and sends nothing
// new (a request that races the news is refused and goes elsewhere); requests from HTTP and
// from routers run to their end; at ctx's end the remaining ones are cut (HTTP streams with
// an error event, router streams with an Unavailable error their router migrates); the
// workers deregister; the engines stop; a pack cache being written is finished, or cut at
// ctx's end. It returns ctx.Err() if requests were cut.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutOnce.Do(func() {
		var wg sync.WaitGroup
		errs := make([]error, 1+len(n.workers))
		wg.Go(func() { errs[0] = n.http.Shutdown(ctx) })
		for i, w := range n.workers {
			wg.Go(func() { errs[i+1] = w.Shutdown(ctx) })
		}
		wg.Wait()
		n.workersDone.Wait()
		n.stop()
		n.finishSaving(ctx)
		n.closeStore()
		for _, err := range errs {
			if err != nil {
				n.shutErr = err
				break
			}
		}
	})
	return n.shutErr
}

// stop ends the engines and waits for them.
func (n *Node) stop() {
	n.stopEngines()
	for range n.engines {
		<-n.enginesDone
	}
	if n.head != nil {
		<-n.headDone
		n.head.Close()
	}
}

// healthChanged tells the routers at once that the engine's health changed.
func (n *Node) healthChanged() {
	n.workersMu.Lock()
	ws := n.workers
	n.workersMu.Unlock()
	for _, w := range ws {
		w.HealthChanged()
	}
}

// health is the engine's: a pipeline replica's is its link's.
func (n *Node) health() error {
	if n.head != nil {
		return n.head.Err()
	}
	return nil
}
