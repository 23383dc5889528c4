package live

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/cluster"
	"tandem/llm"
	"tandem/metrics"
	"tandem/openai"
	"tandem/orpc"
	"tandem/router"
	"tandem/tokenizer"
)

// Config configures a live router.
type Config struct {
	// Registry receives the router's metrics; nil means a private registry.
	Registry prometheus.Registerer
	Policy   router.Config  // routing policy (DefaultConfig with flags applied)
	Identity *orpc.Identity // the router's cluster identity, to dial workers
	Name     string         // the router's name, for logs (default "tandem-router")
	// Heartbeat is the interval workers are asked to report at (default 250 ms).
	Heartbeat time.Duration
	// HeartbeatTimeout: a worker whose load reports stop for this long is declared dead
	// (default DefaultHeartbeatTimeout(Heartbeat)): it is removed, its connection closed, and
	// its requests fail over (live_failover.go). It gets no new requests from half of it on.
	HeartbeatTimeout time.Duration
	// QueueTimeout is how long a request waits for a worker when every worker is busy
	// before it is answered 429 (default 5 s; negative: no waiting).
	QueueTimeout time.Duration
	// MaxQueue bounds the requests waiting for a worker (default 1024); past it, 429 at once.
	MaxQueue int
	// MaxAttempts bounds the workers a request is dispatched to before its first token,
	// when a worker cannot be reached (default 3).
	MaxAttempts int
	// MaxMigrations bounds how often one request moves to another worker when its worker
	// fails mid-stream (0: DefaultMaxMigrations; negative: never).
	MaxMigrations int
	// StaleAfter: a worker with load whose KV event ids do not move for this long is
	// marked stale (default max(20 heartbeats, 5 s)); see kvsync.go.
	StaleAfter time.Duration
	// KnownCards are the cards of models this router served before (its state directory
	// keeps them): a worker of such a model is held to that card from its first
	// registration. NewModel is called with the card of a model seen for the first time.
	KnownCards map[string]router.Card
	NewModel   func(router.Card)
	APIKey     string
	// Responses keeps the Responses API's stored responses, for every model and worker:
	// the router's API stores them itself, so a response is found whatever worker served it.
	Responses openai.ResponseStore
	// RuntimeLoRA serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter: the
	// router loads an adapter (a path on the workers' machines) on a worker and routes
	// its requests there, loading it again where none serves it.
	RuntimeLoRA bool
	// StreamInterval, above 1, streams tokens that many at a time: workers send them so
	// (GenerateRequest.StreamInterval) and the API writes them so (openai.Options), the
	// first token at once. 0 or 1: each as it comes.
	StreamInterval int
	// CollectedInterval is the stream interval asked of workers for an answer the client
	// reads only whole (a response that is not streamed, without stop strings:
	// llm.Request.Collected), where a message per token would cost the router a message,
	// its wake-ups and system calls per token for nothing. 0: DefaultCollectedInterval; 1:
	// one token per message.
	CollectedInterval int
	// Disagg configures disaggregated prefill and decode, for models with prefill workers.
	Disagg  router.DisaggConfig
	Logger  *slog.Logger
	Options []orpc.Option // for the connections to workers
}

// streamInterval is the stream interval to ask of the worker for req: the configured one,
// or for an answer nobody reads before its end (llm.Request.Collected) CollectedInterval,
// which saves the router a message, a wake-up and its packets' system calls per token
// (docs/routing.md, "The stream, per token"). The first token still comes alone (the
// router's prefill prediction ends with it).
func (c *Config) streamInterval(req *llm.Request) int {
	if req.Collected {
		return max(c.StreamInterval, c.CollectedInterval)
	}
	return c.StreamInterval
}

// DefaultCollectedInterval is Config.CollectedInterval's default: large enough that a
// message per token no longer dominates the router's CPU, small enough that a worker lost
// mid-answer leaves little to generate again (a migration replays what did not arrive).
const DefaultCollectedInterval = 64

// MaxStreamInterval bounds Config.StreamInterval: the most tokens a worker puts in one
// message.
const MaxStreamInterval = cluster.MaxStreamInterval

