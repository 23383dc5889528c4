package operator

import (
	"cmp"
	"slices"
)

// replicaState is one replica (a gang of pods) of a pool as its pods show it.
type replicaState struct {
	Hash        string
	Index       int
	Pods        int  // members present and not terminating
	Ready       bool // every member present and ready
	Failed      bool // a member failed: the gang is broken
	Terminating bool // every present member is terminating
	DrainFirst  int  // the planner's rank among those to remove first (0: not chosen)
}

func (r replicaState) id() replicaID { return replicaID{r.Hash, r.Index} }

type replicaID struct {
	Hash  string
	Index int
}

// poolPlan is what one reconcile of a pool does.
type poolPlan struct {
	Create   []int       // indices of new replicas at the current hash
	Complete []replicaID // replicas missing members (the operator stopped halfway)
	Delete   []replicaID
}

// planPool brings a pool to desired replicas of gangs of size at hash: a rolling update
// with one replica of surge and none unavailable (an old replica goes only when a new
// one is ready), scale-down removing the planner's choices first, then unready ones,
// then the newest. It is pure: the caller lists the pods and carries the plan out.
func planPool(desired, size int, hash string, reps []replicaState) poolPlan {
	var p poolPlan
	var cur, old []replicaState
	used := map[int]bool{}
	for _, r := range reps {
		if r.Hash == hash {
			used[r.Index] = true
		}
		if r.Terminating {
			continue
		}
		if r.Failed {
			// All or nothing: a broken gang goes whole, and is made again.
			p.Delete = append(p.Delete, r.id())
			continue
		}
		if r.Pods < size && !r.Ready {
			p.Complete = append(p.Complete, r.id())
		}
		if r.Hash == hash {
			cur = append(cur, r)
		} else {
			old = append(old, r)
		}
	}

	// Scale down the current replicas past desired.
	if len(cur) > desired {
		sortVictims(cur)
		for _, r := range cur[:len(cur)-desired] {
			p.Delete = append(p.Delete, r.id())
		}
		cur = cur[len(cur)-desired:]
	}

	// Old replicas: unready ones serve nothing and go now; ready ones only while
	// enough others are ready.
	readyCur := 0
	for _, r := range cur {
		if r.Ready {
			readyCur++
		}
	}
	var readyOld []replicaState
	for _, r := range old {
		if r.Ready {
			readyOld = append(readyOld, r)
		} else {
			p.Delete = append(p.Delete, r.id())
		}
	}
	if extra := readyCur + len(readyOld) - desired; extra > 0 {
		sortVictims(readyOld)
		for _, r := range readyOld[:min(extra, len(readyOld))] {
			p.Delete = append(p.Delete, r.id())
		}
		readyOld = readyOld[min(extra, len(readyOld)):]
	}

	// New replicas: all that are missing when nothing old is left, else one at a time.
	limit := desired
	if len(readyOld) > 0 {
		limit = desired + 1 - len(readyOld)
	}
	for i := 0; len(cur)+len(p.Create) < min(desired, max(limit, len(cur))); i++ {
		if !used[i] {
			p.Create = append(p.Create, i)
			used[i] = true
		}
	}
	return p
}

// sortVictims orders replicas by how soon they should go: first those the planner
// named (in its order), then unready ones, then the newest (highest index).
func sortVictims(rs []replicaState) {
	slices.SortFunc(rs, func(a, b replicaState) int {
		ra, rb := a.DrainFirst, b.DrainFirst
		if ra == 0 {
			ra = 1 << 30
		}
		if rb == 0 {
			rb = 1 << 30
		}
		return cmp.Or(cmp.Compare(ra, rb), cmp.Compare(boolInt(a.Ready), boolInt(b.Ready)), cmp.Compare(b.Index, a.Index))
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
