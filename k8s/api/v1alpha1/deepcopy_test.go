package v1alpha1

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func full() *TandemCluster {
	n := int32(2)
	return &TandemCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{"a": "b"}},
		Spec: ClusterSpec{
			Image: "i", Model: &ModelSource{PVC: &PVCModel{ClaimName: "m", Path: "p"}},
			Router: RouterSpec{Replicas: &n, Args: []string{"--x"},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}},
			Pools: []PoolSpec{{Name: "p", Replicas: &n, Model: &ModelSource{Path: "q"}, EngineArgs: []string{"--y"},
				DrainTimeout: &metav1.Duration{Duration: time.Second}, NodeSelector: map[string]string{"k": "v"},
				Tolerations: []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}},
				Gang:        &GangSpec{Size: 2, Topology: []TopologyLevel{{Key: "rack", Mode: PlacementRequired}}}}},
			KVCache: &KVCacheSpec{Memory: "1GiB"}, Planner: &PlannerSpec{Enabled: true, Args: []string{"--z"}},
		},
		Status: ClusterStatus{Conditions: []metav1.Condition{{Type: ConditionReady}}, Pools: []PoolStatusEntry{{Name: "p"}}},
	}
}

// TestDeepCopyIsDeep changes every pointer, slice and map of a copy and checks that the
// original keeps its values.
func TestDeepCopyIsDeep(t *testing.T) {
	orig := full()
	cp := orig.DeepCopy()
	if !reflect.DeepEqual(orig, cp) {
		t.Fatal("copy differs")
	}
	*cp.Spec.Router.Replicas = 9
	cp.Spec.Router.Args[0] = "changed"
	cp.Spec.Router.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("9")
	cp.Spec.Model.PVC.Path = "changed"
	p := &cp.Spec.Pools[0]
	*p.Replicas = 9
	p.Model.Path = "changed"
	p.EngineArgs[0] = "changed"
	p.DrainTimeout.Duration = time.Hour
	p.NodeSelector["k"] = "changed"
	p.Gang.Topology[0].Key = "changed"
	p.Tolerations[0].Key = "changed"
	cp.Spec.KVCache.Memory = "changed"
	cp.Spec.Planner.Args[0] = "changed"
	cp.Status.Conditions[0].Type = "changed"
	cp.Status.Pools[0].Name = "changed"
	cp.Labels["a"] = "changed"
	if !reflect.DeepEqual(orig, full()) {
		t.Errorf("changing the copy changed the original:\n%+v", orig)
	}

	pool := &TandemPool{Spec: TandemPoolSpec{Gang: &GangSpec{Size: 1, Topology: []TopologyLevel{{Key: "k"}}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Args: []string{"a"}}}}}}}
	pc := pool.DeepCopyObject().(*TandemPool)
	pc.Spec.Gang.Topology[0].Key = "changed"
	pc.Spec.Template.Spec.Containers[0].Args[0] = "changed"
	if pool.Spec.Gang.Topology[0].Key != "k" || pool.Spec.Template.Spec.Containers[0].Args[0] != "a" {
		t.Error("changing the pool's copy changed the original")
	}
	list := &TandemClusterList{Items: []TandemCluster{*full()}}
	lc := list.DeepCopyObject().(*TandemClusterList)
	lc.Items[0].Spec.Pools[0].EngineArgs[0] = "changed"
	if list.Items[0].Spec.Pools[0].EngineArgs[0] != "--y" {
		t.Error("changing the list's copy changed the original")
	}
}