// Router is the running router: the registry of workers that dialled in, one policy State per
// model, the ORPC services workers call, and the OpenAI API over a Backend that routes to
// workers. The policy (State, Decide) is the functional core; Router adds I/O and locking.
type Router struct {
	cfg Config
	log *slog.Logger
	met *liveMetrics
	dis *metrics.Disagg

	mu      sync.Mutex // the registry and the policy States: decisions
	models  map[string]*liveModel
	workers map[router.WorkerID]*liveWorker
	byNode  map[string]router.WorkerID
	nextID  router.WorkerID
	queued  int
	noneAt  time.Time // since when requests have found no healthy worker (zero: they do)
	// formatsLogged holds the pairings of KV formats already logged as having no prefill
	// worker for a decode worker's format (disagg.go): each is logged once.
	formatsLogged map[string]bool
	// The places the registrations give this router among the workers' routers, how many
	// name each, the one it follows (shares.go), and the dissenting ones already logged.
	places       map[sharePlace]int
	share        sharePlace
	placesLogged map[sharePlace]bool

	// changed fires when load may have dropped: waiting requests look again. Lock-free,
	// so that heartbeats need not take mu.
	changed broadcast
	// beats fires at every beat (Run): each registration's handler then sends its worker
	// the reply again (beatEvery).
	beats broadcast
	// byID is the registry for the heartbeat and event handlers, which do not take mu.
	byID sync.Map // router.WorkerID → *liveWorker
	// Workers with policy updates (a load report, a stale flag) for the next decision.
	mailMu sync.Mutex
	mail   []*liveWorker

	api     atomic.Pointer[http.Handler]
	httpMet *metrics.HTTP

	// The SLA planner (planner.go): its counters and retiring workers, while RunPlanner runs.
	lp      atomic.Pointer[livePlanner]
	planMet *metrics.Planner
}

type liveModel struct {
	name    string
	card    cluster.ModelCard // the first worker's card: tokenizer and chat template
	tok     *tokenizer.Tokenizer
	state   *router.State
	created int64
	// adapters are the paths of the LoRA adapters loaded through the router's run-time
	// API (guarded by the router's lock): where none of its workers serves one, the router
	// loads it on one (lora.go).
	adapters map[string]string
}

type liveWorker struct {
	id     router.WorkerID
	node   string
	addr   string
	place  sharePlace // where its registration placed this router among its routers
	model  *liveModel
	client *orpc.Client
	joined time.Time
	beat   atomic.Int64 // unix nanoseconds of the last load report, less the router's own stalls
	// publishing is set while the worker's reports come on its Worker.Publish stream: a
	// report by a call is then the worker's liveness probe, which says it is alive and
	// nothing more (its figures could overtake an older report still on the stream).
	publishing atomic.Bool
	// The worker's KV sync (kvsync.go): its own lock, never held while taking l.mu.
	kv  sync.Mutex
	kvs kvSync
	// Policy updates waiting for the next decision (Router.post).
	report    atomic.Pointer[mailReport]
	staleFlag atomic.Bool
	dirty     atomic.Bool
	kick      chan struct{}
	kickOnce  sync.Once
	reason    string
	// key is the registration's dispatch key: Generate calls carry it, load reports count them.
	key uint64
	// cert is the fingerprint of the certificate the worker registered with: its identity.
	cert [sha256.Size]byte
	// displaced is the address of the registration of the same identity this one replaced
	// while that one was still reporting, and when (see nameConflictLocked).
	displaced   string
	displacedAt time.Time
	// retiring: the planner is removing the worker: it gets no new requests, whatever its
	// load reports say, until it leaves.
	retiring atomic.Bool
	// From the card: the model's content hash and the backend's prepared-weights key (a
	// new engine of the same hash may pull its weights from this one: weights.go), and
	// how it started.
	contentHash []byte
	prepared    string
	startup     cluster.Startup
	stages      []int // the layers of each pipeline stage; nil: one process
}

// mailReport is a load report waiting for the next decision.
type mailReport struct {
	load llm.Load
	at   time.Time
}

// lastBeat is when w's last load report came, as the heartbeat watch counts it.
func (w *liveWorker) lastBeat() time.Time { return time.Unix(0, w.beat.Load()) }

func (w *liveWorker) remove(reason string) {
	w.kickOnce.Do(func() {
		w.reason = reason
		close(w.kick)
	})
}

// New returns a router with no workers.
func New(cfg Config) (*Router, error) {
	if cfg.Identity == nil {
		return nil, errors.New("router: a live router needs a cluster identity")
	}
	if cfg.Policy.Mode == "" {
		cfg.Policy.Mode = router.ModeKV
	}
	if _, err := router.NewState(cfg.Policy, nil); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "tandem-router"
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 250 * time.Millisecond
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout(cfg.Heartbeat)
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = 5 * time.Second
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 1024
	}
	if cfg.CollectedInterval <= 0 {
		cfg.CollectedInterval = DefaultCollectedInterval
	}
	cfg.CollectedInterval = min(cfg.CollectedInterval, MaxStreamInterval)
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	switch {
	case cfg.MaxMigrations == 0:
		cfg.MaxMigrations = DefaultMaxMigrations
	case cfg.MaxMigrations < 0:
		cfg.MaxMigrations = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if d := router.DefaultDisaggConfig(); cfg.Disagg.Hold <= 0 {
		cfg.Disagg.Hold = d.Hold
	}
	if d := router.DefaultDisaggConfig(); cfg.Disagg.TransferTimeout <= 0 {
		cfg.Disagg.TransferTimeout = d.TransferTimeout
	}
	l := &Router{
		cfg:     cfg,
		log:     cfg.Logger,
		models:  map[string]*liveModel{},
		workers: map[router.WorkerID]*liveWorker{},
		byNode:  map[string]router.WorkerID{},

		formatsLogged: map[string]bool{},
		places:        map[sharePlace]int{},
		placesLogged:  map[sharePlace]bool{},
	}
	l.changed.init()
	l.beats.init()
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	l.met = newLiveMetrics(l, reg)
	l.dis = metrics.NewDisagg(reg)
	l.httpMet = metrics.NewHTTP(reg, "tandem_router")
	l.planMet = metrics.NewPlanner(reg)
	l.rebuildAPI()
	return l, nil
}

