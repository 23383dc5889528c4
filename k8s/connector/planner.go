package connector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"tandem/planner"
)

// ForPlanner adapts c to the planner's connector interface (planner.Connector), the one
// tandem-router --planner-connector kubernetes runs. The planner reads replicas without a
// context or an error: a read that fails returns the pool's last good list, and the
// failure is counted by onError (nil: none) and logged once until a read succeeds again.
// A scale the API server answers with a 4xx (forbidden, invalid, conflict) is refused
// (planner.ErrRefused), anything else failed.
func ForPlanner(c *Connector, log *slog.Logger, onError func(pool planner.Pool)) planner.Connector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &plannerConn{c: c, log: log, onError: onError, last: map[planner.Pool][]planner.Replica{}, failing: map[planner.Pool]bool{}}
}

type plannerConn struct {
	c       *Connector
	log     *slog.Logger
	onError func(pool planner.Pool)

	mu      sync.Mutex
	last    map[planner.Pool][]planner.Replica
	failing map[planner.Pool]bool
}

func (p *plannerConn) Replicas(pool planner.Pool) []planner.Replica {
	ctx, cancel := context.WithTimeout(context.Background(), p.c.cfg.Timeout)
	defer cancel()
	rs, err := p.c.Replicas(ctx, pool.String())
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.onError != nil {
			p.onError(pool)
		}
		if !p.failing[pool] {
			p.failing[pool] = true
			p.log.Warn("planner: cannot read the pool's replicas from the API server; the planner goes on with the last list read", "pool", pool.String(), "err", err)
		}
		return p.last[pool]
	}
	if p.failing[pool] {
		p.failing[pool] = false
		p.log.Info("planner: the pool's replicas are read again", "pool", pool.String())
	}
	out := make([]planner.Replica, len(rs))
	for i, r := range rs {
		out[i] = planner.Replica{Name: r.Name, Started: r.Started, Draining: r.Draining}
	}
	p.last[pool] = out
	return out
}

func (p *plannerConn) Scale(ctx context.Context, pool planner.Pool, n int, victims []string) error {
	err := p.c.Scale(ctx, pool.String(), n, victims)
	var se *StatusError
	if errors.As(err, &se) && se.Code >= 400 && se.Code < 500 && se.Code != http.StatusTooManyRequests {
		return fmt.Errorf("%w: %w", planner.ErrRefused, err)
	}
	return err
}
