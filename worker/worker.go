// Package worker makes an engine a cluster member: it serves Worker.Generate and
// Worker.Snapshot over ORPC, and registers with each router it is given, then keeps sending
// heartbeats (load reports) and its KV event stream, reconnecting with backoff when a router
// goes away. The messages are those of package cluster (docs/orpc.md, "Services").
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/metrics"
	"tandem/orpc"
)

// Engine is what the worker needs of an engine (tandem/engine.Engine implements it).
type Engine interface {
	Generate(ctx context.Context, req *llm.Request) (llm.Stream, error)
	Pool() *kvcache.Pool
}

// StatsEngine is an Engine that reports its scheduler's state (tandem/engine.Engine does);
// the worker's load reports then carry the engine's own figures rather than its count of
// ORPC requests.
type StatsEngine interface {
	Engine
	Stats() engine.Stats
}

// adapterEngine is an Engine that serves LoRA adapters (tandem/engine.Engine does): the
// load reports list them, so that the router sends an adapter's requests where it is.
type adapterEngine interface {
	Adapters() []llm.AdapterInfo
}

// Config configures a Worker.
type Config struct {
	Engine Engine
	// Health, if set, says whether the engine can serve: an error (a pipeline replica
	// whose stage is lost) makes the load reports unhealthy, so that routers send nothing
	// new, and refuses new requests with it. Call HealthChanged when it changes.
	Health func() error
	// Card describes the served model: Model, HashVersion, BlockSize, Salt, KVBlocks,
	// ContextLen, Role (default "both") and the tokenizer. Version, Node and Addr are set by
	// the worker.
	Card cluster.ModelCard
	// Node is the worker's name in the cluster (default: host name and ORPC port).
	Node string
	// Routers are the routers' ORPC addresses (--join, repeatable).
	Routers []string
	// Token is the join token; the identity it earns is kept in StateDir.
	Token    string
	StateDir string
	// Identity, if set, is used instead of joining (tests, or a pre-provisioned node).
	Identity *orpc.Identity
	// Listen is the ORPC address to serve on (host:port; port 0 picks a free one).
	Listen string
	// Advertise is the address routers dial; default Listen's, and an unspecified host
	// (0.0.0.0, ::, "") means "the address the worker connects to the router from".
	Advertise string
	// EventBuffer is the KV event subscription buffer per router (default 4096).
	EventBuffer int
	// EventInterval is the least time between two KV event batches sent to a router
	// (default DefaultEventInterval; negative: each batch as soon as its events come). A
	// load report sends the events waiting before it, and so do a sequence's first token
	// (its prompt's blocks) and its end.
	EventInterval time.Duration
	// KVHold is the longest prefilled blocks wait for a decode worker's pull (default
	// DefaultKVHold; a router may ask for less); KVPullTimeout bounds a pull (default DefaultKVPullTimeout); KVMetrics,
	// if set, counts transfers (kvtransfer.go).
	KVHold        time.Duration
	KVPullTimeout time.Duration
	KVSendRate    float64 // bytes per second a KV pull is served at (0: unlimited)
	KVMetrics     *metrics.KVTransfer
	// Metrics, if set, counts the requests canceled because their router was lost.
	Metrics *metrics.Worker
	Logger  *slog.Logger
	Options []orpc.Option // for the ORPC server and clients

	// Weights, if set, serves Worker.PullWeights: a new engine of the same model takes
	// its prepared weights from this one (weights.go), at most WeightsSendRate bytes per
	// second over all its pulls (0: unlimited); WeightsMetrics, if set, counts them.
	Weights         WeightSource
	WeightsSendRate float64
	WeightsMetrics  *metrics.WeightsTransfer

	// KVTransferTime is the modelled time to move n bytes of KV (the sim backend's
	// sim.Timing.Transfer): a pull of modelled blocks (engine.KVFormat.Modelled) sends no
	// payload and is paced to it instead. nil: such pulls take no modelled time.
	KVTransferTime func(n int64) time.Duration
}

