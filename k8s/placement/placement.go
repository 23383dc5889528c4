// Package placement is the operator's gang placement, a pure core: given nodes with
// their labels and free resources, it puts all the pods of a gang on nodes, or none.
//
// A gang is packed by topology levels given narrowest first (a rack, then a zone): it
// goes into one domain of the first level that has room, domains tried tightest first so
// that big holes stay open for big gangs; inside a domain the hosts with the most room
// are filled first, so the gang spans as few hosts as it can. A level marked required
// stops the search there: the gang waits rather than spread wider.
package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Resources are amounts by name: CPU in millicores, memory in bytes, devices by count.
type Resources map[string]int64

// Node is a node as placement sees it.
type Node struct {
	Name   string
	Labels map[string]string
	Free   Resources // allocatable less what the pods bound to it request
}

// Level is a topology level: nodes with the same value of the label Key form a domain.
type Level struct {
	Key      string
	Required bool // all of a gang in one domain of this level, or wait
}

// Gang is the pods of one replica, all asking for the same resources.
type Gang struct {
	Size    int
	Request Resources
	Levels  []Level // narrowest first
}

// NoRoomError says why a gang waits.
type NoRoomError struct {
	Level string // the required level's key; "" when no set of nodes at all has room
	Size  int
}

func (e *NoRoomError) Error() string {
	if e.Level == "" {
		return fmt.Sprintf("placement: no room for a gang of %d pods on the cluster's nodes", e.Size)
	}
	return fmt.Sprintf("placement: no single %s has room for a gang of %d pods (required)", e.Level, e.Size)
}

// Place returns the node of each of the gang's pods, in member order, or a *NoRoomError.
// It does not change nodes.
func Place(nodes []Node, g Gang) ([]string, error) {
	if g.Size <= 0 {
		return nil, fmt.Errorf("placement: gang size %d", g.Size)
	}
	for _, lv := range g.Levels {
		domains := map[string][]Node{}
		for _, n := range nodes {
			if v, ok := n.Labels[lv.Key]; ok {
				domains[v] = append(domains[v], n)
			}
		}
		type fit struct {
			name string
			room int
		}
		var fits []fit
		for name, members := range domains {
			if room := capacity(members, g.Request, g.Size+1); room >= g.Size {
				fits = append(fits, fit{name, room})
			}
		}
		if len(fits) > 0 {
			best := slices.MinFunc(fits, func(a, b fit) int {
				return cmp.Or(cmp.Compare(a.room, b.room), strings.Compare(a.name, b.name))
			})
			return pack(domains[best.name], g), nil
		}
		if lv.Required {
			return nil, &NoRoomError{Level: lv.Key, Size: g.Size}
		}
	}
	if capacity(nodes, g.Request, g.Size) < g.Size {
		return nil, &NoRoomError{Size: g.Size}
	}
	return pack(nodes, g), nil
}

// fits returns how many pods asking for req fit in free, at most limit.
func fits(free, req Resources, limit int) int {
	n := limit
	for name, want := range req {
		if want <= 0 {
			continue
		}
		n = min(n, int(free[name]/want))
	}
	return max(n, 0)
}

// capacity is how many pods asking for req fit on nodes, counted up to limit.
func capacity(nodes []Node, req Resources, limit int) int {
	total := 0
	for _, n := range nodes {
		total += fits(n.Free, req, limit)
		if total >= limit {
			return limit
		}
	}
	return total
}

// pack fills the nodes with the most room first (ties by name); the caller checked
// that the gang fits.
func pack(nodes []Node, g Gang) []string {
	type slot struct {
		name string
		room int
	}
	slots := make([]slot, 0, len(nodes))
	for _, n := range nodes {
		if r := fits(n.Free, g.Request, g.Size); r > 0 {
			slots = append(slots, slot{n.Name, r})
		}
	}
	slices.SortFunc(slots, func(a, b slot) int {
		return cmp.Or(cmp.Compare(b.room, a.room), strings.Compare(a.name, b.name))
	})
	out := make([]string, 0, g.Size)
	for _, s := range slots {
		for i := 0; i < s.room && len(out) < g.Size; i++ {
			out = append(out, s.name)
		}
	}
	return out
}
