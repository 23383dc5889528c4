package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"tandem/cluster"
	"tandem/hal"
	"tandem/internal/filehash"
	"tandem/metrics"
	"tandem/modelgen"
	"tandem/orpc"
	"tandem/packcache"
	"tandem/worker"
)

// Weights configures where a node's prepared weights come from (docs/architecture.md,
// "Fast cold start"): a pack cache, a peer, or the model file, in that order.
type Weights struct {
	// PackCache is a directory where the backend's prepared weights are kept (a file per
	// model), mapped in place at the next start instead of preparing them again ("": none).
	PackCache string
	// From are peers' ORPC addresses (engines serving the same model file) to pull the
	// prepared weights from, tried in order before the peers the routers know. A pull
	// needs the cluster identity, so a node pulls only as a cluster member (Cluster.Routers).
	From []string
	// NoPeers stops a cluster member from asking its routers for peers of its model.
	NoPeers bool
	// PullStreams is the concurrent streams of a pull (default worker.DefaultPullStreams).
	PullStreams int
	// SendRate caps the bytes per second this node serves pulls at, all pulls together
	// (0: unlimited): a pull takes the sender's cores from its requests while it runs.
	SendRate float64
	// Progress, if set, is told how far preparing or pulling the weights has got.
	Progress func(what string, done, total int64)
}

// StartupReport is how a node started: cluster.Startup (the weights' source and each
// phase's seconds, as the routers are told), and the details for the banner.
type StartupReport struct {
	cluster.Startup
	Total            time.Duration // from process start (Config.Started) to serving
	From             string        // the source in words: the file, the cache's path, the peer
	Packed, Imported int           // weights the backend packed and was given prepared, if it counts them
	Fallbacks        []string
}

// preparedCounter is a backend that counts the weights it prepared and was given (hal/cpu).
type preparedCounter interface{ PreparedCounts() (packed, imported int) }

// phase records one start-up phase's duration.
func (n *Node) phase(name string, d time.Duration) {
	n.startup.Phases = append(n.startup.Phases, cluster.Phase{Name: name, Seconds: d.Seconds()})
	n.startupMet.Seconds.WithLabelValues(name).Set(d.Seconds())
}

// fallback records a weights source given up, once: a log line and a count.
func (n *Node) fallback(source, reason string, err error) {
	n.startupMet.Fallbacks.WithLabelValues(source, reason).Inc()
	n.fallbacks = append(n.fallbacks, source+": "+reason)
	n.log.Warn("weights: not using "+source+"; trying the next source", "reason", reason, "err", err)
}