// Worker is an engine's cluster membership.
type Worker struct {
	cfg  Config
	log  *slog.Logger
	id   *orpc.Identity
	addr string // actual ORPC listen address

	// Before Run: the join token, the identity found in the state directory, or why the
	// one there is not used (with a token, the worker then joins again).
	tok    orpc.Token
	stored *orpc.Identity
	stale  error

	ready chan struct{}

	waiting  atomic.Int64 // accepted, no first token yet
	running  atomic.Int64 // decoding
	prefillT atomic.Int64 // prompt tokens of waiting requests

	mu        sync.Mutex
	connected map[string]uint64 // router → worker id there

	regs     registrations
	kvx      kvXfer       // clients to other workers, for KV pulls
	pullCost atomic.Int64 // measured µs per block of a KV pull from a peer (0: none yet)
	wsrv     weightsServer

	drain   drain              // drain.go
	stopRun context.CancelFunc // ends Run (Shutdown); guarded by mu
	shut    bool               // Shutdown began: a Run starting later returns at once; guarded by mu
	srv     *orpc.Server       // set by Run; guarded by mu
	runDone chan struct{}      // closed when Run returns
}

// New checks cfg and returns a Worker; Run starts it. Without a join token it loads the
// identity stored in cfg.StateDir now, so that a missing, damaged or expired one is an
// error at once, naming the file.
func New(cfg Config) (*Worker, error) {
	switch {
	case cfg.Engine == nil:
		return nil, errors.New("worker: no engine")
	case len(cfg.Routers) == 0:
		return nil, errors.New("worker: no router to join")
	case len(slices.Compact(slices.Sorted(slices.Values(cfg.Routers)))) < len(cfg.Routers):
		// Two sessions with one router would register the worker twice, and its place
		// among the routers (shares) would count the address once.
		return nil, fmt.Errorf("worker: a router address is given twice (--join): %s", strings.Join(cfg.Routers, ", "))
	case cfg.Identity == nil && cfg.StateDir == "":
		return nil, errors.New("worker: joining a router needs a state directory (--state-dir) to keep its identity in")
	case cfg.Card.Model == "" || cfg.Card.BlockSize <= 0:
		return nil, errors.New("worker: the model card needs a model name and a block size")
	case cfg.Identity != nil && cfg.Node != "" && cfg.Identity.Name != cfg.Node:
		return nil, fmt.Errorf("worker: the identity given is node %q's, not %q's", cfg.Identity.Name, cfg.Node)
	}
	if cfg.Card.Role == "" {
		cfg.Card.Role = cluster.RoleBoth
	}
	if ke, ok := cfg.Engine.(KVEngine); ok && cfg.Card.KVFormat == "" {
		// The card names the blocks' format, so that the router pairs a decode worker only
		// with prefill workers whose blocks it can import (kvcache.BlockFormat.Check); an
		// engine that cannot export blocks names none.
		if f, err := ke.KVFormat(); err == nil {
			cfg.Card.KVFormat = f.String()
		}
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 4096
	}
	if cfg.EventInterval == 0 {
		cfg.EventInterval = DefaultEventInterval
	}
	if cfg.KVHold <= 0 {
		cfg.KVHold = DefaultKVHold
	}
	if cfg.KVPullTimeout <= 0 {
		cfg.KVPullTimeout = DefaultKVPullTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	w := &Worker{cfg: cfg, log: log.With("component", "worker"), ready: make(chan struct{}), connected: map[string]uint64{},
		runDone: make(chan struct{})}
	w.drain.init()
	if cfg.Identity == nil {
		if err := w.loadIdentity(); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// loadIdentity loads the identity stored in the state directory, if it is this node's.
// With a join token, one that is missing or unusable only means joining again (stale says
// why, for the log); without one it is an error.
func (w *Worker) loadIdentity() error {
	if w.cfg.Token != "" {
		tok, err := orpc.ParseToken(w.cfg.Token)
		if err != nil {
			return fmt.Errorf("worker: --join-token: %w", err)
		}
		w.tok = tok
	}
	certPath := filepath.Join(w.cfg.StateDir, orpc.NodeCertFile)
	id, err := orpc.LoadIdentity(w.cfg.StateDir)
	switch {
	case err == nil && w.cfg.Node != "" && id.Name != w.cfg.Node:
		if w.cfg.Token == "" {
			return fmt.Errorf("worker: %s is the identity of node %q, not %q: start with --node-name %s (or none), "+
				"or give --join-token to join as %s", certPath, id.Name, w.cfg.Node, id.Name, w.cfg.Node)
		}
		w.stale = fmt.Errorf("%s is the identity of node %q, not %q", certPath, id.Name, w.cfg.Node)
	case err == nil:
		w.stored = id
	case w.cfg.Token != "":
		w.stale = err
	case errors.Is(err, orpc.ErrNoIdentity):
		return fmt.Errorf("worker: joining a router needs a join token (--join-token): %s holds no identity from an earlier join (%w)", w.cfg.StateDir, err)
	default:
		return fmt.Errorf("worker: the identity in %s does not load, and without a join token (--join-token) this node cannot join again: %w", w.cfg.StateDir, err)
	}
	return nil
}

// Ready is closed once the worker serves ORPC (after joining).
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Addr is the ORPC address the worker listens on (valid after Ready).
func (w *Worker) Addr() string { return w.addr }

// Connected returns the routers the worker is registered with now.
func (w *Worker) Connected() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for r := range w.connected {
		out = append(out, r)
	}
	return out
}

// backoff doubles from 100 ms to 5 s.
type backoff struct{ d time.Duration }

func (b *backoff) next() time.Duration {
	if b.d == 0 {
		b.d = 100 * time.Millisecond
	} else {
		b.d = min(2*b.d, 5*time.Second)
	}
	return b.d
}

func (b *backoff) reset() { b.d = 0 }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Run joins the cluster (retrying until a router answers), serves ORPC and keeps a
// registration with every router until ctx is done. It returns ctx's error, or the error
// that made it impossible to go on (a join token refused, a port taken).
func (w *Worker) Run(ctx context.Context) error {
	defer close(w.runDone)
	outer := ctx
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	w.mu.Lock()
	if w.shut {
		// A signal during start-up: the node shut down before this ran.
		w.mu.Unlock()
		return nil
	}
	w.stopRun = stop
	w.mu.Unlock()
	pc, err := net.ListenPacket("udp", w.cfg.Listen)
	if err != nil {
		return fmt.Errorf("worker: ORPC listen %s: %w", w.cfg.Listen, err)
	}
	defer pc.Close()
	w.addr = pc.LocalAddr().String()
	// A node's name is the one in its certificate: the router refuses any other.
	node := w.cfg.Node
	switch {
	case w.cfg.Identity != nil:
		node = w.cfg.Identity.Name
	case w.stored != nil:
		node = w.stored.Name
	case node == "":
		h, _ := os.Hostname()
		if h == "" {
			h = "worker"
		}
		_, port, _ := net.SplitHostPort(w.addr)
		node = h + "-" + port
	}
	w.cfg.Card.Node = node
	w.cfg.Card.Version = cluster.Version
	adv := w.cfg.Advertise
	if adv == "" {
		adv = w.addr
	}
	w.cfg.Card.Addr = adv

	id, err := w.identity(ctx, node)
	if err != nil {
		if ctx.Err() != nil && outer.Err() == nil {
			return nil // Shutdown while joining
		}
		return err
	}
	w.id = id
	opts := append([]orpc.Option{orpc.WithLogger(w.log), orpc.WithAgent("tandem-worker " + node)}, w.cfg.Options...)
	srv := orpc.NewServer(opts...)
	orpc.ServerStream(srv, cluster.MethodGenerate, w.generate)
	orpc.ServerStream(srv, cluster.MethodPublish, w.publish)
	orpc.Unary(srv, cluster.MethodSnapshot, w.snapshot)
	w.registerKV(srv)
	w.registerWeights(srv)
	w.registerAdapters(srv)
	w.mu.Lock()
	w.srv = srv
	w.mu.Unlock()
	defer w.closePeers()
	l, err := srv.ListenPacket(pc, id.ServerTLS())
	if err != nil {
		return fmt.Errorf("worker: ORPC listen: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(ctx, l) }()
	w.log.Info("worker serving ORPC", "node", node, "addr", w.addr, "advertise", adv, "routers", w.cfg.Routers)
	close(w.ready)
	for _, r := range w.cfg.Routers {
		wg.Add(1)
		go func() { defer wg.Done(); w.link(ctx, r) }()
	}
	<-ctx.Done()
	l.Close()
	wg.Wait()
	return outer.Err() // nil after Shutdown
}

// identity returns the configured identity, or the one in the state directory, or joins a
// router for one as node (trying the routers in turn, with backoff, until one answers) and
// stores it. A refused token ends the attempt at once: retrying would not help.
func (w *Worker) identity(ctx context.Context, node string) (*orpc.Identity, error) {
	switch {
	case w.cfg.Identity != nil:
		return w.cfg.Identity, nil
	case w.stored != nil:
		w.log.Info("using the identity stored in the state directory", "node", node, "state_dir", w.cfg.StateDir,
			"expires", w.stored.Cert.NotAfter.Format(time.DateOnly))
		return w.stored, nil
	}
	if w.stale != nil && !errors.Is(w.stale, orpc.ErrNoIdentity) {
		w.log.Warn("the identity in the state directory is not usable; joining the cluster again with the join token",
			"state_dir", w.cfg.StateDir, "reason", w.stale)
	}
	host, _, _ := net.SplitHostPort(w.addr)
	var hosts []string
	if host != "" && !net.ParseIP(host).IsUnspecified() {
		hosts = []string{host}
	}
	var b backoff
	for {
		for _, r := range w.cfg.Routers {
			id, err := orpc.Join(ctx, r, w.tok, node, hosts, w.cfg.Options...)
			if err == nil {
				if err := id.Save(w.cfg.StateDir); err != nil {
					return nil, fmt.Errorf("worker: storing the identity earned by joining: %w", err)
				}
				w.log.Info("joined the cluster", "router", r, "node", node, "state_dir", w.cfg.StateDir)
				return id, nil
			}
			if errors.Is(err, orpc.ErrJoinTokenRejected) {
				return nil, fmt.Errorf("worker: %w", err)
			}
			w.log.Warn("join failed; retrying", "router", r, "err", err)
		}
		if !sleep(ctx, b.next()) {
			return nil, ctx.Err()
		}
	}
}

// link keeps a registration with router addr until ctx is done, reconnecting with backoff.
// A refusal (the card disagrees with the model's, the name is another live node's) is
// retried every refusalRetry, and logged once until it changes or a registration succeeds.
func (w *Worker) link(ctx context.Context, addr string) {
	var b backoff
	refused := ""
	for ctx.Err() == nil {
		registered, err := w.session(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		if registered {
			b.reset()
			refused = ""
		}
		d := b.next()
		switch {
		case isRefusal(err):
			d = refusalRetry
			if msg := err.Error(); msg != refused {
				refused = msg
				w.log.Error("router refused this worker; retrying every "+refusalRetry.String(), "router", addr, "err", err)
			} else {
				w.log.Debug("router refused this worker again", "router", addr, "err", err)
			}
		default:
			w.log.Warn("router connection lost; reconnecting", "router", addr, "err", err, "in", d)
		}
		if !sleep(ctx, d) {
			return
		}
	}
}

// refusalRetry is how often a worker a router refused registers again: a refusal holds
// until an operator acts or the other node with its name goes away.
const refusalRetry = 5 * time.Second

// DefaultEventInterval is Config.EventInterval's default (tandem serve --kv-event-interval).
const DefaultEventInterval = 200 * time.Millisecond

// A gapTimer lets a kind of message go at most once per some gap: hold says whether one must
// wait, and arms timer for the moment it may go (once: armed until the caller takes the
// timer's tick and clears it).
type gapTimer struct {
	timer *time.Timer
	armed bool
	last  time.Time // of the last one sent (zero: none yet)
}

func newGapTimer() *gapTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &gapTimer{timer: t}
}

func (p *gapTimer) stop() { p.timer.Stop() }
func (p *gapTimer) sent() { p.last = time.Now() }

// hold reports whether a message must wait for gap after the last one, arming the timer if
// it is not already.
func (p *gapTimer) hold(gap time.Duration) bool {
	if p.armed {
		return true
	}
	wait := gap - time.Since(p.last)
	if wait <= 0 {
		return false
	}
	p.timer.Reset(wait)
	p.armed = true
	return true
}

// maxEventBatch is the most KV events one batch carries: more are sent at once.
const maxEventBatch = 1024

// drainEvents appends to b the events ch holds now, up to maxEventBatch in all.
func drainEvents(ch <-chan kvcache.Event, b *cluster.KVEvents) {
	for len(b.Events) < maxEventBatch {
		select {
		case ev, ok := <-ch:
			if !ok {
				return // the caller's receive sees the end
			}
			b.Events = append(b.Events, ev)
		default:
			return
		}
	}
}

// isRefusal reports whether err is a router's verdict on the registration rather than a
// failure to reach it.
func isRefusal(err error) bool {
	return errors.Is(err, orpc.ErrFailedPrecondition) || errors.Is(err, orpc.ErrAlreadyExists) || errors.Is(err, orpc.ErrPermissionDenied)
}

// routerPlace is where addr stands among the routers (sorted; each once, as New checks):
// index of n, or 0 of 0 with fewer than two. Every worker given the same --join addresses
// tells each router the same place, from which the routers split their ties
// (router.State.SetShare).
func routerPlace(routers []string, addr string) (index, n int) {
	sorted := slices.Sorted(slices.Values(routers))
	i, ok := slices.BinarySearch(sorted, addr)
	if !ok || len(sorted) < 2 {
		return 0, 0
	}
	return i, len(sorted)
}

// session registers with router addr and publishes heartbeats and KV events until the
// connection or the registration ends. registered reports whether it got that far.
func (w *Worker) session(ctx context.Context, addr string) (registered bool, err error) {
	opts := append([]orpc.Option{orpc.WithLogger(w.log), orpc.WithAgent("tandem-worker " + w.cfg.Card.Node)}, w.cfg.Options...)
	c, err := orpc.Dial(ctx, addr, w.id.ClientTLS(), opts...)
	if err != nil {
		return false, err
	}
	defer c.Close()
	// Subscribe before registering, so that the router's snapshot (taken after it accepts
	// us) plus the events from here on cover everything.
	events, cancelSub := w.cfg.Engine.Pool().Subscribe(w.cfg.EventBuffer)
	defer cancelSub()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	card := w.cfg.Card
	card.RouterIndex, card.Routers = routerPlace(w.cfg.Routers, addr)
	reg, err := c.Stream(sctx, cluster.MethodRegister, &card)
	if err != nil {
		return false, err
	}
	defer reg.Close()
	var reply cluster.RegisterReply
	if err := reg.RecvMsg(&reply); err != nil {
		return false, err
	}
	w.log.Info("registered with router", "router", addr, "router_name", reply.Router, "worker_id", reply.WorkerID)
	w.mu.Lock()
	w.connected[addr] = reply.WorkerID
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.connected, addr)
		w.mu.Unlock()
	}()
	regDone := make(chan error, 1)
	var heard atomic.Int64 // unix nanoseconds of the router's last message on the registration
	heard.Store(time.Now().UnixNano())
	go func() {
		var m cluster.RegisterReply
		for {
			if err := reg.RecvMsg(&m); err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("the router ended the registration")
				}
				regDone <- err
				return
			}
			heard.Store(time.Now().UnixNano()) // a beat (RegisterReply.BeatMs)
		}
	}()

	interval := time.Duration(reply.HeartbeatMs) * time.Millisecond
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	// A router silent for three times as long as it waits for our heartbeats is lost (a
	// router killed with SIGKILL says nothing): no beat on the registration stream for that
	// long and one beat more (see below), or a heartbeat or event batch call unanswered for
	// that long. (At the default timeouts QUIC's idle timeout on the router's connection to
	// us, which carries our reports, comes first: me.dropped, publish.go.) Three times, not
	// once: the router fails a lost worker's requests over to another, while a worker that
	// gives up on its router cancels them, so a router that is only slow for a moment (its
	// CPU taken by a burst of long prompts' JSON, a pause) must not make the fleet drop its
	// work: in a 100-replica Mooncake run on a loaded machine, with the router's own 1 s,
	// 99 replicas gave up their registrations at once.
	lossTimeout := 3 * time.Duration(reply.HeartbeatTimeoutMs) * time.Millisecond
	if lossTimeout <= 0 {
		lossTimeout = 3 * max(4*interval, time.Second)
	}
	// A router that beats repeats its reply every beat: the worker needs no call of its
	// own to know it alive. Silence is counted from the last beat, so the loss comes
	// between lossTimeout and lossTimeout + beat after the router's last word, as it did
	// when a probe call went every heartbeat timeout with lossTimeout to answer.
	beat := time.Duration(reply.BeatMs) * time.Millisecond

	me := w.regs.add(reply.DispatchKey)
	defer me.endPublisher() // the router's Worker.Publish call for this registration returns
	defer func() {
		if ctx.Err() != nil {
			w.regs.remove(me) // stopping: the server ends the calls, or lets them finish
			return
		}
		if m := w.cfg.Metrics; m != nil {
			m.RouterLosses.WithLabelValues(lossCause(err)).Inc() // link logs err
		}
		// The registration is over, and with it the router's interest in the requests it
		// sent: free their sequences now rather than compute for nobody.
		if n := w.regs.lose(me, fmt.Errorf("worker: lost the router at %s that sent this request: %w", addr, err)); n > 0 {
			if m := w.cfg.Metrics; m != nil {
				m.OrphansCanceled.Add(float64(n))
			}
			w.log.Warn("router lost; canceled the requests it had sent", "router", addr, "canceled", n, "err", err)
		}
	}()
	tracked := reply.DispatchKey != 0
	// Reports go on the router's Worker.Publish stream when it opened one (publish.go).
	// A router that does not beat gets one as a call too every probeEvery, whose answer
	// says it is alive (it takes the call for that alone: on the stream, reports keep
	// their order).
	probeEvery := lossTimeout / 3
	probing := beat <= 0
	if probing {
		if m := w.cfg.Metrics; m != nil {
			m.ProbedRegistrations.Inc()
		}
		w.log.Info("router does not beat (an older router); telling it alive by heartbeat calls", "router", addr, "every", probeEvery)
	}
	lastCall := time.Now()
	// A periodic report that says what the last one said is sent only every keepalive, a
	// half of the silence after which the router stops sending new requests
	// (suspectAfter in router/live); a router that does not say its timeout gets every one.
	keepalive := time.Duration(0)
	if reply.HeartbeatTimeoutMs > 0 {
		keepalive = min(4*interval, time.Duration(reply.HeartbeatTimeoutMs)*time.Millisecond/2) / 2
	}
	// KV events wait up to Config.EventInterval after the last batch sent, so that a
	// step's evictions and the next steps' stored blocks share a message (each is a
	// packet, an acknowledgement and a few wake-ups of the router): not while a request of
	// this router streams a message a token, whose packets carry the events of its steps
	// at no cost (orpc writes the messages of one moment in one pass). A report sends
	// what waits first, so that reports still follow the events they count (router/live
	// checkReport), and so do a sequence's first token (its prompt's blocks, which the
	// next request with the same prefix should find) and its end (its conversation's next
	// turn may come at once).
	batch := &cluster.KVEvents{WorkerID: reply.WorkerID}
	evPace := newGapTimer() // KV event batches, at most one per Config.EventInterval
	defer evPace.stop()
	sendEvents := func() error {
		if len(batch.Events) == 0 {
			return nil
		}
		defer func() { batch.Events = batch.Events[:0] }()
		evPace.sent()
		if publishOn(me, &cluster.Publication{Kind: cluster.PublishEvents, Events: *batch}) {
			return nil
		}
		if err := me.takeDropped(); err != nil {
			return err // as in report: no call to wait on
		}
		ectx, cancel := context.WithTimeout(sctx, lossTimeout)
		err := c.Call(ectx, cluster.MethodEvents, batch, &cluster.Ack{})
		cancel()
		if err != nil {
			return fmt.Errorf("sending KV events: %w", err)
		}
		lastCall = time.Now()
		return nil
	}
	var last cluster.LoadReport
	var lastAt time.Time
	report := func(periodic bool) error {
		r := w.loadReport(reply.WorkerID, me, tracked)
		now := time.Now()
		probe := probing && now.Sub(lastCall) >= probeEvery
		if periodic && r == last && now.Sub(lastAt) < keepalive && !probe {
			return nil // nothing changed, and the router heard from us lately
		}
		last, lastAt = r, now
		drainEvents(events, batch) // emitted before the report's figures were read
		if err := sendEvents(); err != nil {
			return err
		}
		if publishOn(me, &cluster.Publication{Kind: cluster.PublishReport, Report: r}) && !probe {
			return nil
		}
		if err := me.takeDropped(); err != nil {
			return err // the router's connection to us ended under the stream: no call to wait on
		}
		if err := w.heartbeat(sctx, c, &r, lossTimeout); err != nil {
			return err
		}
		lastCall = time.Now()
		return nil
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	gap := newGapTimer() // nudged reports, at most one per minReportGap
	defer gap.stop()
	gap.sent()
	if err := report(false); err != nil {
		return true, err
	}
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case err := <-regDone:
			return true, err
		case err := <-me.dropped:
			return true, err
		case <-c.Done():
			return true, c.Err()
		case ev, ok := <-events:
			if !ok {
				return true, errors.New("KV event subscription ended")
			}
			batch.Events = append(batch.Events, ev)
			drainEvents(events, batch)
			if len(batch.Events) < maxEventBatch && me.tokenStreams.Load() == 0 && evPace.hold(w.cfg.EventInterval) {
				break
			}
			if err := sendEvents(); err != nil {
				return true, err
			}
		case <-evPace.timer.C:
			evPace.armed = false
			if err := sendEvents(); err != nil {
				return true, err
			}
		case <-me.flush:
			// The finished sequence's last blocks may still be on their way from the
			// pool: take what the subscription holds too.
			drainEvents(events, batch)
			if err := sendEvents(); err != nil {
				return true, err
			}
		case <-tick.C:
			if silent := time.Since(time.Unix(0, heard.Load())); beat > 0 && silent > lossTimeout+beat {
				return true, fmt.Errorf("%w for %v (it beats every %v)", errNoBeats, silent.Round(time.Millisecond), beat)
			}
			if err := report(true); err != nil {
				return true, err
			}
			gap.sent()
		case <-me.nudge:
			if gap.hold(minReportGap) {
				break
			}
			if err := report(false); err != nil {
				return true, err
			}
			gap.sent()
		case <-gap.timer.C:
			gap.armed = false
			if err := report(false); err != nil {
				return true, err
			}
			gap.sent()
		}
	}
}

