package worker

// Prepared weights from a peer (docs/orpc.md, "Weights from a peer"): a worker serves the
// prepared form of its model's weights (Worker.PullWeights) to a new engine of the same
// model, and PullWeights is the new engine's side, which writes them straight into place.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"tandem/cluster"
	"tandem/metrics"
	"tandem/orpc"
)

// WeightSource is what a worker serves Worker.PullWeights from: its model's content hash,
// and the prepared form of a weight by its name in the model file. Its forms must all be
// made already: serving one may not prepare it (that would run the backend beside the
// engine's forward passes).
type WeightSource interface {
	ContentHash() []byte
	PreparedWeight(name string) (format string, data []byte, ok bool)
}

// maxWeightStreams bounds the pull streams a worker serves at once: each one takes a core
// of the sender's for as long as it runs.
const maxWeightStreams = 16

// weightsServer is a worker's state for serving pulls.
type weightsServer struct {
	streams atomic.Int32
	pace    pacer
	mu      sync.Mutex
	crcs    map[string]*weightCRC // by weight name
}

type weightCRC struct {
	once sync.Once
	sum  uint32
}

// crc returns the CRC-32C of the named form, computed once.
func (s *weightsServer) crc(name string, data []byte) uint32 {
	s.mu.Lock()
	if s.crcs == nil {
		s.crcs = map[string]*weightCRC{}
	}
	c := s.crcs[name]
	if c == nil {
		c = &weightCRC{}
		s.crcs[name] = c
	}
	s.mu.Unlock()
	c.once.Do(func() { c.sum = cluster.WeightCRC(data) })
	return c.sum
}

// registerWeights adds Worker.PullWeights to the worker's ORPC server.
func (w *Worker) registerWeights(srv *orpc.Server) {
	w.wsrv.pace.rate = w.cfg.WeightsSendRate
	orpc.ServerStream(srv, cluster.MethodPullWeights, w.pullWeights)
}

// pullWeights serves Worker.PullWeights: this call's chunks of the wanted weights, in the
// order the request fixes, each with its weight's CRC.
func (w *Worker) pullWeights(ctx context.Context, req *cluster.WeightsRequest, send func(*cluster.WeightChunk) error) (err error) {
	m := w.cfg.WeightsMetrics
	result := "ok"
	defer func() {
		if m != nil {
			m.Streams.WithLabelValues(result).Inc()
		}
	}()
	refuse := func(code orpc.Code, format string, args ...any) error {
		result = "refused"
		err := orpc.Errorf(code, "worker %s: "+format, append([]any{w.cfg.Card.Node}, args...)...)
		w.log.Warn("refused a weights pull", "err", err)
		return err
	}
	src := w.cfg.Weights
	if src == nil {
		return refuse(orpc.FailedPrecondition, "this engine serves no prepared weights")
	}
	if have := src.ContentHash(); !bytes.Equal(have, req.ContentHash) {
		return refuse(orpc.NotFound, "this engine serves model %q of content hash %.12x…, not %.12x…", w.cfg.Card.Model, have, req.ContentHash)
	}
	forms := make([][]byte, len(req.Weights))
	crcs := make([]uint32, len(req.Weights))
	for i, want := range req.Weights {
		format, data, ok := src.PreparedWeight(want.Name)
		switch {
		case !ok:
			return refuse(orpc.FailedPrecondition, "weight %s has no prepared form here", want.Name)
		case format != want.Format || int64(len(data)) != want.Size:
			return refuse(orpc.FailedPrecondition, "weight %s is %s (%d bytes) here, the puller computes with %s (%d bytes)",
				want.Name, format, len(data), want.Format, want.Size)
		}
		forms[i] = data
	}
	if w.wsrv.streams.Add(1) > maxWeightStreams {
		w.wsrv.streams.Add(-1)
		return refuse(orpc.ResourceExhausted, "serving %d weights pull streams already", maxWeightStreams)
	}
	defer w.wsrv.streams.Add(-1)
	if m != nil {
		m.Sending.Inc()
		defer m.Sending.Dec()
	}
	for i, want := range req.Weights {
		crcs[i] = w.wsrv.crc(want.Name, forms[i])
	}
	chunk := &cluster.WeightChunk{}
	for c := range req.StreamChunks() {
		if err := w.wsrv.pace.wait(ctx, c.N); err != nil {
			result = "failed"
			return err
		}
		chunk.Weight, chunk.Offset, chunk.CRC = c.Weight, c.Off, crcs[c.Weight]
		chunk.Data = forms[c.Weight][c.Off : c.Off+c.N]
		if err := send(chunk); err != nil {
			result = "failed"
			return err
		}
		if m != nil {
			m.Bytes.WithLabelValues("sent").Add(float64(c.N))
		}
	}
	return nil
}

