// Package v1alpha1 holds the Tandem operator's API, group tandem.dev version v1alpha1:
// TandemCluster (a model, its routers and engine pools) and TandemPool (one pool's pods).
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version name the API on the wire; they change only with a new version.
const (
	Group   = "tandem.dev"
	Version = "v1alpha1"
)

// GroupVersion is Group/Version.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// AddToScheme registers the API's types in a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &TandemCluster{}, &TandemClusterList{}, &TandemPool{}, &TandemPoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Roles of a pool, as the engine's --role names them.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Labels and annotations the operator sets and reads.
const (
	LabelCluster      = "tandem.dev/cluster"
	LabelPool         = "tandem.dev/pool"
	LabelRole         = "tandem.dev/role"
	LabelComponent    = "tandem.dev/component" // router or engine
	LabelTemplateHash = "tandem.dev/template-hash"
	LabelReplica      = "tandem.dev/replica" // the replica (gang) a pod belongs to
	// AnnotationGangNodes lists the nodes of every member of a pod's gang, in member
	// order: a gang left half-created (the operator restarted) is completed where it was placed.
	AnnotationGangNodes = "tandem.dev/gang-nodes"
	// AnnotationGangMember is a pod's index in its gang.
	AnnotationGangMember = "tandem.dev/gang-member"
	// AnnotationDrainFirst marks a pod the planner chose to remove: on scale-down its
	// replica goes before the others (lower values first).
	AnnotationDrainFirst = "tandem.dev/drain-first"
	// AnnotationAppliedReplicas on a TandemPool is the cluster spec's replicas last
	// applied to it: the pool's own replicas (the scale subresource, the planner, an HPA)
	// are overwritten only when the cluster spec's number changes.
	AnnotationAppliedReplicas = "tandem.dev/applied-replicas"
	// Finalizer lets the operator delete a cluster's or a pool's children itself, in
	// order, before the object goes (clusters without a garbage collector keep none).
	Finalizer = "tandem.dev/children"
)

// TandemCluster is a model served by routers in front of engine pools.
type TandemCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterSpec   `json:"spec"`
	Status ClusterStatus `json:"status,omitempty"`
}

// TandemClusterList is a list of TandemClusters.
type TandemClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TandemCluster `json:"items"`
}

// ClusterSpec is what a user writes.
type ClusterSpec struct {
	// Image runs both tandem-router and tandem (the engine).
	Image           string            `json:"image"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Model is the model every pool serves unless the pool names its own.
	Model   *ModelSource `json:"model,omitempty"`
	Router  RouterSpec   `json:"router,omitempty"`
	Pools   []PoolSpec   `json:"pools"`
	KVCache *KVCacheSpec `json:"kvCache,omitempty"`
	Planner *PlannerSpec `json:"planner,omitempty"`
}

// ModelSource says where an engine's model file comes from: exactly one of its fields.
type ModelSource struct {
	// PVC mounts a persistent volume claim read-only and opens Path inside it.
	PVC *PVCModel `json:"pvc,omitempty"`
	// Path is a file already in the image (or on a volume the pool's engine args mount).
	Path string `json:"path,omitempty"`
	// ServedName is the model's id in the API (default: the file's name).
	ServedName string `json:"servedName,omitempty"`
}

// PVCModel is a model file on a persistent volume claim.
type PVCModel struct {
	ClaimName string `json:"claimName"`
	Path      string `json:"path"`
}

// RouterSpec sizes the routers and their Service.
type RouterSpec struct {
	Replicas    *int32                      `json:"replicas,omitempty"`
	Resources   corev1.ResourceRequirements `json:"resources,omitempty"`
	Args        []string                    `json:"args,omitempty"`
	ServiceType corev1.ServiceType          `json:"serviceType,omitempty"`
	Port        int32                       `json:"port,omitempty"`
}

// PoolSpec is one engine pool.
type PoolSpec struct {
	Name string `json:"name"`
	Role string `json:"role,omitempty"`
	// Replicas is the pool's starting size, applied again only when it changes here
	// (the pool's scale subresource owns the size in between).
	Replicas  *int32                      `json:"replicas,omitempty"`
	Model     *ModelSource                `json:"model,omitempty"`
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// EngineArgs are added to tandem serve's command line.
	EngineArgs   []string          `json:"engineArgs,omitempty"`
	DrainTimeout *metav1.Duration  `json:"drainTimeout,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations let the pool's pods (and its gangs' placement) use tainted nodes, such
	// as GPU nodes tainted nvidia.com/gpu:NoSchedule.
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	Gang        *GangSpec           `json:"gang,omitempty"`
}

// GangSpec makes one replica several pods, placed all together or not at all.
type GangSpec struct {
	// Size is the number of pods of one replica.
	Size int32 `json:"size"`
	// Topology lists the levels a gang is packed into, narrowest first (a rack, then a
	// zone): each required (all pods in one domain of the level, or wait) or preferred.
	Topology []TopologyLevel `json:"topology,omitempty"`
}

// Placement modes of a topology level.
const (
	PlacementRequired  = "Required"
	PlacementPreferred = "Preferred"
)

// TopologyLevel is a node label whose values are the level's domains.
type TopologyLevel struct {
	Key  string `json:"key"`
	Mode string `json:"mode"`
}

// KVCacheSpec sizes the engines' KV cache.
type KVCacheSpec struct {
	// Memory is the device tier's budget (tandem serve --kv-cache-memory), e.g. 4GiB.
	Memory string `json:"memory,omitempty"`
}

// PlannerSpec configures the SLA planner the router runs.
type PlannerSpec struct {
	Enabled bool `json:"enabled,omitempty"`
	// Args are added to tandem-router's command line (the planner's targets and bounds).
	Args []string `json:"args,omitempty"`
}

// ClusterStatus is what the operator reports.
type ClusterStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	RouterReplicas     int32              `json:"routerReplicas,omitempty"`
	RouterReady        int32              `json:"routerReadyReplicas,omitempty"`
	Pools              []PoolStatusEntry  `json:"pools,omitempty"`
}

// PoolStatusEntry is one pool as the cluster's status shows it.
type PoolStatusEntry struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// Target is the pool's replicas now (the planner's or the scale subresource's).
	Target int32 `json:"target"`
	// Ready counts the replicas whose pods are all ready: workers joined.
	Ready int32 `json:"ready"`
}

// Condition types.
const (
	ConditionReady       = "Ready"
	ConditionRouterReady = "RouterReady"
	ConditionPoolsReady  = "PoolsReady"
	ConditionPlaced      = "Placed" // a pool's: every replica has room
)

// TandemPool is one engine pool's pods; the operator creates it from a TandemCluster.
// Its scale subresource (spec.replicas) is what the planner, kubectl scale and an HPA drive.
type TandemPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TandemPoolSpec   `json:"spec"`
	Status TandemPoolStatus `json:"status,omitempty"`
}

// TandemPoolList is a list of TandemPools.
type TandemPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TandemPool `json:"items"`
}

// TandemPoolSpec is a pool's size and the pods of each replica.
type TandemPoolSpec struct {
	Cluster  string                 `json:"cluster"`
	Role     string                 `json:"role"`
	Replicas int32                  `json:"replicas"`
	Gang     *GangSpec              `json:"gang,omitempty"`
	Template corev1.PodTemplateSpec `json:"template"`
}

// TandemPoolStatus counts replicas (gangs), not pods.
type TandemPoolStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Replicas           int32              `json:"replicas"`
	ReadyReplicas      int32              `json:"readyReplicas"`
	UpdatedReplicas    int32              `json:"updatedReplicas"`
	Selector           string             `json:"selector,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}
