package live

import (
	"fmt"

	"tandem/router"
)

// Several routers that front the same workers split the workers' ties by shares
// (router.State.SetShare): each worker tells each router where that router stands among
// the routers the worker joins (ModelCard.RouterIndex of Routers, from its --join list), and
// the router follows the place most of its workers name. Workers with other --join lists
// may place it otherwise: those registrations are counted and logged, and the router keeps
// the majority's place; a router whose workers name no place (one router, or engines from
// before shares) has no share and breaks ties by its own seed alone.

// sharePlace is where a registration placed this router: index of n routers.
type sharePlace struct{ index, n int }

// countPlaceLocked adds (by +1) or removes (by −1) a registration's place and follows the
// place most registrations name. Called with l.mu held.
func (l *Router) countPlaceLocked(p sharePlace, node string, by int) {
	if p.n < 2 {
		return
	}
	l.places[p] += by
	if l.places[p] <= 0 {
		delete(l.places, p)
	}
	best, votes := sharePlace{}, 0
	for q, c := range l.places {
		// The most workers; among equals the fewest routers, then the lowest index, so that
		// the choice does not depend on the map's order.
		if c > votes || c == votes && (q.n < best.n || q.n == best.n && q.index < best.index) {
			best, votes = q, c
		}
	}
	if by > 0 && p != best {
		l.met.ShareDisagreements.Inc()
		if !l.placesLogged[p] {
			l.placesLogged[p] = true
			l.log.Warn("a worker places this router otherwise than most workers do (different --join lists?); following the majority",
				"worker", node, "its_place", fmt.Sprintf("%d of %d", p.index, p.n),
				"followed", fmt.Sprintf("%d of %d", best.index, best.n))
		}
	}
	if best != l.share {
		l.setShareLocked(best)
	}
}

// setShareLocked makes p this router's share in every model's State. Called with l.mu held.
func (l *Router) setShareLocked(p sharePlace) {
	l.share = p
	for _, m := range l.models {
		l.applyShare(m.state)
	}
	l.met.Share.Set(float64(p.index))
	l.met.Shares.Set(float64(p.n))
	if p.n >= 2 {
		l.log.Info("routing ties to this router's share of the workers first", "share", p.index, "routers", p.n)
	} else {
		l.log.Info("no other router named by the workers; ties by this router's seed alone")
	}
}

// applyShare gives a model's State the router's share. Called with l.mu held.
func (l *Router) applyShare(st *router.State) {
	// The cards' decoder refuses an index past the count, so SetShare cannot refuse a place.
	if err := st.SetShare(l.share.index, l.share.n); err != nil {
		l.log.Error("router share refused", "err", err)
	}
}

// Share returns the router's share of the workers and the number of routers the workers
// name (0 of 0: no share).
func (l *Router) Share() (share, routers int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.share.index, l.share.n
}
