package live

import (
	"bytes"
	"cmp"
	"context"
	"slices"

	"tandem/cluster"
	"tandem/orpc"
)

// weightPeers serves Router.WeightPeers: the registered workers whose card has the content
// hash asked, healthy ones first, then in the order they registered. A new engine asks
// before it registers itself (it has no weights to serve with yet), so a query rather than
// a field of RegisterReply.
func (l *Router) weightPeers(ctx context.Context, req *cluster.WeightPeersRequest) (*cluster.WeightPeers, error) {
	if len(req.ContentHash) == 0 {
		return nil, orpc.Errorf(orpc.InvalidArgument, "router: a weight peers query needs a content hash")
	}
	type peer struct {
		cluster.WeightPeer
		healthy bool
		id      uint64
	}
	var found []peer
	l.mu.Lock()
	for _, w := range l.workers {
		if !bytes.Equal(w.contentHash, req.ContentHash) {
			continue
		}
		st, ok := w.model.state.Worker(w.id)
		found = append(found, peer{WeightPeer: cluster.WeightPeer{Node: w.node, Addr: w.addr, Prepared: w.prepared},
			healthy: ok && st.Healthy, id: uint64(w.id)})
	}
	l.mu.Unlock()
	slices.SortFunc(found, func(a, b peer) int {
		if a.healthy != b.healthy {
			if a.healthy {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.id, b.id)
	})
	out := &cluster.WeightPeers{}
	for _, p := range found {
		out.Peers = append(out.Peers, p.WeightPeer)
	}
	caller := ""
	if p, ok := orpc.PeerFromContext(ctx); ok {
		caller = p.Name
	}
	l.log.Info("weight peers asked", "by", caller, "model", req.Model, "found", len(out.Peers))
	return out, nil
}
