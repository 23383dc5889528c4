package placement

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// twelve is the cluster of the issue: 12 nodes, 4 per rack, racks a and b in zone 1 and
// rack c in zone 2, each node with room for one pod of one GPU; used lists nodes whose
// GPU is taken.
func twelve(used ...string) []Node {
	var nodes []Node
	for i := range 12 {
		rack := string(rune('a' + i/4))
		zone := "z1"
		if rack == "c" {
			zone = "z2"
		}
		name := fmt.Sprintf("n%02d", i)
		free := Resources{"gpu": 1, "cpu": 8000}
		if slices.Contains(used, name) {
			free["gpu"] = 0
		}
		nodes = append(nodes, Node{Name: name, Labels: map[string]string{"rack": rack, "zone": zone}, Free: free})
	}
	return nodes
}

func TestPlace(t *testing.T) {
	rackReq := []Level{{Key: "rack", Required: true}, {Key: "zone", Required: true}}
	rackPref := []Level{{Key: "rack"}, {Key: "zone", Required: true}}
	allPref := []Level{{Key: "rack"}, {Key: "zone"}}
	gpu := Resources{"gpu": 1, "cpu": 1000}
	tests := []struct {
		name    string
		nodes   []Node
		gang    Gang
		want    []string
		noRoom  string // the level whose NoRoomError is expected; "-" for none at all
		wantErr bool
	}{
		{name: "one rack has room", nodes: twelve(), gang: Gang{Size: 4, Request: gpu, Levels: rackReq},
			want: []string{"n00", "n01", "n02", "n03"}},
		{name: "the tightest rack that fits", nodes: twelve("n00", "n04", "n05"), gang: Gang{Size: 3, Request: gpu, Levels: rackReq},
			want: []string{"n01", "n02", "n03"}},
		{name: "rack a full goes to b", nodes: twelve("n00"), gang: Gang{Size: 4, Request: gpu, Levels: rackReq},
			want: []string{"n04", "n05", "n06", "n07"}},
		{name: "no rack has room, required: waits", nodes: twelve("n00", "n04", "n08"), gang: Gang{Size: 4, Request: gpu, Levels: rackReq},
			noRoom: "rack"},
		{name: "no rack has room, preferred: one zone", nodes: twelve("n00", "n04", "n08"), gang: Gang{Size: 4, Request: gpu, Levels: rackPref},
			want: []string{"n01", "n02", "n03", "n05"}},
		{name: "no zone has room, zone required: waits", nodes: twelve("n00", "n01", "n02", "n04", "n05", "n06", "n08"), gang: Gang{Size: 4, Request: gpu, Levels: rackPref},
			noRoom: "zone"},
		{name: "all preferred spreads across zones", nodes: twelve("n00", "n01", "n02", "n04", "n05", "n06", "n08"), gang: Gang{Size: 4, Request: gpu, Levels: allPref},
			want: []string{"n03", "n07", "n09", "n10"}},
		{name: "the whole cluster too small", nodes: twelve("n00", "n01", "n02", "n03", "n04", "n05", "n06", "n07", "n08"), gang: Gang{Size: 4, Request: gpu, Levels: allPref},
			noRoom: "-"},
		{name: "hosts with most room first", gang: Gang{Size: 3, Request: Resources{"cpu": 1000}},
			nodes: []Node{{Name: "a", Free: Resources{"cpu": 1000}}, {Name: "b", Free: Resources{"cpu": 2500}}, {Name: "c", Free: Resources{"cpu": 0}}},
			want:  []string{"b", "b", "a"}},
		{name: "nodes without the label are outside every domain", gang: Gang{Size: 2, Request: gpu, Levels: []Level{{Key: "rack", Required: true}}},
			nodes: []Node{{Name: "x", Free: Resources{"gpu": 2, "cpu": 4000}}}, noRoom: "rack"},
		{name: "zero size", nodes: twelve(), gang: Gang{Size: 0}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Place(tt.nodes, tt.gang)
			var nr *NoRoomError
			switch {
			case tt.wantErr:
				if err == nil || errors.As(err, &nr) {
					t.Fatalf("Place = %v, %v; want a plain error", got, err)
				}
			case tt.noRoom != "":
				if !errors.As(err, &nr) {
					t.Fatalf("Place = %v, %v; want a NoRoomError", got, err)
				}
				if want := map[bool]string{true: "", false: tt.noRoom}[tt.noRoom == "-"]; nr.Level != want {
					t.Errorf("NoRoomError.Level = %q, want %q", nr.Level, want)
				}
			default:
				if err != nil || !slices.Equal(got, tt.want) {
					t.Fatalf("Place = %v, %v; want %v", got, err, tt.want)
				}
			}
		})
	}
}

// FuzzPlace checks Place's promises on arbitrary clusters: a placement has the gang's size,
// fits every node's room, and keeps a required level's pods in one domain; a refusal is
// right that no domain of the first required level has room.
func FuzzPlace(f *testing.F) {
	f.Add([]byte{4, 1, 3, 0, 1, 2, 3, 1, 0, 2, 2, 1}, uint8(4), uint8(1), uint8(1))
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 1, 1}, uint8(3), uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, spec []byte, size, req, mode uint8) {
		if len(spec) > 60 || size == 0 || size > 16 || req == 0 {
			return
		}
		var nodes []Node
		for i := 0; i+1 < len(spec); i += 2 {
			nodes = append(nodes, Node{Name: fmt.Sprintf("n%02d", i/2),
				Labels: map[string]string{"rack": fmt.Sprint(spec[i] % 4), "zone": fmt.Sprint(spec[i] % 2)},
				Free:   Resources{"gpu": int64(spec[i+1] % 8)}})
		}
		levels := []Level{{Key: "rack", Required: mode&1 != 0}, {Key: "zone", Required: mode&2 != 0}}
		g := Gang{Size: int(size), Request: Resources{"gpu": int64(req % 4)}, Levels: levels}
		got, err := Place(nodes, g)
		var nr *NoRoomError
		if err != nil {
			if !errors.As(err, &nr) {
				t.Fatalf("Place: %v", err)
			}
			return
		}
		if len(got) != g.Size {
			t.Fatalf("placed %d pods, want %d", len(got), g.Size)
		}
		used := map[string]int64{}
		for _, name := range got {
			used[name] += g.Request["gpu"]
		}
		for _, n := range nodes {
			if used[n.Name] > n.Free["gpu"] {
				t.Fatalf("node %s: %d placed over %d free", n.Name, used[n.Name], n.Free["gpu"])
			}
		}
		for _, lv := range levels {
			if !lv.Required {
				continue
			}
			domains := map[string]bool{}
			for _, name := range got {
				for _, n := range nodes {
					if n.Name == name {
						domains[n.Labels[lv.Key]] = true
					}
				}
			}
			if len(domains) != 1 {
				t.Fatalf("required level %s: pods in %d domains", lv.Key, len(domains))
			}
		}
	})
}
