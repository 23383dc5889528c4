package worker

// Disaggregated prefill and decode on the worker side (docs/disaggregation.md):
// Worker.Prefill and Worker.PullKV/ReleaseKV on a prefill worker, Worker.Decode on a decode
// worker, which pulls the blocks it lacks straight from the prefill worker over ORPC.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/llm"
	"tandem/metrics"
	"tandem/orpc"
)

// KVEngine is an Engine that can serve prefill-only requests and move KV blocks
// (tandem/engine.Engine does).
type KVEngine interface {
	Engine
	StartPrefill(ctx context.Context, req *llm.Request, ttl time.Duration) (h uint64, wait func() (*engine.PrefillResult, error), err error)
	ReleaseHeld(h uint64) bool
	ExportBlocks(ctx context.Context, h uint64, want []uint64, fn func(index int, hash uint64, data []byte) error) error
	BeginImport(prompt []int32) (*engine.Import, error)
	KVFormat() (engine.KVFormat, error)
	HeldStats() (held int, expired int64)
	ExportCached(ctx context.Context, want []uint64, fn func(hash uint64, data []byte) error) (int, error)
}

// Defaults of the disaggregation knobs.
const (
	DefaultKVHold        = 30 * time.Second // how long P keeps blocks nobody pulled
	DefaultKVPullTimeout = 30 * time.Second // how long D waits for a pull (which overlaps P's prefill)
)

// kvXfer is the worker's transfer state: clients to peers (other workers) by address, and
// the transfers this worker prefills, by transfer id.
type kvXfer struct {
	mu        sync.Mutex
	peers     map[string]*orpc.Client
	transfers map[uint64]*transfer
	refused   map[string]bool // the layout refusals logged (layoutRefused)
}

// A transfer is a prefill whose blocks peers may pull, by its transfer id (chosen by the
// router, so that a pull can be on its way before the prefill has started here).
type transfer struct {
	ready   chan struct{} // closed once handle is set (0: the prefill did not start)
	once    sync.Once
	handle  uint64 // the engine's hold
	created time.Time
	// released: a ReleaseKV came before the prefill did (the decode worker needed nothing,
	// or gave up); the prefill then holds nothing when it finishes.
	released atomic.Bool
}

func (tr *transfer) start(h uint64) {
	tr.once.Do(func() {
		tr.handle = h
		close(tr.ready)
	})
}

// pullGrace is how long a pull waits for a transfer id no prefill has announced yet: the
// router calls the prefill worker first, so the wait is short unless the prefill never comes.
const pullGrace = 2 * time.Second

// transferOf returns the transfer of id, creating it (not started) if create is set; it
// also forgets transfers far past any hold.
func (w *Worker) transferOf(id uint64, create bool) *transfer {
	w.kvx.mu.Lock()
	defer w.kvx.mu.Unlock()
	if w.kvx.transfers == nil {
		w.kvx.transfers = map[uint64]*transfer{}
	}
	tr := w.kvx.transfers[id]
	if tr == nil && create {
		now := time.Now()
		for k, old := range w.kvx.transfers {
			if now.Sub(old.created) > 2*w.cfg.KVHold+10*time.Minute {
				delete(w.kvx.transfers, k)
			}
		}
		tr = &transfer{ready: make(chan struct{}), created: now}
		w.kvx.transfers[id] = tr
	}
	return tr
}

func (w *Worker) dropTransfer(id uint64, tr *transfer) {
	w.kvx.mu.Lock()
	if w.kvx.transfers[id] == tr {
		delete(w.kvx.transfers, id)
	}
	w.kvx.mu.Unlock()
}

// registerKV adds the disaggregation methods to the worker's ORPC server when its engine
// can move KV blocks.
func (w *Worker) registerKV(srv *orpc.Server) {
	if _, ok := w.cfg.Engine.(KVEngine); !ok {
		return
	}
	orpc.Unary(srv, cluster.MethodPrefill, w.prefill)
	orpc.ServerStream(srv, cluster.MethodPullKV, w.pullKV)
	orpc.Unary(srv, cluster.MethodReleaseKV, w.releaseKV)
	orpc.ServerStream(srv, cluster.MethodDecode, w.decode)
}

func (w *Worker) kvEngine() KVEngine { return w.cfg.Engine.(KVEngine) }

func (w *Worker) met() *metrics.KVTransfer { return w.cfg.KVMetrics }

