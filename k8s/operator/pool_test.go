package operator

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestTolerates(t *testing.T) {
	gpu := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	soft := corev1.Taint{Key: "busy", Effect: corev1.TaintEffectPreferNoSchedule}
	tests := []struct {
		name   string
		tols   []corev1.Toleration
		taints []corev1.Taint
		want   bool
	}{
		{"no taints", nil, nil, true},
		{"a taint not tolerated", nil, []corev1.Taint{gpu}, false},
		{"tolerated by key (exists)", []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}, []corev1.Taint{gpu}, true},
		{"tolerated by value", []corev1.Toleration{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}, []corev1.Taint{gpu}, true},
		{"a wrong value", []corev1.Toleration{{Key: "nvidia.com/gpu", Value: "absent"}}, []corev1.Taint{gpu}, false},
		{"another effect", []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}, []corev1.Taint{gpu}, false},
		{"everything (empty key, exists)", []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, []corev1.Taint{gpu}, true},
		{"PreferNoSchedule never blocks", nil, []corev1.Taint{soft}, true},
	}
	for _, tt := range tests {
		if got := tolerates(tt.tols, tt.taints); got != tt.want {
			t.Errorf("%s: tolerates = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestPodRequest(t *testing.T) {
	spec := &corev1.PodSpec{Containers: []corev1.Container{
		{Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2"), corev1.ResourceCPU: resource.MustParse("4")}}},
		{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}},
	}}
	got := podRequest(spec)
	want := map[string]int64{"cpu": 2000, "memory": 1 << 30, "nvidia.com/gpu": 2, "pods": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d, want %d (requests, else limits)", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("podRequest = %v, want %v", got, want)
	}
}
