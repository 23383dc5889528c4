package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The deep copies client-go's machinery needs, written out (no code generator here).

func (in *TandemCluster) DeepCopyInto(out *TandemCluster) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

func (in *TandemCluster) DeepCopy() *TandemCluster {
	if in == nil {
		return nil
	}
	out := new(TandemCluster)
	in.DeepCopyInto(out)
	return out
}

func (in *TandemCluster) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *TandemClusterList) DeepCopyInto(out *TandemClusterList) {
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]TandemCluster, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *TandemClusterList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(TandemClusterList)
	in.DeepCopyInto(out)
	return out
}

func (in *ClusterSpec) DeepCopyInto(out *ClusterSpec) {
	*out = *in
	out.Model = in.Model.DeepCopy()
	in.Router.DeepCopyInto(&out.Router)
	if in.Pools != nil {
		out.Pools = make([]PoolSpec, len(in.Pools))
		for i := range in.Pools {
			in.Pools[i].DeepCopyInto(&out.Pools[i])
		}
	}
	if in.KVCache != nil {
		kv := *in.KVCache
		out.KVCache = &kv
	}
	if in.Planner != nil {
		p := *in.Planner
		p.Args = cloneStrings(in.Planner.Args)
		out.Planner = &p
	}
}

func (in *ModelSource) DeepCopy() *ModelSource {
	if in == nil {
		return nil
	}
	out := *in
	if in.PVC != nil {
		pvc := *in.PVC
		out.PVC = &pvc
	}
	return &out
}

func (in *RouterSpec) DeepCopyInto(out *RouterSpec) {
	*out = *in
	out.Replicas = cloneInt32(in.Replicas)
	in.Resources.DeepCopyInto(&out.Resources)
	out.Args = cloneStrings(in.Args)
}

func (in *PoolSpec) DeepCopyInto(out *PoolSpec) {
	*out = *in
	out.Replicas = cloneInt32(in.Replicas)
	out.Model = in.Model.DeepCopy()
	in.Resources.DeepCopyInto(&out.Resources)
	out.EngineArgs = cloneStrings(in.EngineArgs)
	if in.DrainTimeout != nil {
		d := *in.DrainTimeout
		out.DrainTimeout = &d
	}
	if in.NodeSelector != nil {
		out.NodeSelector = make(map[string]string, len(in.NodeSelector))
		for k, v := range in.NodeSelector {
			out.NodeSelector[k] = v
		}
	}
	if in.Tolerations != nil {
		out.Tolerations = make([]corev1.Toleration, len(in.Tolerations))
		for i := range in.Tolerations {
			in.Tolerations[i].DeepCopyInto(&out.Tolerations[i])
		}
	}
	out.Gang = in.Gang.DeepCopy()
}

func (in *GangSpec) DeepCopy() *GangSpec {
	if in == nil {
		return nil
	}
	out := *in
	if in.Topology != nil {
		out.Topology = append([]TopologyLevel(nil), in.Topology...)
	}
	return &out
}

func (in *ClusterStatus) DeepCopyInto(out *ClusterStatus) {
	*out = *in
	out.Conditions = cloneConditions(in.Conditions)
	if in.Pools != nil {
		out.Pools = append([]PoolStatusEntry(nil), in.Pools...)
	}
}

func (in *TandemPool) DeepCopyInto(out *TandemPool) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec
	out.Spec.Gang = in.Spec.Gang.DeepCopy()
	in.Spec.Template.DeepCopyInto(&out.Spec.Template)
	out.Status = in.Status
	out.Status.Conditions = cloneConditions(in.Status.Conditions)
}

func (in *TandemPool) DeepCopy() *TandemPool {
	if in == nil {
		return nil
	}
	out := new(TandemPool)
	in.DeepCopyInto(out)
	return out
}

func (in *TandemPool) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *TandemPoolList) DeepCopyInto(out *TandemPoolList) {
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]TandemPool, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *TandemPoolList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(TandemPoolList)
	in.DeepCopyInto(out)
	return out
}

func cloneStrings(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}

func cloneInt32(p *int32) *int32 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func cloneConditions(c []metav1.Condition) []metav1.Condition {
	if c == nil {
		return nil
	}
	out := make([]metav1.Condition, len(c))
	for i := range c {
		c[i].DeepCopyInto(&out[i])
	}
	return out
}
