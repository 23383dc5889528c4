package operator

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "tandem/k8s/api/v1alpha1"
)

// TestBadSpecsRefused holds the CRDs' validation: the API server refuses each bad spec
// with a message naming the field.
func TestBadSpecsRefused(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, false)
	neg, one := int32(-1), int32(1)
	tests := []struct {
		name  string
		edit  func(c *v1.TandemCluster)
		field string // in the error
		also  string
	}{
		{"negative replicas", func(c *v1.TandemCluster) { c.Spec.Pools[0].Replicas = &neg }, "spec.pools[0].replicas", "greater than or equal to 0"},
		{"unknown role", func(c *v1.TandemCluster) { c.Spec.Pools[0].Role = "mixed" }, "spec.pools[0].role", `"both", "prefill", "decode"`},
		{"a pool without a model", func(c *v1.TandemCluster) { c.Spec.Model = nil }, "spec.model", "a pool has no model"},
		{"a model with two sources", func(c *v1.TandemCluster) {
			c.Spec.Model.PVC = &v1.PVCModel{ClaimName: "m", Path: "m.gguf"}
		}, "spec.model", "exactly one of pvc and path"},
		{"two pools of one name", func(c *v1.TandemCluster) {
			c.Spec.Pools = append(c.Spec.Pools, v1.PoolSpec{Name: "p", Replicas: &one})
		}, "spec.pools[1]", "Duplicate value"},
		{"a pool name that is no DNS label", func(c *v1.TandemCluster) { c.Spec.Pools[0].Name = "Big_Pool" }, "spec.pools[0].name", "should match"},
		{"an empty gang", func(c *v1.TandemCluster) { c.Spec.Pools[0].Gang = &v1.GangSpec{Size: 0} }, "spec.pools[0].gang.size", "greater than or equal to 1"},
		{"an unknown placement mode", func(c *v1.TandemCluster) {
			c.Spec.Pools[0].Gang = &v1.GangSpec{Size: 2, Topology: []v1.TopologyLevel{{Key: "rack", Mode: "Sometimes"}}}
		}, "spec.pools[0].gang.topology[0].mode", `"Required", "Preferred"`},
		{"a prefill pool without a decode pool", func(c *v1.TandemCluster) { c.Spec.Pools[0].Role = v1.RolePrefill }, "spec.pools", "a prefill pool needs a decode pool"},
		{"no image", func(c *v1.TandemCluster) { c.Spec.Image = "" }, "spec.image", ""},
		{"no pools", func(c *v1.TandemCluster) { c.Spec.Pools = nil }, "spec.pools", ""},
		{"a bad drain timeout", func(c *v1.TandemCluster) {
			c.Spec.Pools[0].DrainTimeout = &metav1.Duration{Duration: -1}
		}, "spec.pools[0].drainTimeout", "should match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := smallCluster(ns, "bad", 1)
			tt.edit(c)
			err := direct.Create(ctx, c)
			if err == nil {
				direct.Delete(ctx, c)
				t.Fatal("accepted")
			}
			t.Log(err)
			if !isInvalid(err) || !strings.Contains(err.Error(), tt.field) || !strings.Contains(err.Error(), tt.also) {
				t.Errorf("error %q: want an Invalid error naming %s (%q)", err, tt.field, tt.also)
			}
		})
	}

	// The scale subresource refuses a negative size too.
	if err := direct.Create(ctx, smallCluster(ns, "good", 1)); err != nil {
		t.Fatalf("a good spec refused: %v", err)
	}
	pool := &v1.TandemPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "direct"},
		Spec: v1.TandemPoolSpec{Cluster: "good", Role: v1.RoleBoth, Replicas: 1}}
	if err := direct.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	err := direct.SubResource("scale").Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":-2}}`)))
	if err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Errorf("scale to -2: %v, want an error naming replicas", err)
	}
}