// prefill serves Worker.Prefill.
func (w *Worker) prefill(ctx context.Context, req *cluster.PrefillRequest) (*cluster.PrefillReply, error) {
	ctx, admitted, err := w.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer admitted()
	ctx, done := w.regs.bind(ctx, req.Generate.DispatchKey, false) // one answer, no stream
	defer done()
	eng := w.kvEngine()
	f, err := eng.KVFormat()
	if err != nil {
		return nil, orpc.Errorf(orpc.FailedPrecondition, "worker: cannot export KV: %v", err)
	}
	// The router asks for its hold; this worker's own bounds it (it is this worker's memory
	// that stays pinned, and its bookkeeping forgets transfers well past it).
	hold := time.Duration(req.HoldMs) * time.Millisecond
	if hold <= 0 || hold > w.cfg.KVHold {
		hold = w.cfg.KVHold
	}
	r := req.Generate.Request
	id := req.TransferID
	for id == 0 {
		id = rand.Uint64()
	}
	tr := w.transferOf(id, true)
	w.waiting.Add(1)
	w.prefillT.Add(int64(max(len(r.Prompt)-req.Generate.PredictedCached, 1)))
	h, wait, err := eng.StartPrefill(ctx, &r, hold)
	w.regs.received(req.Generate.DispatchKey, req.Generate.DispatchSeq) // as for Generate
	if err == nil {
		w.regs.nudgeOthers(req.Generate.DispatchKey)
	}
	tr.start(h) // pulls waiting for this transfer go ahead (or fail, if h is 0)
	var res *engine.PrefillResult
	if err == nil {
		res, err = wait()
	}
	w.waiting.Add(-1)
	w.prefillT.Add(-int64(max(len(r.Prompt)-req.Generate.PredictedCached, 1)))
	if err != nil {
		w.dropTransfer(id, tr)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return &cluster.PrefillReply{First: *cluster.ErrorEvent(err)}, nil
	}
	if m := w.met(); m != nil {
		m.Prefills.Inc()
	}
	w.regs.flushAll() // the prompt's blocks are stored: into the routers' indexes now (Config.EventInterval)
	first := res.First
	// The request ends here if a stop rule ended it or only one token was asked for; else
	// the prefill-only cap's "length" is not the request's finish.
	if first.Finish == llm.FinishStop || r.MaxTokens == 1 || res.Hashes == nil || tr.released.Load() {
		eng.ReleaseHeld(res.Handle)
		w.dropTransfer(id, tr)
		if first.Finish != llm.FinishStop && r.MaxTokens != 1 {
			// Pulled and released before the prefill finished: the request goes on elsewhere.
			first.Finish, first.Usage.CompletionTokens = "", 0
		}
		return &cluster.PrefillReply{First: cluster.GenerateEvent{Kind: cluster.EventToken, Event: first}, Layout: cluster.KVLayout(f)}, nil
	}
	first.Finish, first.Usage.CompletionTokens = "", 0
	return &cluster.PrefillReply{First: cluster.GenerateEvent{Kind: cluster.EventToken, Event: first}, Handle: id,
		Blocks: len(res.Hashes), Layout: cluster.KVLayout(f)}, nil
}