// Register adds the router's services (Router.Register, Router.Heartbeat, Router.Events) to
// srv.
func (l *Router) Register(srv *orpc.Server) {
	orpc.ServerStream(srv, cluster.MethodRegister, l.register)
	orpc.Unary(srv, cluster.MethodHeartbeat, l.heartbeat)
	orpc.Unary(srv, cluster.MethodEvents, l.events)
	orpc.Unary(srv, cluster.MethodWeightPeers, l.weightPeers)
}

// Run watches heartbeats until ctx is done: a worker silent for half of HeartbeatTimeout
// (four intervals at most) is marked unhealthy (no new requests) until its next report, one
// silent for HeartbeatTimeout is declared dead and removed (live_failover.go). The router
// judges its own lateness too: when a check runs late (its host stalled: a pause, CPU
// starvation), the lateness is credited to every worker, since their reports could not be
// taken meanwhile; and when most workers cross the timeout at once, none is declared dead
// (a whole fleet dying in the same instant is far less likely than the router's host or
// network failing, and with no worker left there is nothing to fail over to), counted and
// logged once, until some report comes again or the silence lasts three timeouts. It also
// sweeps the KV index's retired entries a chunk at a time.
func (l *Router) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Heartbeat)
	defer t.Stop()
	bt := time.NewTicker(l.beatEvery())
	defer bt.Stop()
	suspect := l.suspectAfter()
	prev := time.Now()
	holding := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-bt.C:
			l.beats.fire()
			continue
		case <-t.C:
		}
		now := time.Now() // not the tick's time: a starved goroutine receives it late
		if late := now.Sub(prev) - l.cfg.Heartbeat; late > l.cfg.Heartbeat/2 {
			l.creditStall(late)
		}
		prev = now
		l.mu.Lock()
		l.drainLocked()
		// Most workers silent past suspicion at once: hold the deaths (see above).
		silentN, dead := 0, 0
		for _, w := range l.workers {
			switch silent := now.Sub(w.lastBeat()); {
			case silent > l.cfg.HeartbeatTimeout:
				dead++
				silentN++
			case silent > suspect:
				silentN++
			}
		}
		hold := dead > 0 && silentN >= 2 && 2*silentN > len(l.workers) && !l.longSilence(now)
		if hold && !holding {
			l.met.MassSilenceHolds.Inc()
			l.log.Warn("most workers silent at once; declaring none dead (this router's host or network is the likelier cause)",
				"silent", silentN, "workers", len(l.workers), "heartbeat_timeout", l.cfg.HeartbeatTimeout)
		}
		holding = hold
		for _, w := range l.workers {
			silent := now.Sub(w.lastBeat())
			switch {
			case silent > l.cfg.HeartbeatTimeout && !hold:
				l.declareDeadLocked(w, silent)
			case silent > suspect:
				w.model.state.SetHealthy(w.id, false)
			}
		}
		for _, m := range l.models {
			m.state.Sweep(now)
		}
		models := make([]*liveModel, 0, len(l.models))
		for _, m := range l.models {
			models = append(models, m)
		}
		l.mu.Unlock()
		for _, m := range models {
			m.state.Index().Sweep(1 << 16) // retired slots' entries, a shard chunk per lock
		}
	}
}

// creditStall adds the router's own lateness to every worker's last report time: their
// reports could not be taken while it stalled.
func (l *Router) creditStall(late time.Duration) {
	l.met.RouterStalls.Inc()
	l.met.RouterStallTime.Add(late.Seconds())
	l.log.Debug("heartbeat check ran late; not counting the stall against the workers", "late", late.Round(time.Millisecond))
	l.byID.Range(func(_, v any) bool {
		w := v.(*liveWorker)
		for {
			b := w.beat.Load()
			nb := min(b+int64(late), time.Now().UnixNano())
			if w.beat.CompareAndSwap(b, nb) {
				break
			}
		}
		return true
	})
}

// longSilence reports whether every worker has been silent for three heartbeat timeouts:
// then it is the fleet, not a stall. Called with l.mu held.
func (l *Router) longSilence(now time.Time) bool {
	for _, w := range l.workers {
		if now.Sub(w.lastBeat()) < 3*l.cfg.HeartbeatTimeout {
			return false
		}
	}
	return true
}