// pacer spaces the chunks of all the streams a worker serves to rate bytes per second
// (0: no limit), so that a pull takes a bounded share of the sender's time.
type pacer struct {
	rate float64
	mu   sync.Mutex
	next time.Time
}

func (p *pacer) wait(ctx context.Context, n int64) error {
	if p.rate <= 0 {
		return ctx.Err()
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	at := p.next
	p.next = p.next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	p.mu.Unlock()
	if d := time.Until(at); d > 0 && !sleep(ctx, d) {
		return ctx.Err()
	}
	return ctx.Err()
}

// Why a pull failed: PullWeights' errors wrap one of these.
var (
	// ErrPeerOtherModel: the peer's model has another content hash.
	ErrPeerOtherModel = errors.New("the peer serves another model")
	// ErrPeerRefused: the peer would not serve the pull (another prepared format, too
	// many pulls, no prepared weights).
	ErrPeerRefused = errors.New("the peer refused the pull")
	// ErrPeerCorrupt: a weight's bytes did not match its checksum, or a stream broke
	// the protocol.
	ErrPeerCorrupt = errors.New("the peer's weights did not check")
	// ErrPeerLost: the pull did not finish (the peer died, could not be reached, stalled).
	ErrPeerLost = errors.New("the pull did not finish")
)

// Defaults of PullConfig.
const (
	DefaultPullStreams = 4
	DefaultPullStall   = 30 * time.Second
)

// PullConfig says what to pull, from where, and into what.
type PullConfig struct {
	Addr        string // the peer's ORPC address
	Identity    *orpc.Identity
	ContentHash []byte // the puller's model's
	Want        []cluster.WantedWeight
	// Dst[i] receives Want[i]: Want[i].Size bytes, written in place.
	Dst [][]byte
	// Streams is how many calls run at once, each on a connection of its own, so that
	// the transfer is not bound to one connection's goroutines (default DefaultPullStreams).
	Streams    int
	ChunkBytes int           // default cluster.DefaultChunkBytes
	Stall      time.Duration // a stream silent this long fails the pull (default DefaultPullStall)
	Options    []orpc.Option
	Metrics    *metrics.WeightsTransfer
	// Progress, if set, is called with the bytes landed so far, from the streams'
	// goroutines.
	Progress func(landed int64)
}

// PullWeights pulls cfg.Want from the peer into cfg.Dst and checks every weight against
// its CRC-32C; peer is the peer's node name (its certificate's). It returns a nil error
// only once every byte has landed and every weight checked; otherwise Dst holds partial
// data the caller must not use, and the error wraps one of ErrPeerOtherModel,
// ErrPeerRefused, ErrPeerCorrupt or ErrPeerLost.
func PullWeights(ctx context.Context, cfg PullConfig) (peer string, err error) {
	if len(cfg.Dst) != len(cfg.Want) {
		return "", fmt.Errorf("worker: %d destinations for %d weights", len(cfg.Dst), len(cfg.Want))
	}
	for i, want := range cfg.Want {
		if int64(len(cfg.Dst[i])) != want.Size {
			return "", fmt.Errorf("worker: a destination of %d bytes for weight %s of %d", len(cfg.Dst[i]), want.Name, want.Size)
		}
	}
	if cfg.Streams <= 0 {
		cfg.Streams = DefaultPullStreams
	}
	cfg.Streams = min(cfg.Streams, cluster.MaxWeightStreams)
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = cluster.DefaultChunkBytes
	}
	if cfg.Stall <= 0 {
		cfg.Stall = DefaultPullStall
	}
	p := &pull{cfg: cfg, crcs: make([]uint32, len(cfg.Want)), crcSet: make([]bool, len(cfg.Want))}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Stream 0 goes first, alone, until its first chunk lands: a peer that refuses the
	// pull (another model, another format) refuses it once, not once per stream.
	var wg sync.WaitGroup
	p.accepted = make(chan struct{})
	wg.Go(func() {
		if err := p.stream(ctx, 0); err != nil {
			cancel(err)
		}
		p.accept()
	})
	select {
	case <-p.accepted:
	case <-ctx.Done():
	}
	for s := 1; s < cfg.Streams && ctx.Err() == nil; s++ {
		wg.Go(func() {
			if err := p.stream(ctx, s); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil { // a stream's error, or the caller's end
		return p.peer, classifyPull(err)
	}
	if bad := p.verify(); bad >= 0 {
		return p.peer, fmt.Errorf("%w: weight %s: its bytes do not match the CRC-32C %08x the peer sent", ErrPeerCorrupt, cfg.Want[bad].Name, p.crcs[bad])
	}
	return p.peer, nil
}

// classifyPull wraps a stream's error with its kind.
func classifyPull(err error) error {
	switch {
	case errors.Is(err, ErrPeerCorrupt), errors.Is(err, ErrPeerLost):
		return err
	case errors.Is(err, orpc.ErrNotFound):
		return fmt.Errorf("%w: %v", ErrPeerOtherModel, err)
	case errors.Is(err, orpc.ErrFailedPrecondition), errors.Is(err, orpc.ErrResourceExhausted), errors.Is(err, orpc.ErrUnimplemented),
		errors.Is(err, orpc.ErrPermissionDenied), errors.Is(err, orpc.ErrUnauthenticated), errors.Is(err, orpc.ErrInvalidArgument):
		return fmt.Errorf("%w: %v", ErrPeerRefused, err)
	default:
		return fmt.Errorf("%w: %v", ErrPeerLost, err)
	}
}

// pull is one PullWeights in progress.
type pull struct {
	cfg      PullConfig
	landed   atomic.Int64
	accepted chan struct{} // closed once stream 0 has a chunk, or ended
	once     sync.Once
	peer     string // the peer's name, from stream 0's connection
	mu       sync.Mutex
	crcs     []uint32 // each weight's CRC, as its first chunk gave it
	crcSet   []bool
}

// stream runs call s of the pull on a connection of its own.
func (p *pull) stream(ctx context.Context, s int) error {
	cfg := p.cfg
	c, err := orpc.Dial(ctx, cfg.Addr, cfg.Identity.ClientTLS(), cfg.Options...)
	if err != nil {
		return fmt.Errorf("%w: dialing %s: %v", ErrPeerLost, cfg.Addr, err)
	}
	defer c.Close()
	if s == 0 {
		p.peer = c.PeerName() // read once the streams ended
	}
	req := &cluster.WeightsRequest{ContentHash: cfg.ContentHash, Weights: cfg.Want, Stream: s, Streams: cfg.Streams, ChunkBytes: cfg.ChunkBytes}
	// A stream silent for Stall fails the pull (a peer alive but stuck keeps QUIC's
	// keepalives going, so the idle timeout alone would not end it).
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	watchdog := time.AfterFunc(cfg.Stall, func() {
		stop(fmt.Errorf("%w: stream %d of %s silent for %v", ErrPeerLost, s, cfg.Addr, cfg.Stall))
	})
	defer watchdog.Stop()
	cs, err := c.Stream(sctx, cluster.MethodPullWeights, req)
	if err != nil {
		return streamErr(sctx, err)
	}
	defer cs.Close()
	next, done := iter.Pull(req.StreamChunks())
	defer done()
	var chunk cluster.WeightChunk
	for {
		err := cs.RecvMsg(&chunk)
		if errors.Is(err, io.EOF) {
			if c, more := next(); more {
				return fmt.Errorf("%w: stream %d ended before bytes %d.. of weight %s", ErrPeerCorrupt, s, c.Off, cfg.Want[c.Weight].Name)
			}
			return nil
		}
		if err != nil {
			return streamErr(sctx, err)
		}
		watchdog.Reset(cfg.Stall)
		want, more := next()
		if !more || chunk.Weight != want.Weight || chunk.Offset != want.Off || int64(len(chunk.Data)) != want.N {
			return fmt.Errorf("%w: stream %d sent weight %d bytes %d+%d out of turn", ErrPeerCorrupt, s, chunk.Weight, chunk.Offset, len(chunk.Data))
		}
		if !p.crcAgrees(chunk.Weight, chunk.CRC) {
			return fmt.Errorf("%w: weight %s: two chunks with different checksums", ErrPeerCorrupt, cfg.Want[chunk.Weight].Name)
		}
		if s == 0 {
			p.accept()
		}
		copy(cfg.Dst[chunk.Weight][chunk.Offset:], chunk.Data)
		n := p.landed.Add(int64(len(chunk.Data)))
		if cfg.Metrics != nil {
			cfg.Metrics.Bytes.WithLabelValues("received").Add(float64(len(chunk.Data)))
		}
		if cfg.Progress != nil {
			cfg.Progress(n)
		}
	}
}

func (p *pull) accept() { p.once.Do(func() { close(p.accepted) }) }

// streamErr is a stream's error, or the cause its context was ended with.
func streamErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// crcAgrees records the CRC of weight i from its first chunk and reports whether a
// later chunk's agrees.
func (p *pull) crcAgrees(i int, crc uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.crcSet[i] {
		p.crcs[i], p.crcSet[i] = crc, true
	}
	return p.crcs[i] == crc
}

// verify checks every weight against its CRC on all cores and returns the index of one
// that fails, or -1.
func (p *pull) verify() int {
	var next atomic.Int64
	bad := atomic.Int64{}
	bad.Store(-1)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(p.cfg.Want) || bad.Load() >= 0 {
					return
				}
				if p.cfg.Want[i].Size > 0 && cluster.WeightCRC(p.cfg.Dst[i]) != p.crcs[i] {
					bad.Store(int64(i))
				}
			}
		})
	}
	wg.Wait()
	return int(bad.Load())
}