// prepareWeights makes the model's weights ready before the engine starts: from the pack
// cache if it holds them, else from a peer, else prepared from the model file (and then
// written to the pack cache, in the background). Nothing is used before it is complete
// and checked; every source given up is logged once and counted.
func (n *Node) prepareWeights(ctx context.Context) error {
	cfg, wc := n.cfg, n.cfg.Weights
	n.startupMet = metrics.NewStartup(n.reg)
	if pc, ok := cfg.Backend.(preparedCounter); ok {
		metrics.RegisterPrepared(n.reg, func() float64 { p, _ := pc.PreparedCounts(); return float64(p) },
			func() float64 { _, i := pc.PreparedCounts(); return float64(i) })
	}
	if cfg.OpenTime > 0 {
		n.phase("open", cfg.OpenTime)
	}
	if cfg.Sim != nil {
		n.startup.Weights, n.startupFrom = cluster.WeightsFile, "not read (sim backend)"
		return nil
	}
	porter, _ := cfg.Backend.(hal.WeightPorter)
	m := cfg.Model
	member := len(cfg.Cluster.Routers) > 0
	if porter != nil && (wc.PackCache != "" || len(wc.From) > 0 || member) {
		t := time.Now()
		sum, err := n.contentHash()
		if err != nil {
			return fmt.Errorf("node: the model's content hash: %w", err)
		}
		n.hash = sum
		n.phase("hash", time.Since(t))
	}
	ws := m.Matrices()
	var prepared []*hal.Weight
	if porter != nil {
		prepared = packcache.Prepared(porter, ws)
	}
	t := time.Now()
	var source, from string
	var cacheKey packcache.Key
	cachePath := ""
	if wc.PackCache != "" && len(prepared) == 0 {
		n.log.Info("weights: nothing for the pack cache: the backend prepares none of this model's weights", "backend", cfg.Backend.Name())
	}
	if wc.PackCache != "" && len(prepared) > 0 {
		if err := os.MkdirAll(wc.PackCache, 0o755); err != nil {
			return fmt.Errorf("node: --pack-cache: %w", err)
		}
		cachePath = packcache.Path(wc.PackCache, cfg.ModelPath)
		cacheKey = packcache.Key{Model: n.hash, Backend: porter.PreparedKey()}
		ld, err := packcache.Load(cachePath, cacheKey, porter, prepared, runtime.GOMAXPROCS(0))
		switch {
		case err == nil:
			source, from = cluster.WeightsPackCache, fmt.Sprintf("%s (%d weights, %s)", cachePath, ld.Weights, byteSize(ld.Bytes))
		case errors.Is(err, packcache.ErrAbsent):
			n.log.Info("weights: no pack cache yet; it is written once the weights are prepared", "path", cachePath)
		default:
			n.fallback("pack-cache", packcache.Describe(err), err)
		}
	}
	if source == "" && len(prepared) > 0 && (len(wc.From) > 0 || member && !wc.NoPeers) {
		source, from = n.fromPeers(ctx, porter, prepared)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	// The file: prepare what no source gave (all of it, or nothing), and read in the
	// matrices the backend computes from in place.
	var progress func(done, total int64)
	if wc.Progress != nil && source == "" {
		progress = func(done, total int64) { wc.Progress("preparing weights", done, total) }
	}
	m.Prefault(cfg.Backend, progress)
	if source == "" {
		source, from = cluster.WeightsFile, "the model file"
		if cfg.ModelPath != "" {
			from = cfg.ModelPath
		}
	}
	n.phase("weights", time.Since(t))
	n.startup.Weights, n.startupFrom = source, from
	n.startupMet.Source.WithLabelValues(source).Set(1)
	if pc, ok := cfg.Backend.(preparedCounter); ok {
		n.packed, n.imported = pc.PreparedCounts()
	}
	if porter != nil && !n.hash.IsZero() {
		n.weights = exportWeights(n.hash, porter, prepared)
	}
	if cachePath != "" && source != cluster.WeightsPackCache {
		n.saveCache(cachePath, cacheKey, porter, prepared)
	}
	return nil
}

// contentHash is the model's SHA-256, remembered in the pack cache's directory, else the
// state directory (filehash explains why a real content hash, and the memo's key).
func (n *Node) contentHash() (filehash.Sum, error) {
	if n.cfg.ModelPath == "" {
		data, err := modelgen.DemoGGUF()
		if err != nil {
			return filehash.Sum{}, err
		}
		return filehash.Bytes(data), nil
	}
	memo := n.cfg.Weights.PackCache
	if memo == "" {
		memo = n.cfg.Cluster.StateDir
	}
	r, err := filehash.Of(n.cfg.ModelPath, memo)
	if err != nil {
		return filehash.Sum{}, err
	}
	if r.Read > 0 {
		n.log.Info("weights: hashed the model file (once: the hash is remembered)", "sha256", r.Sum.String(), "bytes", r.Read, "memo", memo)
	}
	return r.Sum, nil
}

// saveCache writes the pack cache in the background: the engine serves meanwhile, and
// Shutdown waits for the write within its deadline, then cancels it (the next start
// writes it again).
func (n *Node) saveCache(path string, key packcache.Key, be hal.WeightPorter, ws []*hal.Weight) {
	ctx, cancel := context.WithCancel(context.Background())
	n.stopSave = cancel
	n.saveDone = make(chan struct{})
	go func() {
		defer close(n.saveDone)
		t := time.Now()
		size, err := packcache.Save(ctx, path, key, be, ws)
		switch {
		case err == nil:
			n.log.Info("weights: pack cache written", "path", path, "bytes", size, "took", time.Since(t).Round(time.Millisecond))
		case ctx.Err() != nil:
			n.log.Info("weights: pack cache not written: the node stopped first", "path", path)
		default:
			n.log.Error("weights: pack cache not written", "path", path, "err", err)
		}
	}()
}

// fromPeers pulls the prepared weights from the first peer that gives them all: those of
// Weights.From, then those the routers know of the same content hash. It returns the
// source and its description, or "" when no peer gave them.
func (n *Node) fromPeers(ctx context.Context, be hal.WeightPorter, ws []*hal.Weight) (source, from string) {
	cfg := n.cfg
	if len(cfg.Cluster.Routers) == 0 {
		n.fallback("peer", "not_a_member", errors.New("pulling weights needs the cluster identity: --weights-from goes with --join"))
		return "", ""
	}
	t := time.Now()
	id, err := n.clusterIdentity(ctx)
	n.phase("join", time.Since(t))
	if err != nil {
		n.fallback("peer", "no_identity", err)
		return "", ""
	}
	n.identity = id
	peers := make([]cluster.WeightPeer, 0, len(cfg.Weights.From))
	for _, a := range cfg.Weights.From {
		peers = append(peers, cluster.WeightPeer{Addr: a})
	}
	if !cfg.Weights.NoPeers {
		peers = append(peers, n.routerPeers(ctx, id, be.PreparedKey())...)
	}
	if len(peers) == 0 {
		n.log.Info("weights: no peer serves this model yet", "sha256", n.hash.String())
		return "", ""
	}
	want := make([]cluster.WantedWeight, len(ws))
	total := 0
	for i, w := range ws {
		format, size, _ := be.PreparedFormat(w)
		want[i] = cluster.WantedWeight{Name: w.Name, Format: format, Size: int64(size)}
		total += pageAlign(size)
	}
	tried := map[string]bool{}
	for _, p := range peers {
		if tried[p.Addr] {
			continue
		}
		tried[p.Addr] = true
		name, err := n.pullFrom(ctx, be, ws, want, total, p.Addr)
		if name != "" {
			p.Node = name
		}
		if err != nil {
			if ctx.Err() != nil {
				return "", ""
			}
			n.fallback("peer", peerReason(err), fmt.Errorf("%s: %w", peerName(p), err))
			continue
		}
		return cluster.WeightsPeer, peerName(p)
	}
	return "", ""
}

func peerName(p cluster.WeightPeer) string {
	if p.Node == "" {
		return p.Addr
	}
	return p.Addr + " (" + p.Node + ")"
}

// peerReason names a pull's failure for the fallback count.
func peerReason(err error) string {
	switch {
	case errors.Is(err, worker.ErrPeerOtherModel):
		return "other_model"
	case errors.Is(err, worker.ErrPeerRefused):
		return "refused"
	case errors.Is(err, worker.ErrPeerCorrupt):
		return "corrupt"
	default:
		return "died"
	}
}

func pageAlign(n int) int { return (n + 4095) &^ 4095 }

// pullFrom pulls ws's prepared forms from the peer at addr into memory of the backend's,
// and imports them once every one landed and checked; on any failure the memory is
// released and nothing is imported.
func (n *Node) pullFrom(ctx context.Context, be hal.WeightPorter, ws []*hal.Weight, want []cluster.WantedWeight, total int, addr string) (peer string, err error) {
	mem, release := be.AllocPrepared(total)
	dst := make([][]byte, len(want))
	off := 0
	var bytes int64
	for i, w := range want {
		dst[i] = mem[off : off+int(w.Size) : off+int(w.Size)]
		off += pageAlign(int(w.Size))
		bytes += w.Size
	}
	n.log.Info("weights: pulling from a peer", "peer", addr, "weights", len(want), "bytes", bytes)
	pc := worker.PullConfig{Addr: addr, Identity: n.identity, ContentHash: n.hash[:], Want: want, Dst: dst,
		Streams: n.cfg.Weights.PullStreams, Metrics: n.weightsMet(),
		Options: []orpc.Option{orpc.WithLogger(n.log), orpc.WithAgent("tandem-weights " + n.identity.Name)}}
	if p := n.cfg.Weights.Progress; p != nil {
		pc.Progress = func(landed int64) { p("pulling weights", landed, bytes) }
	}
	t := time.Now()
	peer, err = worker.PullWeights(ctx, pc)
	if err != nil {
		release()
		return peer, err
	}
	ps := make([]hal.Prepared, len(ws))
	for i := range ws {
		ps[i] = hal.Prepared{Format: want[i].Format, Data: dst[i]}
	}
	if err := be.ImportWeights(ws, ps, release); err != nil {
		release()
		return peer, fmt.Errorf("%w: %v", worker.ErrPeerRefused, err)
	}
	took := time.Since(t)
	n.log.Info("weights: pulled from a peer", "peer", addr, "node", peer, "bytes", bytes, "took", took.Round(time.Millisecond),
		"MB/s", int(float64(bytes)/took.Seconds()/1e6))
	return peer, nil
}

// weightsMet is the node's weights transfer metrics, registered once.
func (n *Node) weightsMet() *metrics.WeightsTransfer {
	if n.weightsTransfer == nil {
		n.weightsTransfer = metrics.NewWeightsTransfer(n.reg)
	}
	return n.weightsTransfer
}

// clusterIdentity returns the identity in the state directory, or joins a router with the
// token for one and stores it, as the worker would at its start: a pull comes before the
// worker (which needs the weights' engine) and needs the certificate.
func (n *Node) clusterIdentity(ctx context.Context) (*orpc.Identity, error) {
	cc := n.cfg.Cluster
	if cc.StateDir == "" {
		return nil, errors.New("no state directory to keep the cluster identity in")
	}
	id, err := orpc.LoadIdentity(cc.StateDir)
	if err == nil && (cc.NodeName == "" || id.Name == cc.NodeName) {
		return id, nil
	}
	if cc.Token == "" {
		if err == nil {
			err = fmt.Errorf("the stored identity is node %q's, not %q's", id.Name, cc.NodeName)
		}
		return nil, fmt.Errorf("no usable identity and no join token: %w", err)
	}
	tok, err := orpc.ParseToken(cc.Token)
	if err != nil {
		return nil, err
	}
	name := cc.NodeName
	if name == "" {
		// The worker would name itself after its ORPC port, which is not open yet.
		if cc.ORPCPort > 0 {
			name = worker.DefaultNode(cc.ORPCPort)
		} else {
			h, _ := os.Hostname()
			name = cmp.Or(h, "worker") + "-p" + strconv.Itoa(os.Getpid())
		}
	}
	var hosts []string
	if ip := net.ParseIP(cc.Host); cc.Host != "" && (ip == nil || !ip.IsUnspecified()) {
		hosts = []string{cc.Host}
	}
	var errs []error
	for _, r := range cc.Routers {
		jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		id, err := orpc.Join(jctx, r, tok, name, hosts, orpc.WithLogger(n.log))
		cancel()
		if err == nil {
			if err := id.Save(cc.StateDir); err != nil {
				return nil, fmt.Errorf("storing the identity earned by joining: %w", err)
			}
			n.log.Info("joined the cluster before pulling weights", "router", r, "node", name, "state_dir", cc.StateDir)
			return id, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", r, err))
	}
	return nil, errors.Join(errs...)
}

// routerPeers asks every router for the workers of this model's content hash: those of
// the backend's prepared-weights key first (the others are asked too: their formats may
// be this backend's for every weight, as F16's are on AVX2 and AVX-512).
func (n *Node) routerPeers(ctx context.Context, id *orpc.Identity, key string) []cluster.WeightPeer {
	var peers []cluster.WeightPeer
	for _, r := range n.cfg.Cluster.Routers {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := orpc.Dial(qctx, r, id.ClientTLS(), orpc.WithLogger(n.log))
		if err == nil {
			var reply cluster.WeightPeers
			err = c.Call(qctx, cluster.MethodWeightPeers, &cluster.WeightPeersRequest{Model: n.cfg.Name, ContentHash: n.hash[:]}, &reply)
			c.Close()
			peers = append(peers, reply.Peers...)
		}
		cancel()
		if err != nil {
			n.log.Warn("weights: could not ask a router for peers", "router", r, "err", err)
		}
	}
	slices.SortStableFunc(peers, func(a, b cluster.WeightPeer) int {
		return boolInt(a.Prepared != key) - boolInt(b.Prepared != key)
	})
	return peers
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// preparedWeights is what the node serves Worker.PullWeights from: every prepared form,
// exported once its weights were ready (before the engine runs, so serving a pull never
// prepares anything beside a forward pass).
type preparedWeights struct {
	hash  []byte
	forms map[string]hal.Prepared
}

func exportWeights(hash filehash.Sum, be hal.WeightPorter, ws []*hal.Weight) *preparedWeights {
	p := &preparedWeights{hash: hash[:], forms: make(map[string]hal.Prepared, len(ws))}
	for _, w := range ws {
		if f, ok := be.ExportWeight(w); ok {
			p.forms[w.Name] = f
		}
	}
	return p
}

func (p *preparedWeights) ContentHash() []byte { return p.hash }

func (p *preparedWeights) PreparedWeight(name string) (string, []byte, bool) {
	f, ok := p.forms[name]
	return f.Format, f.Data, ok
}

// Startup reports how the node started.
func (n *Node) Startup() StartupReport {
	return StartupReport{Startup: n.startup, Total: n.total, From: n.startupFrom, Packed: n.packed, Imported: n.imported, Fallbacks: n.fallbacks}
}

// byteSize formats a byte count.
func byteSize(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%d bytes", b)
	}
}

// serveWeights makes c (replica 0's worker) serve the node's prepared weights to peers and
// advertise its content hash in its card. (An identity a pull earned is in the state
// directory, where the worker loads it as it would any stored identity.)
func (n *Node) serveWeights(c *worker.Config) {
	if n.weights == nil {
		return
	}
	c.Card.ContentHash = n.hash[:]
	if p, ok := n.cfg.Backend.(hal.WeightPorter); ok {
		c.Card.Prepared = p.PreparedKey()
	}
	c.Weights, c.WeightsSendRate, c.WeightsMetrics = n.weights, n.cfg.Weights.SendRate, n.weightsMet()
}

// stopSaving cancels a pack cache write not done and waits for it.
func (n *Node) stopSaving() {
	if n.stopSave != nil {
		n.stopSave()
		<-n.saveDone
	}
}

// finishSaving waits for a pack cache write until ctx ends, then cancels it.
func (n *Node) finishSaving(ctx context.Context) {
	if n.stopSave == nil {
		return
	}
	select {
	case <-n.saveDone:
	case <-ctx.Done():
	}
	n.stopSaving()
}