// noneLocked logs, once per episode, that requests find no healthy worker (they wait in
// the queue meanwhile), and that they find one again. Called with l.mu held.
func (l *Router) noneLocked(none bool, now time.Time) {
	switch {
	case none && l.noneAt.IsZero():
		l.noneAt = now
		l.log.Warn("no healthy worker: requests wait in the router's queue", "queue_timeout", l.cfg.QueueTimeout, "workers", len(l.workers))
	case !none && !l.noneAt.IsZero():
		l.log.Info("a healthy worker is back: queued requests are dispatched", "after", now.Sub(l.noneAt).Round(time.Millisecond))
		l.noneAt = time.Time{}
	}
}

// post queues w's policy updates for the next decision.
func (l *Router) post(w *liveWorker) {
	if !w.dirty.Swap(true) {
		l.mailMu.Lock()
		l.mail = append(l.mail, w)
		l.mailMu.Unlock()
	}
}

// drainLocked applies the load reports and stale flags posted since the last decision to
// the policy: before every decision, and before every change to a worker's in-flight
// records (a first token, an end), so that a report received before the change is applied
// before it, as it would have been under one lock. Called with l.mu held.
func (l *Router) drainLocked() {
	l.mailMu.Lock()
	mail := l.mail
	l.mail = nil
	l.mailMu.Unlock()
	for _, w := range mail {
		w.dirty.Store(false)
		if l.workers[w.id] != w {
			continue
		}
		st := w.model.state
		if r := w.report.Swap(nil); r != nil {
			st.Report(w.id, r.load, r.at)
			if w.retiring.Load() {
				st.SetHealthy(w.id, false) // the planner is removing it
			}
		}
		st.SetStale(w.id, w.staleFlag.Load())
	}
}

// lookupFast finds a registered worker without the router's lock.
func (l *Router) lookupFast(id uint64) (*liveWorker, error) {
	if v, ok := l.byID.Load(router.WorkerID(id)); ok && uint64(router.WorkerID(id)) == id {
		return v.(*liveWorker), nil
	}
	return nil, orpc.Errorf(orpc.NotFound, "router: worker %d is not registered here (register again)", id)
}

// WorkerInfo describes a registered worker.
type WorkerInfo struct {
	ID      router.WorkerID
	Node    string
	Addr    string
	Model   string
	Healthy bool
	Blocks  int     // blocks the index holds for it
	Load    float64 // predicted load in blocks (prefill + decode)
	Startup cluster.Startup
	// Stages is the layers of each pipeline stage of the worker's replica (nil: one
	// process); the router routes to a replica as to any worker.
	Stages []int
}