// lossCause is the cause label of metrics.Worker.RouterLosses for a session ended by err.
func lossCause(err error) string {
	switch {
	case errors.Is(err, errNoBeats):
		return "beats"
	case errors.Is(err, errRouterConnEnded):
		return "connection"
	}
	return "other"
}

// loadReport is the worker's load report now, for registration reg (worker id id there).
func (w *Worker) loadReport(id uint64, reg *registration, tracked bool) cluster.LoadReport {
	// Read it first: a dispatch recorded here is already in the engine's figures.
	received := reg.received.Load()
	r := w.Load()
	r.WorkerID = id
	r.Received, r.Tracked = received, tracked
	return r
}

// heartbeat sends r as a Router.Heartbeat call, answered within timeout.
func (w *Worker) heartbeat(ctx context.Context, c *orpc.Client, r *cluster.LoadReport, timeout time.Duration) error {
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.Call(hctx, cluster.MethodHeartbeat, r, &cluster.Ack{}); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// healthy reports whether the worker takes new requests: not draining, and its engine
// healthy (Config.Health).
func (w *Worker) healthy() bool {
	return !w.Draining() && (w.cfg.Health == nil || w.cfg.Health() == nil)
}

// HealthChanged tells every router the worker's health at once (a load report), instead
// of at the next heartbeat.
func (w *Worker) HealthChanged() { w.regs.nudgeAll() }

// Load returns the worker's load report now. With a StatsEngine it is the engine's
// scheduler census (sched.Census.Load, the function the simulator's workers report
// through too): running = decoding sequences, waiting = sequences without a first token
// (queued, in the inbox, or admitted and prefilling), prefill = the uncomputed prompt
// tokens of all of them (a queued prompt's less the prefix-cache hits its admission is
// expected to find), decode blocks = the blocks the admitted sequences hold, the pool's
// KV figures, and the last step's timing; and the step the census was taken after, which
// the router compares with the steps on its requests' first and last events. Otherwise
// running and waiting count the requests served over ORPC (and the report has no step).
// KV usage is the whole pool's either way.
func (w *Worker) Load() cluster.LoadReport {
	if se, ok := w.cfg.Engine.(StatsEngine); ok {
		st := se.Stats()
		l := st.Census.Load(w.cfg.Engine.Pool().Stats())
		l.Healthy = w.healthy()
		l.StepMicros = int(st.LastStep / time.Microsecond)
		l.StepTokens = st.LastStepTokens
		l.StepsOverTarget = st.StepsOverTarget
		l.Step = st.Step
		l.TierLoadMicros, l.BlockPrefillMicros = st.TierLoadMicros, st.BlockPrefillMicros
		l.PullMicros = int(w.pullCost.Load())
		if ae, ok := w.cfg.Engine.(adapterEngine); ok {
			l.Adapters = llm.AdapterList(ae.Adapters())
		}
		return cluster.LoadReport{Load: l}
	}
	st := w.cfg.Engine.Pool().Stats()
	return cluster.LoadReport{Load: llm.Load{
		Running:       int(w.running.Load()),
		Waiting:       int(w.waiting.Load()),
		PrefillTokens: int(w.prefillT.Load()),
		DecodeBlocks:  st.Used,
		KVUsage:       st.Usage(),
		KVBlocks:      st.Blocks,
		LastEventID:   st.LastEventID,
		CachedBlocks:  st.Held,
		Healthy:       w.healthy(),
	}}
}

// generate serves Worker.Generate: an Accepted event (or an Error event), then the tokens.
// The call's context is the sequence's: a caller that cancels frees it at once, and so does
// the loss of the router that sent it (registrations.bind).
func (w *Worker) generate(ctx context.Context, req *cluster.GenerateRequest, send func(*cluster.GenerateEvent) error) (err error) {
	ctx, admitted, err := w.admit(ctx)
	if err != nil {
		return err
	}
	defer admitted()
	ctx, done := w.regs.bind(ctx, req.DispatchKey, req.StreamInterval <= 1)
	defer done()
	if req.StreamInterval > 1 {
		b := &tokenBatcher{send: send, n: req.StreamInterval}
		send = b.sendEvent
		defer func() {
			if ferr := b.flush(); err == nil {
				err = ferr
			}
		}()
	}
	if req.Peer.Addr != "" {
		return w.generatePeer(ctx, req, send) // pull the prefix from a peer first (peerpull.go)
	}
	return w.generateBound(ctx, req, send)
}

// generateBound is generate for a request already bound to its router's registration.
func (w *Worker) generateBound(ctx context.Context, req *cluster.GenerateRequest, send func(*cluster.GenerateEvent) error) error {
	r := req.Request
	st, err := w.cfg.Engine.Generate(ctx, &r)
	w.regs.received(req.DispatchKey, req.DispatchSeq) // refused or not, the dispatch has arrived
	if err != nil {
		return send(cluster.ErrorEvent(err))
	}
	w.regs.nudgeOthers(req.DispatchKey)
	defer st.Close()
	n := int64(max(len(r.Prompt)-req.PredictedCached, 1))
	w.waiting.Add(1)
	w.prefillT.Add(n)
	first := true
	defer func() {
		if first {
			w.waiting.Add(-1)
			w.prefillT.Add(-n)
		} else {
			w.running.Add(-1)
		}
	}()
	if err := send(&cluster.GenerateEvent{Kind: cluster.EventAccepted}); err != nil {
		return err
	}
	ge := &cluster.GenerateEvent{Kind: cluster.EventToken}
	for {
		ev, err := st.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ev, cut := w.cutEvent(ctx); cut {
				return send(ev)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return send(cluster.ErrorEvent(err))
		}
		if first {
			// The prompt's blocks are stored: into the routers' indexes now, with the
			// first token's packet (Config.EventInterval holds the decode steps' events).
			w.regs.flushAll()
			first = false
			w.waiting.Add(-1)
			w.prefillT.Add(-n)
			w.running.Add(1)
		}
		ge.Event = ev
		if err := send(ge); err != nil {
			return err
		}
		if ev.Finish != "" {
			w.regs.flushAll()
			return nil
		}
	}
}

func (w *Worker) snapshot(ctx context.Context, _ *cluster.SnapshotRequest) (*cluster.Snapshot, error) {
	return &cluster.Snapshot{Snapshot: w.cfg.Engine.Pool().Snapshot()}, nil
}

// DefaultNode is a node name from the host name and a port.
func DefaultNode(port int) string {
	h, _ := os.Hostname()
	if h == "" {
		h = "worker"
	}
	return h + "-" + strconv.Itoa(port)
}