// pullKV serves Worker.PullKV: the wanted held blocks, each with its checksum.
func (w *Worker) pullKV(ctx context.Context, req *cluster.PullRequest, send func(*cluster.KVBlock) error) error {
	eng := w.kvEngine()
	f, err := eng.KVFormat()
	if err != nil {
		return orpc.Errorf(orpc.FailedPrecondition, "worker: cannot export KV: %v", err)
	}
	if err := f.Check(engine.KVFormat(req.Layout)); err != nil {
		return orpc.Errorf(orpc.FailedPrecondition, "worker %s: %v", w.cfg.Card.Node, err)
	}
	if req.Cached {
		return w.pullCachedKV(ctx, f, req, send) // a peer pull (peerpull.go)
	}
	tr := w.transferOf(req.Handle, true)
	grace := time.NewTimer(pullGrace)
	defer grace.Stop()
	select {
	case <-tr.ready:
	case <-grace.C:
		w.dropTransfer(req.Handle, tr)
		return orpc.Errorf(orpc.NotFound, "worker %s: no prefill for transfer %d", w.cfg.Card.Node, req.Handle)
	case <-ctx.Done():
		return ctx.Err()
	}
	if tr.handle == 0 {
		return orpc.Errorf(orpc.NotFound, "worker %s: the prefill of transfer %d did not start", w.cfg.Card.Node, req.Handle)
	}
	var blk cluster.KVBlock
	t0, sent := time.Now(), 0
	var link time.Time // modelled blocks: when the modelled link has moved the blocks sent so far
	err = eng.ExportBlocks(ctx, tr.handle, req.Hashes, func(i int, hash uint64, data []byte) error {
		n := f.BlockBytes() // a modelled block's bytes are counted and timed, not sent
		if rate := w.cfg.KVSendRate; rate > 0 {
			// Pace to the configured bandwidth: block i may leave once the bytes before it
			// have had their time.
			if d := time.Duration(float64(sent)/rate*float64(time.Second)) - time.Since(t0); d > 0 && !sleep(ctx, d) {
				return ctx.Err()
			}
		}
		if tt := w.cfg.KVTransferTime; f.Modelled() && tt != nil {
			// The modelled link moves one block at a time, from when it is ready or the
			// link is free, whichever is later; the block leaves when the model says it
			// has arrived. Back to back, the pull takes tt(all bytes) (set-up included once).
			now := time.Now()
			d := tt(int64(sent+n)) - tt(int64(sent))
			if link.IsZero() {
				d = tt(int64(n))
			}
			link = later(link, now).Add(d)
			if d := link.Sub(now); d > 0 && !sleep(ctx, d) {
				return ctx.Err()
			}
		}
		sent += n
		blk = cluster.KVBlock{Index: i, Hash: hash, CRC: cluster.BlockCRC(data), Data: data}
		if err := send(&blk); err != nil {
			return err
		}
		if m := w.met(); m != nil {
			m.Bytes.WithLabelValues("sent").Add(float64(n))
			m.Blocks.WithLabelValues("sent").Inc()
		}
		return nil
	})
	if errors.Is(err, engine.ErrNotHeld) {
		return orpc.Errorf(orpc.NotFound, "worker %s: %v", w.cfg.Card.Node, err)
	}
	return err
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// releaseKV serves Worker.ReleaseKV.
func (w *Worker) releaseKV(ctx context.Context, req *cluster.ReleaseRequest) (*cluster.ReleaseReply, error) {
	tr := w.transferOf(req.Handle, true) // a release may come first: it then marks the transfer
	tr.released.Store(true)
	select {
	case <-tr.ready:
		w.dropTransfer(req.Handle, tr)
		return &cluster.ReleaseReply{Released: tr.handle != 0 && w.kvEngine().ReleaseHeld(tr.handle)}, nil
	default:
		// Not started: the mark stays, and the prefill, when it comes, holds nothing.
		return &cluster.ReleaseReply{}, nil
	}
}

// peer returns a client to another worker at addr, dialling it (with this worker's cluster
// identity: the peer's server checks it like a router's) when there is none or it died.
func (w *Worker) peer(ctx context.Context, addr string) (*orpc.Client, error) {
	w.kvx.mu.Lock()
	if w.kvx.peers == nil {
		w.kvx.peers = map[string]*orpc.Client{}
	}
	c := w.kvx.peers[addr]
	w.kvx.mu.Unlock()
	if c != nil {
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	opts := append([]orpc.Option{orpc.WithLogger(w.log), orpc.WithAgent("tandem-worker " + w.cfg.Card.Node)}, w.cfg.Options...)
	nc, err := orpc.Dial(ctx, addr, w.id.ClientTLS(), opts...)
	if err != nil {
		return nil, err
	}
	w.kvx.mu.Lock()
	if old := w.kvx.peers[addr]; old != nil && old != c {
		select {
		case <-old.Done():
		default:
			w.kvx.mu.Unlock()
			nc.Close()
			return old, nil // another request dialled first
		}
	}
	w.kvx.peers[addr] = nc
	w.kvx.mu.Unlock()
	if c != nil {
		c.Close()
	}
	return nc, nil
}

func (w *Worker) closePeers() {
	w.kvx.mu.Lock()
	defer w.kvx.mu.Unlock()
	for _, c := range w.kvx.peers {
		c.Close()
	}
	w.kvx.peers = nil
}

// errTransfer marks a failed pull.
var errTransfer = errors.New("KV transfer failed")

// pull fetches into im the blocks it lacks from src, and asks src to free its copy however
// the pull ends. It returns the number of blocks written.
func (w *Worker) pull(ctx context.Context, src *cluster.KVSource, im *engine.Import) (n int, err error) {
	eng := w.kvEngine()
	m := w.met()
	missing := im.Missing()
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, w.pullTimeout(src.TimeoutMs))
	defer cancel()
	im.UseContext(pctx) // a pipeline's writes into its stages; every one is done when pull returns
	c, err := w.peer(pctx, src.Addr)
	if err != nil {
		return 0, w.pullFailed(pctx, fmt.Errorf("%w: dialling %s at %s: %w", errTransfer, src.Node, src.Addr, err))
	}
	// Whatever happens, tell P its copy is no longer wanted (P also frees it after its
	// hold timeout, should this not arrive). After a good pull P answers at once, and
	// waiting for it means P's copy is gone before D's first token; after a failed one P may
	// be dead, and the request should not wait on it.
	defer func() {
		if err == nil {
			releaseRemote(c, src.Handle)
		} else {
			go releaseRemote(c, src.Handle)
		}
	}()
	if len(missing) == 0 {
		if m != nil {
			m.Pulls.WithLabelValues("none_missing").Inc()
		}
		return 0, nil
	}
	f, err := eng.KVFormat()
	if err != nil {
		return 0, w.pullFailed(pctx, fmt.Errorf("%w: %w", errTransfer, err))
	}
	cs, err := c.Stream(pctx, cluster.MethodPullKV, &cluster.PullRequest{Handle: src.Handle, Layout: cluster.KVLayout(f), Hashes: missing})
	if err != nil {
		return 0, w.pullFailed(pctx, fmt.Errorf("%w: from %s: %w", errTransfer, src.Node, err))
	}
	defer cs.Close()
	received, err := receiveBlocks(cs, im)
	if err != nil {
		im.Trim() // the blocks received intact are good: keep them; free the rest
		n = im.Written()
		if received == 0 && orpc.CodeOf(err) == orpc.FailedPrecondition {
			return 0, w.layoutRefused(src.Node, f, err)
		}
		return n, w.pullFailed(pctx, fmt.Errorf("%w: from %s after %d of %d blocks: %w", errTransfer, src.Node, n, len(missing), err))
	}
	bytes := received * f.BlockBytes() // a modelled block has no payload: count what it stands for
	im.Commit()
	n = im.Written()
	if n != len(missing) {
		im.Trim()
		return n, w.pullFailed(pctx, fmt.Errorf("%w: %s sent %d of %d blocks", errTransfer, src.Node, n, len(missing)))
	}
	if d := time.Since(t0); n > 0 {
		w.notePullCost(d, n)
	}
	if m != nil {
		d := time.Since(t0)
		m.Pulls.WithLabelValues("ok").Inc()
		m.Bytes.WithLabelValues("received").Add(float64(bytes))
		m.Blocks.WithLabelValues("received").Add(float64(n))
		m.Latency.Observe(d.Seconds())
		if d > 0 {
			m.Throughput.Observe(float64(bytes) / d.Seconds())
		}
	}
	w.log.Debug("pulled KV blocks", "from", src.Node, "blocks", n, "had", im.Have(), "bytes", bytes, "in", time.Since(t0))
	return n, nil
}

// pullTimeout is how long a pull may take: the sender's timeoutMs where it gave one,
// else the configured KVPullTimeout.
func (w *Worker) pullTimeout(timeoutMs int) time.Duration {
	if d := time.Duration(timeoutMs) * time.Millisecond; d > 0 {
		return d
	}
	return w.cfg.KVPullTimeout
}

// receiveBlocks writes into im, in order, each block that cs carries until the stream
// ends, checking each block's checksum first. It returns the number of blocks received;
// a broken stream, a bad checksum or a block im refuses (or fails to store) ends it with
// that error.
func receiveBlocks(cs *orpc.ClientStream, im *engine.Import) (int, error) {
	var blk cluster.KVBlock
	for n := 0; ; n++ {
		err := cs.RecvMsg(&blk)
		if errors.Is(err, io.EOF) {
			return n, im.Flush() // the last batch, into a pipeline's stages
		}
		if err == nil {
			err = blk.Verify()
		}
		if err == nil {
			err = im.Write(blk.Hash, blk.Data)
		}
		if err != nil {
			return n, err
		}
	}
}

// notePullCost folds a good pull of n blocks in d into the measured cost per block that
// load reports carry (a moving average, weight 1/8), for the router's choice between
// pulling a prefix from a peer and computing it.
func (w *Worker) notePullCost(d time.Duration, n int) {
	x := max(d.Microseconds()/int64(n), 1)
	for {
		old := w.pullCost.Load()
		nv := x
		if old > 0 {
			nv = old + (x-old)/8
		}
		if w.pullCost.CompareAndSwap(old, nv) {
			return
		}
	}
}

// releaseRemote asks the holder of handle to free it, briefly and on a best-effort basis.
func releaseRemote(c *orpc.Client, handle uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.Call(ctx, cluster.MethodReleaseKV, &cluster.ReleaseRequest{Handle: handle}, &cluster.ReleaseReply{})
}

// errLayout marks a pull the holder refused before any block moved: the two engines'
// KV layouts differ (or the holder cannot export blocks at all), so they never exchange
// blocks, and the request's prompt is computed here.
var errLayout = errors.New("KV layouts differ")

// layoutRefused counts a pull refused for its layout (result layout_mismatch) and logs it
// once per message: the message names both layouts, and every request between the same
// two engines would repeat it.
func (w *Worker) layoutRefused(from string, ours engine.KVFormat, err error) error {
	if m := w.met(); m != nil {
		m.Pulls.WithLabelValues("layout_mismatch").Inc()
	}
	msg := orpc.StatusOf(err).Message
	w.kvx.mu.Lock()
	first := !w.kvx.refused[msg]
	if first {
		if w.kvx.refused == nil {
			w.kvx.refused = map[string]bool{}
		}
		w.kvx.refused[msg] = true
	}
	w.kvx.mu.Unlock()
	if first {
		w.log.Warn("KV transfer refused before any block moved: this engine and the prefill worker store KV differently, so prompts it prefills are prefilled here again (logged once per pair of layouts; counted in tandem:kv_transfer_pulls_total{result=\"layout_mismatch\"})",
			"from", from, "layout", ours.String(), "refusal", msg)
	}
	return fmt.Errorf("%w: %w: from %s: %w", errTransfer, errLayout, from, err)
}

func (w *Worker) pullFailed(ctx context.Context, err error) error {
	// The deadline shows in ctx, or first in the call's status (the holder saw it too).
	timeout := errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
	if m := w.met(); m != nil {
		if timeout {
			m.Pulls.WithLabelValues("timeout").Inc()
		} else {
			m.Pulls.WithLabelValues("failed").Inc()
		}
	}
	if timeout {
		err = fmt.Errorf("%w (deadline exceeded; transfer abandoned)", err)
	}
	return err
}

// decode serves Worker.Decode: Accepted at once, then the pull of the blocks this engine
// lacks, then generation as Worker.Generate does it. A failed pull falls back to computing
// the prompt here, unless the source is strict.
func (w *Worker) decode(ctx context.Context, req *cluster.DecodeRequest, send func(*cluster.GenerateEvent) error) error {
	ctx, admitted, err := w.admit(ctx)
	if err != nil {
		return err
	}
	defer admitted()
	ctx, done := w.regs.bind(ctx, req.Generate.DispatchKey, req.Generate.StreamInterval <= 1)
	defer done()
	eng := w.kvEngine()
	if err := send(&cluster.GenerateEvent{Kind: cluster.EventAccepted}); err != nil {
		return err
	}
	src := &req.Source
	prompt := req.Generate.Prompt
	im, err := eng.BeginImport(prompt[:src.PromptLen])
	if err == nil {
		defer im.Release()
		_, err = w.pull(ctx, src, im)
	} else {
		err = fmt.Errorf("%w: %w", errTransfer, err)
		if c, perr := w.peer(ctx, src.Addr); perr == nil {
			go releaseRemote(c, src.Handle) // no room here: P need not wait for its hold to expire
		}
	}
	if err != nil {
		if ev, cut := w.cutEvent(ctx); cut {
			return send(ev)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if src.Strict {
			return send(cluster.ErrorEvent(fmt.Errorf("%w: %w", llm.ErrUnavailable, err)))
		}
		if !errors.Is(err, errLayout) { // logged once by layoutRefused
			w.log.Warn("KV transfer failed; prefilling locally", "from", src.Node, "err", err)
		}
	}
	bs := w.cfg.Card.BlockSize
	accepted := false
	return w.generateBound(ctx, &req.Generate, func(ev *cluster.GenerateEvent) error {
		switch {
		case ev.Kind == cluster.EventAccepted && !accepted:
			accepted = true
			return nil // sent already
		case ev.Kind == cluster.EventToken && im != nil:
			im.Release() // admitted: the sequence holds the imported blocks now
			if ev.Event.Finish != "" {
				// Count as cached only what this worker held before the transfer.
				ev.Event.Usage.CachedTokens = min(ev.Event.Usage.CachedTokens, im.Have()*bs)
			}
		}
		return send(ev)
	})
}