// Workers returns the registered workers, by id.
func (l *Router) Workers() []WorkerInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drainLocked()
	var out []WorkerInfo
	for _, w := range l.workers {
		st, _ := w.model.state.Worker(w.id)
		out = append(out, WorkerInfo{ID: w.id, Node: w.node, Addr: w.addr, Model: w.model.name, Healthy: st.Healthy,
			Blocks: w.model.state.Index().Blocks(w.id), Load: st.Load(), Startup: w.startup, Stages: w.stages})
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Policy returns the policy's view of the worker named node serving model.
func (l *Router) Policy(model, node string) (router.WorkerState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drainLocked()
	id, ok := l.byNode[node]
	w := l.workers[id]
	if !ok || w == nil || w.model.name != model {
		return router.WorkerState{}, false
	}
	return w.model.state.Worker(w.id)
}

// signal wakes requests waiting for a worker.
func (l *Router) signal() { l.changed.fire() }

// changedCh is the channel the next signal closes: read it before looking at the state.
func (l *Router) changedCh() <-chan struct{} { return l.changed.wait() }

// A broadcast wakes every goroutine waiting on it at once, without a lock: fire closes the
// channel wait returned and puts a new one in its place. init makes the first channel.
type broadcast struct{ ch atomic.Pointer[chan struct{}] }

func (b *broadcast) init() {
	ch := make(chan struct{})
	b.ch.Store(&ch)
}

func (b *broadcast) wait() <-chan struct{} { return *b.ch.Load() }

func (b *broadcast) fire() {
	ch := make(chan struct{})
	close(*b.ch.Swap(&ch))
}

// workerAddr is the address to dial a worker at: its card's, with an empty or unspecified
// host replaced by the address it connected from.
func workerAddr(card string, peer net.Addr) (string, error) {
	host, port, err := net.SplitHostPort(card)
	if err != nil {
		return "", fmt.Errorf("worker address %q: %w", card, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if pa, ok := peer.(*net.UDPAddr); ok {
			host = pa.IP.String()
		} else if h, _, err := net.SplitHostPort(peer.String()); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port), nil
}

// register serves Router.Register: it checks the card, dials the worker back, adds it, and
// keeps it until the call ends, the worker's connection drops or its heartbeats stop.
func (l *Router) register(ctx context.Context, card *cluster.ModelCard, send func(*cluster.RegisterReply) error) error {
	peer, _ := orpc.PeerFromContext(ctx)
	var from net.Addr = &net.UDPAddr{}
	if peer != nil {
		from = peer.Addr
	}
	if card.Version != cluster.Version {
		return orpc.Errorf(orpc.FailedPrecondition, "router: model card version %d, this router speaks %d", card.Version, cluster.Version)
	}
	if card.Node == "" || card.Model == "" {
		return orpc.Errorf(orpc.InvalidArgument, "router: a model card needs a node name and a model")
	}
	switch card.Role {
	case "", cluster.RoleBoth, cluster.RolePrefill, cluster.RoleDecode:
	default:
		return orpc.Errorf(orpc.InvalidArgument, "router: worker %q has role %q (want both, prefill or decode)", card.Node, card.Role)
	}
	addr, err := workerAddr(card.Addr, from)
	if err != nil {
		return orpc.Errorf(orpc.InvalidArgument, "router: %v", err)
	}
	log := l.log.With("worker", card.Node, "addr", addr, "model", card.Model)
	// A node's name is the one in its certificate (the name it joined under).
	if peer == nil || len(peer.Certificates) == 0 || peer.Name != card.Node {
		certName := ""
		if peer != nil {
			certName = peer.Name
		}
		l.met.mem.NameRefusals.WithLabelValues("certificate_name").Inc()
		log.Error("refusing worker: its card's node name is not the name in its certificate", "certificate_name", certName, "from", from)
		return orpc.Errorf(orpc.PermissionDenied, "router: refusing worker %q from %s: its certificate is node %q's; a node registers under the name it joined with",
			card.Node, from, certName)
	}
	cert := sha256.Sum256(peer.Certificates[0].Raw)
	l.mu.Lock()
	err = l.nameConflictLocked(card.Node, cert, addr, from, time.Now())
	l.mu.Unlock()
	if err != nil {
		return err
	}

	// Rebuild the tokenizer of a new model before taking the lock.
	l.mu.Lock()
	m := l.models[card.Model]
	l.mu.Unlock()
	var tok *tokenizer.Tokenizer
	if m == nil {
		if tok, err = card.DecodeTokenizer(); err != nil {
			log.Error("refusing worker: its tokenizer does not load", "err", err)
			return orpc.Errorf(orpc.FailedPrecondition, "router: refusing worker %q: tokenizer: %v", card.Node, err)
		}
	}

	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	client, err := orpc.Dial(dctx, addr, l.cfg.Identity.ClientTLS(), append([]orpc.Option{orpc.WithLogger(l.log), orpc.WithAgent(l.cfg.Name)}, l.cfg.Options...)...)
	cancel()
	if err != nil {
		log.Error("refusing worker: cannot dial it back", "err", err)
		return orpc.Errorf(orpc.Unavailable, "router: cannot reach worker %q at %s: %v", card.Node, addr, err)
	}
	// Closing the connection ends every call on it at once, with the reason the worker left
	// (the calls of a dead worker would otherwise wait for QUIC's idle timeout).
	closeReason := "registration refused"
	defer func() { client.CloseWithReason(closeReason) }()

	core := router.Card{Model: card.Model, HashVersion: card.HashVersion, BlockSize: card.BlockSize, Salt: card.Salt, KVBlocks: card.KVBlocks, Role: card.Role, KVFormat: card.KVFormat, Node: card.Node}
	l.mu.Lock()
	m = l.models[card.Model]
	newModel := false
	if m == nil {
		pol := l.cfg.Policy
		known, remembered := l.cfg.KnownCards[card.Model]
		if remembered {
			pol.Card = known
		}
		// A seed of its own: two routers over the same workers break ties differently.
		st, err := router.NewState(pol, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
		if err != nil {
			l.mu.Unlock()
			return orpc.Errorf(orpc.Internal, "router: %v", err)
		}
		l.applyShare(st)
		m = &liveModel{name: card.Model, card: *card, tok: tok, state: st, created: time.Now().Unix()}
		newModel = true
	} else if !cluster.SameTokenizer(&m.card, card) {
		l.mu.Unlock()
		log.Error("refusing worker: its tokenizer or chat template differs from the model's other workers")
		return orpc.Errorf(orpc.FailedPrecondition, "router: refusing worker %q: its tokenizer or chat template differs from the other workers of model %q", card.Node, card.Model)
	}
	now := time.Now()
	if err := l.nameConflictLocked(card.Node, cert, addr, from, now); err != nil {
		l.mu.Unlock()
		return err
	}
	var displaced string
	if old, ok := l.byNode[card.Node]; ok {
		if ow := l.workers[old]; ow != nil {
			if ow.cert == cert && ow.addr != addr && now.Sub(ow.lastBeat()) < l.suspectAfter() {
				displaced = ow.addr
			}
			log.Info("replacing the previous registration of this node", "previous_addr", ow.addr,
				"same_identity", ow.cert == cert, "silent", now.Sub(ow.lastBeat()).Round(time.Millisecond))
			ow.remove("replaced by a new registration of the same node")
			l.dropLocked(ow)
		}
	}
	l.nextID++
	id := l.nextID
	if err := m.state.AddWorker(id, core); err != nil {
		l.mu.Unlock()
		if _, remembered := l.cfg.KnownCards[card.Model]; remembered && newModel {
			err = fmt.Errorf("%w (the card this router remembers from earlier runs; to change it, stop the router and remove %s from its state directory)", err, cardsFile)
		}
		log.Error("refusing worker: model card mismatch", "err", err)
		l.met.Refused.Inc()
		return orpc.Errorf(orpc.FailedPrecondition, "%v", err)
	}
	if newModel {
		l.models[card.Model] = m
	}
	_, remembered := l.cfg.KnownCards[card.Model]
	persist := newModel && !remembered && l.cfg.NewModel != nil
	w := &liveWorker{id: id, node: card.Node, addr: addr, model: m, client: client, joined: now,
		kick: make(chan struct{}), key: rand.Uint64() | 1, cert: cert,
		contentHash: card.ContentHash, prepared: card.Prepared, startup: card.Startup, stages: slices.Clone(card.Stages),
		place: sharePlace{card.RouterIndex, card.Routers}}
	w.beat.Store(now.UnixNano())
	w.kvs.resyncing = true // until the first snapshot: events wait for it
	if displaced != "" {
		w.displaced, w.displacedAt = displaced, now
	}
	if newModel {
		// Before the worker is visible: a request that finds the worker finds its model.
		l.rebuildAPILocked()
	}
	if _, ok := l.retiringPool(card.Node); ok {
		w.retiring.Store(true) // asked to go before it had registered
		m.state.SetHealthy(id, false)
	}
	l.workers[id] = w
	l.byNode[card.Node] = id
	l.byID.Store(id, w)
	l.countPlaceLocked(w.place, w.node, +1)
	l.signal()
	l.mu.Unlock()
	if persist {
		l.cfg.NewModel(core)
	}
	l.met.Joins.Inc()
	log.Info("worker joined", "id", id, "block_size", card.BlockSize, "kv_blocks", card.KVBlocks, "role", card.Role, "stages", max(len(card.Stages), 1))

	defer func() {
		l.mu.Lock()
		l.dropLocked(w)
		l.mu.Unlock()
		l.met.Losses.Inc()
		closeReason = fmt.Sprintf("worker %s left: %s", card.Node, w.reason)
		log.Warn("worker left", "id", id, "reason", w.reason)
	}()
	beat := l.beatEvery()
	reply := &cluster.RegisterReply{WorkerID: uint64(id), HeartbeatMs: int(l.cfg.Heartbeat / time.Millisecond), Router: l.cfg.Name,
		DispatchKey: w.key, HeartbeatTimeoutMs: int(l.cfg.HeartbeatTimeout / time.Millisecond), BeatMs: int(beat / time.Millisecond)}
	if err := send(reply); err != nil {
		w.remove("registration reply failed: " + err.Error())
		return err
	}
	l.met.KVResyncs.WithLabelValues(w.node, "join").Inc()
	go l.resync(w) // a new member starts from a snapshot
	go l.subscribe(ctx, w)
	// The reply again every beat tells the worker that this router is alive (see
	// beatEvery): one message on a stream already open, where a Router.Heartbeat call
	// opened and closed a stream of its own.
	for {
		beatNow := l.beats.wait()
		select {
		case <-ctx.Done():
			w.remove("registration ended: " + context.Cause(ctx).Error())
			return nil
		case <-client.Done():
			w.remove("connection to the worker lost: " + client.Err().Error())
			return nil
		case <-w.kick:
			return nil
		case <-beatNow:
			if err := send(reply); err != nil {
				w.remove("registration stream failed: " + err.Error())
				return err
			}
		}
	}
}

// beatEvery is how often the router repeats a worker's RegisterReply on its Register
// stream, the sign of life the worker watches for (cluster.RegisterReply.BeatMs): every
// heartbeat timeout, as often as a worker used to probe with Router.Heartbeat calls. The
// worker takes a silence of three heartbeat timeouts and one beat for the router's loss.
// Run beats for every worker at once: one wake-up of the router's process, where a timer
// each woke it once a worker (on an idle router the Go runtime's cost of waking up,
// threads and its monitor, is more than that of the sends).
// Between beats the connection carries nothing else while the worker is idle (its reports
// go on the router's own connection to it): with beats more often than QUIC's keepalive
// (orpc.DefaultKeepAlive, 2.5 s), it sends none.
func (l *Router) beatEvery() time.Duration { return l.cfg.HeartbeatTimeout }

// sharedIdentityWindow is how long a registration remembers the live registration of the
// same identity it replaced, to tell two processes sharing one identity from a restart.
const sharedIdentityWindow = 30 * time.Second

// nameConflictLocked refuses a registration of node from a worker at addr (which connected
// from from) with the certificate whose fingerprint is cert, while another registration of
// that name is live: reporting within suspectAfter and not on its way out. A registration
// of the same identity (the same certificate) replaces it: that is the node registering
// again, after a restart (kill -9 leaves its old registration reporting-fresh for up to a
// heartbeat timeout) or a new session; two engines that joined separately under one name
// hold different certificates and are refused while the first is live, so they cannot
// take turns evicting each other. One case of the same identity is refused too: two
// processes sharing one state directory, recognised when the registration that replaced a
// live one is in turn replaced from the address it displaced. A holder that stopped
// reporting is replaced: a node restarted after a crash gets its name back at once.
// Called with l.mu held.
func (l *Router) nameConflictLocked(node string, cert [sha256.Size]byte, addr string, from net.Addr, now time.Time) error {
	old, ok := l.byNode[node]
	if !ok {
		return nil
	}
	ow := l.workers[old]
	if ow == nil {
		return nil
	}
	select {
	case <-ow.kick:
		return nil // on its way out
	default:
	}
	silent := now.Sub(ow.lastBeat())
	if silent >= l.suspectAfter() {
		return nil
	}
	switch {
	case ow.cert != cert:
		l.met.mem.NameRefusals.WithLabelValues("name_in_use").Inc()
		l.log.Error("refusing worker: another live worker has its node name", "worker", node, "addr", addr, "from", from,
			"holder_addr", ow.addr, "holder_last_report", silent.Round(time.Millisecond))
		return orpc.Errorf(orpc.AlreadyExists, "router: node name %q is taken by a live worker at %s (last load report %v ago); refusing the one at %s (connected from %s): give each engine its own --node-name and --state-dir",
			node, ow.addr, silent.Round(time.Millisecond), addr, from)
	case ow.displaced == addr && addr != ow.addr && now.Sub(ow.displacedAt) < sharedIdentityWindow:
		ow.displacedAt = now // still trying: keep recognising it
		l.met.mem.NameRefusals.WithLabelValues("shared_identity").Inc()
		l.log.Error("refusing worker: two live processes hold the identity of one node", "worker", node, "addr", addr, "from", from,
			"holder_addr", ow.addr)
		return orpc.Errorf(orpc.AlreadyExists, "router: two live processes hold the identity of node %q, at %s and at %s (connected from %s): they share a state directory; give each engine its own --state-dir and --node-name",
			node, ow.addr, addr, from)
	}
	return nil
}

// suspectAfter is how long a worker may go without a load report before it is taken for
// unhealthy (no new requests) and its name for free.
func (l *Router) suspectAfter() time.Duration {
	return min(4*l.cfg.Heartbeat, l.cfg.HeartbeatTimeout/2)
}

// dropLocked removes w from the registry and the policy. Called with l.mu held.
func (l *Router) dropLocked(w *liveWorker) {
	if l.workers[w.id] != w {
		return
	}
	delete(l.workers, w.id)
	l.byID.Delete(w.id)
	l.countPlaceLocked(w.place, w.node, -1)
	if l.byNode[w.node] == w.id {
		delete(l.byNode, w.node)
	}
	w.kv.Lock() // after this no event, resync or check touches the index for w
	w.kvs.gone = true
	w.kvs.backlog = nil
	w.kv.Unlock()
	if w.retiring.Load() {
		inflight := 0
		if ws, ok := w.model.state.Worker(w.id); ok {
			inflight = ws.Inflight
		}
		l.retiredLeftLocked(w, inflight)
	}
	w.model.state.RemoveWorker(w.id)
	for _, c := range []interface{ DeleteLabelValues(...string) bool }{l.met.KVGaps, l.met.KVResyncFailures, l.met.KVDrift, l.met.KVStale, l.met.KVEventsDropped} {
		c.DeleteLabelValues(w.node)
	}
	l.met.KVResyncs.DeletePartialMatch(prometheus.Labels{"worker": w.node}) // labelled by cause too
	l.signal()
}

// subscribe reads w's load reports and KV event batches from its Worker.Publish stream
// until the registration (ctx) ends, and applies each as Router.Heartbeat and
// Router.Events do. A worker that does not serve the method keeps making those calls.
func (l *Router) subscribe(ctx context.Context, w *liveWorker) {
	cs, err := w.client.Stream(ctx, cluster.MethodPublish, &cluster.PublishRequest{DispatchKey: w.key})
	if err != nil {
		return
	}
	defer cs.Close()
	defer w.publishing.Store(false)
	reports, events := l.met.WorkerMessages.WithLabelValues("report", "stream"), l.met.WorkerMessages.WithLabelValues("events", "stream")
	for {
		var p cluster.Publication
		if err := cs.RecvMsg(&p); err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, io.EOF):
			case errors.Is(err, orpc.ErrNotFound):
				l.log.Info("the worker does not publish its reports over a stream (an older engine); it sends them as calls", "worker", w.node)
			default:
				l.log.Warn("the worker's report stream ended; it sends its reports as calls", "worker", w.node, "err", err)
			}
			return
		}
		w.publishing.Store(true) // the worker publishes: its calls are probes from now on
		switch p.Kind {
		case cluster.PublishReport:
			if p.Report.WorkerID != uint64(w.id) {
				l.log.Warn("a load report for another registration on the worker's report stream; ending the stream", "worker", w.node, "worker_id", p.Report.WorkerID)
				return
			}
			reports.Inc()
			l.report(w, &p.Report)
		case cluster.PublishEvents:
			events.Inc()
			l.applyEvents(w, &p.Events)
		}
	}
}

