package operator

import (
	"reflect"
	"testing"
)

func TestPlanPool(t *testing.T) {
	ready := func(hash string, idx int) replicaState {
		return replicaState{Hash: hash, Index: idx, Pods: 2, Ready: true}
	}
	starting := func(hash string, idx int) replicaState {
		return replicaState{Hash: hash, Index: idx, Pods: 2}
	}
	tests := []struct {
		name    string
		desired int
		reps    []replicaState
		want    poolPlan
	}{
		{name: "empty pool scales up at once", desired: 3, want: poolPlan{Create: []int{0, 1, 2}}},
		{name: "steady", desired: 2, reps: []replicaState{ready("h", 0), ready("h", 1)}},
		{name: "scale down removes the newest", desired: 1, reps: []replicaState{ready("h", 0), ready("h", 1)},
			want: poolPlan{Delete: []replicaID{{"h", 1}}}},
		{name: "scale down removes the planner's choice first", desired: 1,
			reps: []replicaState{{Hash: "h", Index: 0, Pods: 2, Ready: true, DrainFirst: 1}, ready("h", 1)},
			want: poolPlan{Delete: []replicaID{{"h", 0}}}},
		{name: "scale down removes unready before ready", desired: 1, reps: []replicaState{ready("h", 1), starting("h", 0)},
			want: poolPlan{Delete: []replicaID{{"h", 0}}}},
		{name: "rollout starts one new replica", desired: 2, reps: []replicaState{ready("o", 0), ready("o", 1)},
			want: poolPlan{Create: []int{0}}},
		{name: "rollout waits for the new one to be ready", desired: 2, reps: []replicaState{ready("o", 0), ready("o", 1), starting("h", 0)}},
		{name: "rollout replaces an old one once a new one is ready", desired: 2, reps: []replicaState{ready("o", 0), ready("o", 1), ready("h", 0)},
			want: poolPlan{Create: []int{1}, Delete: []replicaID{{"o", 1}}}},
		{name: "rollout goes on after the old one left", desired: 2, reps: []replicaState{ready("o", 0), ready("h", 0)},
			want: poolPlan{Create: []int{1}}},
		{name: "rollout ends", desired: 2, reps: []replicaState{ready("o", 0), ready("h", 0), ready("h", 1)},
			want: poolPlan{Delete: []replicaID{{"o", 0}}}},
		{name: "unready old replicas go at once", desired: 1, reps: []replicaState{starting("o", 0)},
			want: poolPlan{Create: []int{0}, Delete: []replicaID{{"o", 0}}}},
		{name: "a broken gang goes whole and is made again", desired: 1, reps: []replicaState{{Hash: "h", Index: 0, Pods: 1, Failed: true}},
			want: poolPlan{Create: []int{1}, Delete: []replicaID{{"h", 0}}}},
		{name: "a half-made gang is completed", desired: 1, reps: []replicaState{{Hash: "h", Index: 0, Pods: 1}},
			want: poolPlan{Complete: []replicaID{{"h", 0}}}},
		{name: "terminating replicas keep their index", desired: 2, reps: []replicaState{{Hash: "h", Index: 0, Terminating: true}, ready("h", 1)},
			want: poolPlan{Create: []int{2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planPool(tt.desired, 2, "h", tt.reps)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("planPool = %+v, want %+v", got, tt.want)
			}
		})
	}
}
