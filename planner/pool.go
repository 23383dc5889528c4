package planner

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Pool is a pool of workers the planner sizes: the aggregated pool (workers of role both,
// which prefill and decode), or in a disaggregated deployment the prefill pool and the
// decode pool.
type Pool int

// The pools, named as the workers' roles are (cluster.RoleBoth, RolePrefill, RoleDecode).
const (
	Aggregated Pool = iota
	Prefill
	Decode
	NumPools = 3
)

var poolNames = [NumPools]string{"both", "prefill", "decode"}

func (p Pool) String() string {
	if p < 0 || p >= NumPools {
		return fmt.Sprintf("pool(%d)", int(p))
	}
	return poolNames[p]
}

// PoolOfRole returns the pool of workers of a role ("" is both).
func PoolOfRole(role string) (Pool, error) {
	switch role {
	case "", "both":
		return Aggregated, nil
	case "prefill":
		return Prefill, nil
	case "decode":
		return Decode, nil
	}
	return 0, fmt.Errorf("planner: unknown role %q (want both, prefill or decode)", role)
}

// Pools returns the pools of a deployment: the aggregated one, or prefill and decode.
func Pools(disaggregated bool) []Pool {
	if disaggregated {
		return []Pool{Prefill, Decode}
	}
	return []Pool{Aggregated}
}

// A Replica is one worker a connector runs.
type Replica struct {
	Name     string    // its node name in the cluster
	Started  time.Time // when the connector started it
	Draining bool      // asked to stop: it finishes its requests, then exits
}

// A Candidate is a worker that could leave its pool, as the router sees it.
type Candidate struct {
	Name     string
	Starting bool    // not serving yet (not registered): stopping it loses nothing
	Inflight int     // requests on it now
	Load     float64 // its predicted work, in KV blocks (prefill + decode)
	// Hits is the prompt tokens its prefix cache served recently: how much its cached
	// prefixes are wanted.
	Hits float64
}

// Victims returns the names of the n candidates that can leave most cheaply, in order:
// those still starting, then the fewest requests in flight (fewer to drain, none to
// migrate), the least predicted work, the least wanted cache, and the name.
func Victims(cands []Candidate, n int) []string {
	c := slices.Clone(cands)
	slices.SortFunc(c, func(a, b Candidate) int {
		if a.Starting != b.Starting {
			if a.Starting {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.Inflight, b.Inflight), cmp.Compare(a.Load, b.Load),
			cmp.Compare(a.Hits, b.Hits), cmp.Compare(a.Name, b.Name))
	})
	out := make([]string, 0, min(n, len(c)))
	for i := 0; i < n && i < len(c); i++ {
		out = append(out, c[i].Name)
	}
	return out
}