// heartbeat serves Router.Heartbeat without the router's lock: the report waits for the
// next decision (post), the KV checks take only the worker's own lock.
func (l *Router) heartbeat(ctx context.Context, r *cluster.LoadReport) (*cluster.Ack, error) {
	w, err := l.lookupFast(r.WorkerID)
	if err != nil {
		return nil, err
	}
	l.met.WorkerMessages.WithLabelValues("report", "call").Inc()
	if w.publishing.Load() {
		w.beat.Store(time.Now().UnixNano()) // a probe: the report itself comes on the stream
		return &cluster.Ack{}, nil
	}
	l.report(w, r)
	return &cluster.Ack{}, nil
}

// report takes a load report of w.
func (l *Router) report(w *liveWorker, r *cluster.LoadReport) {
	now := time.Now()
	w.beat.Store(now.UnixNano())
	w.report.Store(&mailReport{load: r.Load, at: now})
	l.post(w)
	l.checkReport(w, r.Load, now)
	l.signal()
}

// rebuildAPI makes a new OpenAI handler over the models known now.
func (l *Router) rebuildAPI() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rebuildAPILocked()
}

// rebuildAPILocked is rebuildAPI with l.mu held, which also orders the handlers stored by
// two registrations at once.
func (l *Router) rebuildAPILocked() {
	var models []*openai.Model
	for _, m := range l.models {
		models = append(models, &openai.Model{
			ID: m.name, Tokenizer: m.tok, ContextLen: m.card.ContextLen, Created: m.created, OwnedBy: "tandem",
			Backend: &liveBackend{l: l, m: m}, ChatTemplate: m.card.ChatTemplate,
			// The worker's output parsers, and whether it follows grammars at all.
			ToolCallParser:  knownOr(m.card.ToolCallParser, openai.ToolCallParsers, l.log, "tool-call parser", m.name),
			ReasoningParser: knownOr(m.card.ReasoningParser, openai.ReasoningParsers, l.log, "reasoning parser", m.name),
			NoConstraints:   m.card.GrammarFormat < cluster.GrammarGBNF,
			NoTokenControls: m.card.RequestLevel < cluster.RequestTokens,
			Pooling:         llm.Pooling(m.card.Pooling),
			Adapters:        &clusterAdapters{l: l, m: m},
		})
	}
	slices.SortFunc(models, func(a, b *openai.Model) int { return cmp.Compare(a.ID, b.ID) })
	h := openai.NewHandler(models, openai.Options{APIKey: l.cfg.APIKey, Logger: l.log, Metrics: l.httpMet, Responses: l.cfg.Responses, RuntimeLoRA: l.cfg.RuntimeLoRA,
		StreamInterval: l.cfg.StreamInterval})
	l.api.Store(&h)
}

// knownOr is a parser name from a worker's card when the router knows it, else "" (chosen
// from the chat template), which it logs.
func knownOr(name string, known []string, log *slog.Logger, what, model string) string {
	if name == "" || slices.Contains(known, name) {
		return name
	}
	log.Warn("a worker's "+what+" is unknown to this router; choosing it from the chat template", "model", model, "parser", name)
	return ""
}

// SessionHeader carries a session id; requests of one session stay on one worker.
const SessionHeader = openai.SessionHeader

// Handler is the router's OpenAI API: the models registered so far. A request's session is
// its X-Session-Id header, else the "user" field of its body (openai sets llm.Request.Session;
// the router never reads a body itself, so the API handler's body limit and its closing of
// the connection after a 413 hold).
func (l *Router) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*l.api.Load()).ServeHTTP(w, r)
	})
}
