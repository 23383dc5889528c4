package worker

// Peer pulls (docs/kv-tiers.md): a router that knows another worker holds a prompt's
// leading blocks, and that pulling them beats computing them, names that peer in the
// request (cluster.GenerateRequest.Peer). The worker pulls them from the peer's cache
// (Worker.PullKV, Cached) into its own, then generates as usual: its prefix match finds
// them. A pull that fails or falls short leaves the blocks that arrived intact (checked,
// committed) and the worker computes the rest, so the output is the same either way.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tandem/cluster"
	"tandem/engine"
)

// generatePeer serves a Worker.Generate that names a peer: Accepted at once, the pull,
// then generation as generateBound does it.
func (w *Worker) generatePeer(ctx context.Context, req *cluster.GenerateRequest, send func(*cluster.GenerateEvent) error) error {
	eng, ok := w.cfg.Engine.(KVEngine)
	if !ok {
		return w.generateBound(ctx, req, send)
	}
	if err := send(&cluster.GenerateEvent{Kind: cluster.EventAccepted}); err != nil {
		return err
	}
	bs := w.cfg.Card.BlockSize
	prompt := req.Prompt
	n := min(req.Peer.Blocks, (len(prompt)-1)/bs) // the last token is computed, for its logits
	var im *engine.Import
	if n > 0 {
		var err error
		if im, err = eng.BeginImport(prompt[:n*bs]); err != nil {
			w.peerPulled("failed")
			w.log.Debug("peer pull: no room for the blocks; computing them", "peer", req.Peer.Node, "err", err)
			im = nil
		} else {
			defer im.Release()
			if _, err := w.pullCached(ctx, &req.Peer, im); err != nil && ctx.Err() == nil {
				w.log.Warn("peer pull failed; computing the rest", "peer", req.Peer.Node, "err", err)
			}
		}
	}
	accepted := false
	return w.generateBound(ctx, req, func(ev *cluster.GenerateEvent) error {
		switch {
		case ev.Kind == cluster.EventAccepted && !accepted:
			accepted = true
			return nil // sent already
		case ev.Kind == cluster.EventToken && im != nil:
			im.Release() // admitted: the sequence holds the imported blocks now
		}
		return send(ev)
	})
}

// pullCached fetches into im the blocks it lacks from the peer's cache. It returns the
// number of blocks written; fewer than were missing is not an error (the peer's cache
// ended there), a broken stream or a bad block is.
func (w *Worker) pullCached(ctx context.Context, peer *cluster.KVPeer, im *engine.Import) (int, error) {
	missing := im.Missing()
	if len(missing) == 0 {
		w.peerPulled("none_missing")
		return 0, nil
	}
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, w.pullTimeout(peer.TimeoutMs))
	defer cancel()
	im.UseContext(pctx)
	fail := func(err error) (int, error) {
		im.Trim() // the blocks received intact are good: keep them; free the rest
		n := im.Written()
		if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			w.peerPulled("timeout")
		} else {
			w.peerPulled("failed")
		}
		return n, fmt.Errorf("%w: from peer %s after %d of %d blocks: %w", errTransfer, peer.Node, n, len(missing), err)
	}
	eng := w.kvEngine()
	f, err := eng.KVFormat()
	if err != nil {
		return fail(err)
	}
	c, err := w.peer(pctx, peer.Addr)
	if err != nil {
		return fail(err)
	}
	cs, err := c.Stream(pctx, cluster.MethodPullKV, &cluster.PullRequest{Layout: cluster.KVLayout(f), Hashes: missing, Cached: true})
	if err != nil {
		return fail(err)
	}
	defer cs.Close()
	if _, err := receiveBlocks(cs, im); err != nil {
		return fail(err)
	}
	im.Trim()
	n := im.Written()
	d := time.Since(t0)
	if n > 0 {
		w.notePullCost(d, n)
	}
	if m := w.met(); m != nil {
		m.Bytes.WithLabelValues("received").Add(float64(n * f.BlockBytes()))
		m.Blocks.WithLabelValues("received").Add(float64(n))
	}
	if n < len(missing) {
		w.peerPulled("partial")
	} else {
		w.peerPulled("ok")
	}
	w.log.Debug("pulled KV blocks from a peer's cache", "peer", peer.Node, "blocks", n, "of", len(missing), "had", im.Have(), "in", d)
	return n, nil
}

func (w *Worker) peerPulled(result string) {
	if m := w.met(); m != nil && m.PeerPulls != nil {
		m.PeerPulls.WithLabelValues(result).Inc()
	}
}

// pullCachedKV serves Worker.PullKV with Cached: the leading run of the wanted blocks
// that this engine's cache holds, each with its checksum.
func (w *Worker) pullCachedKV(ctx context.Context, f engine.KVFormat, req *cluster.PullRequest, send func(*cluster.KVBlock) error) error {
	eng := w.kvEngine()
	var blk cluster.KVBlock
	i, t0, sent := 0, time.Now(), 0
	_, err := eng.ExportCached(ctx, req.Hashes, func(hash uint64, data []byte) error {
		n := f.BlockBytes()
		if rate := w.cfg.KVSendRate; rate > 0 {
			if d := time.Duration(float64(sent)/rate*float64(time.Second)) - time.Since(t0); d > 0 && !sleep(ctx, d) {
				return ctx.Err()
			}
		}
		sent += n
		blk = cluster.KVBlock{Index: i, Hash: hash, CRC: cluster.BlockCRC(data), Data: data}
		i++
		if err := send(&blk); err != nil {
			return err
		}
		if m := w.met(); m != nil {
			m.Bytes.WithLabelValues("sent").Add(float64(n))
			m.Blocks.WithLabelValues("sent").Inc()
		}
		return nil
	})
	return err
}
