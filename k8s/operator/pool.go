package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "tandem/k8s/api/v1alpha1"
	"tandem/k8s/placement"
)

// waitingRetry is how often a gang without room looks again (node and pod events also wake it).
const waitingRetry = 10 * time.Second

// PoolReconciler keeps a TandemPool's replicas: gangs of pods, placed all together.
type PoolReconciler struct {
	Client client.Client
	// Reader reads the pods and nodes placement decides on, uncached, so that two
	// reconciles in a row never place two gangs in the same room.
	Reader  client.Reader
	Log     *slog.Logger
	Metrics *Metrics
}

// Reconcile implements reconcile.Reconciler.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pool v1.TandemPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pods, err := r.ownPods(ctx, &pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, &pool, pods)
	}
	if controllerutil.AddFinalizer(&pool, v1.Finalizer) {
		if err := r.Client.Update(ctx, &pool); err != nil {
			return ctrl.Result{}, err
		}
	}

	hash := templateHash(&pool.Spec)
	size := gangSize(&pool.Spec)
	reps, byID := replicaStates(pods, size)
	plan := planPool(int(pool.Spec.Replicas), size, hash, reps)

	for _, id := range plan.Delete {
		for _, p := range byID[id] {
			if err := r.deletePod(ctx, p); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	for _, id := range plan.Complete {
		if err := r.complete(ctx, &pool, id, size, byID[id]); err != nil {
			return ctrl.Result{}, err
		}
	}
	var waitErr error
	if len(plan.Create) > 0 {
		waitErr = r.create(ctx, &pool, hash, size, plan.Create)
		var nr *placement.NoRoomError
		if waitErr != nil && !errors.As(waitErr, &nr) {
			return ctrl.Result{}, waitErr
		}
	}
	if err := r.updateStatus(ctx, &pool, hash, reps, waitErr); err != nil {
		return ctrl.Result{}, err
	}
	if waitErr != nil {
		return ctrl.Result{RequeueAfter: waitingRetry}, nil
	}
	return ctrl.Result{}, nil
}

// ownPods lists the pods pool controls (a pod of a replaced pool of the same name is not one).
func (r *PoolReconciler) ownPods(ctx context.Context, pool *v1.TandemPool) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := r.Reader.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1.LabelPool: pool.Name}); err != nil {
		return nil, fmt.Errorf("list pods of pool %s: %w", pool.Name, err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == pool.UID {
			out = append(out, p)
		}
	}
	return out, nil
}

// finalize deletes the pool's pods and lets the pool go once none is left.
func (r *PoolReconciler) finalize(ctx context.Context, pool *v1.TandemPool, pods []corev1.Pod) error {
	for i := range pods {
		if err := r.deletePod(ctx, &pods[i]); err != nil {
			return err
		}
	}
	if len(pods) > 0 {
		return nil // the pods' deletion events bring the pool back
	}
	if controllerutil.RemoveFinalizer(pool, v1.Finalizer) {
		return client.IgnoreNotFound(r.Client.Update(ctx, pool))
	}
	return nil
}

func (r *PoolReconciler) deletePod(ctx context.Context, p *corev1.Pod) error {
	if !p.DeletionTimestamp.IsZero() {
		return nil
	}
	if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	return nil
}

// replicaStates groups pods into replicas.
func replicaStates(pods []corev1.Pod, size int) ([]replicaState, map[replicaID][]*corev1.Pod) {
	byID := map[replicaID][]*corev1.Pod{}
	var order []replicaID
	for i := range pods {
		p := &pods[i]
		idx, err := strconv.Atoi(p.Labels[v1.LabelReplica])
		if err != nil {
			continue
		}
		id := replicaID{p.Labels[v1.LabelTemplateHash], idx}
		if _, ok := byID[id]; !ok {
			order = append(order, id)
		}
		byID[id] = append(byID[id], p)
	}
	var out []replicaState
	for _, id := range order {
		st := replicaState{Hash: id.Hash, Index: id.Index, Terminating: true}
		ready := 0
		for _, p := range byID[id] {
			if !p.DeletionTimestamp.IsZero() {
				continue // made again once gone (its name is still taken)
			}
			st.Terminating = false
			st.Pods++
			if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				st.Failed = true
			}
			if podReady(p) {
				ready++
			}
			if v, err := strconv.Atoi(p.Annotations[v1.AnnotationDrainFirst]); err == nil && v > 0 && (st.DrainFirst == 0 || v < st.DrainFirst) {
				st.DrainFirst = v
			}
		}
		st.Ready = ready == size && st.Pods == size
		out = append(out, st)
	}
	return out, byID
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// complete creates a half-made gang's missing members where the gang was placed.
func (r *PoolReconciler) complete(ctx context.Context, pool *v1.TandemPool, id replicaID, size int, have []*corev1.Pod) error {
	present := map[int]bool{}
	var nodes []string
	for _, p := range have {
		if m, err := strconv.Atoi(p.Annotations[v1.AnnotationGangMember]); err == nil {
			present[m] = true
		}
		if s := p.Annotations[v1.AnnotationGangNodes]; s != "" && nodes == nil {
			if err := json.Unmarshal([]byte(s), &nodes); err != nil || len(nodes) != size {
				nodes = nil
			}
		}
	}
	for m := range size {
		if present[m] {
			continue
		}
		if err := r.createPod(ctx, replicaPod(pool, id.Hash, id.Index, m, nodes)); err != nil {
			return err
		}
	}
	return nil
}

// create makes new replicas; with a gang or topology, each is placed whole first, and
// a replica without room stops the rest (a *placement.NoRoomError: the pool waits).
func (r *PoolReconciler) create(ctx context.Context, pool *v1.TandemPool, hash string, size int, indices []int) error {
	placed := pool.Spec.Gang != nil
	var nodes []placement.Node
	if placed {
		var err error
		if nodes, err = r.freeNodes(ctx, &pool.Spec.Template.Spec); err != nil {
			return err
		}
	}
	req := podRequest(&pool.Spec.Template.Spec)
	for _, idx := range indices {
		var where []string
		if placed {
			var err error
			where, err = placement.Place(nodes, placement.Gang{Size: size, Request: req, Levels: levels(pool.Spec.Gang)})
			if err != nil {
				r.Metrics.gangWaits.WithLabelValues(pool.Namespace, pool.Name).Inc()
				return err
			}
			take(nodes, where, req)
		}
		for m := range size {
			if err := r.createPod(ctx, replicaPod(pool, hash, idx, m, where)); err != nil {
				return err
			}
		}
		r.Metrics.replicasCreated.WithLabelValues(pool.Namespace, pool.Name).Inc()
	}
	return nil
}

func (r *PoolReconciler) createPod(ctx context.Context, p *corev1.Pod) error {
	if err := r.Client.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	return nil
}

func levels(g *v1.GangSpec) []placement.Level {
	out := make([]placement.Level, 0, len(g.Topology))
	for _, l := range g.Topology {
		out = append(out, placement.Level{Key: l.Key, Required: l.Mode == v1.PlacementRequired})
	}
	return out
}

// podRequest is what one pod asks for: its containers' requests (limits where a request
// is missing), and one pod slot.
func podRequest(spec *corev1.PodSpec) placement.Resources {
	out := placement.Resources{string(corev1.ResourcePods): 1}
	for _, c := range spec.Containers {
		for name, q := range c.Resources.Limits {
			if _, ok := c.Resources.Requests[name]; !ok {
				out[string(name)] += quantity(name, q)
			}
		}
		for name, q := range c.Resources.Requests {
			out[string(name)] += quantity(name, q)
		}
	}
	return out
}

func quantity(name corev1.ResourceName, q resource.Quantity) int64 {
	if name == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// freeNodes is every schedulable node that matches the pod's node selector and tolerates
// its taints, with allocatable less what the pods bound there request.
func (r *PoolReconciler) freeNodes(ctx context.Context, spec *corev1.PodSpec) ([]placement.Node, error) {
	var nodes corev1.NodeList
	if err := r.Reader.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	used := map[string]placement.Resources{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		u := used[p.Spec.NodeName]
		if u == nil {
			u = placement.Resources{}
			used[p.Spec.NodeName] = u
		}
		for k, v := range podRequest(&p.Spec) {
			u[k] += v
		}
	}
	var out []placement.Node
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable || !matches(n.Labels, spec.NodeSelector) || !tolerates(spec.Tolerations, n.Spec.Taints) {
			continue
		}
		free := placement.Resources{}
		for name, q := range n.Status.Allocatable {
			free[string(name)] = quantity(name, q) - used[n.Name][string(name)]
		}
		out = append(out, placement.Node{Name: n.Name, Labels: n.Labels, Free: free})
	}
	slices.SortFunc(out, func(a, b placement.Node) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func tolerates(tols []corev1.Toleration, taints []corev1.Taint) bool {
	for _, t := range taints {
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		ok := false
		for _, tol := range tols {
			if (tol.Key == "" || tol.Key == t.Key) && (tol.Effect == "" || tol.Effect == t.Effect) &&
				(tol.Operator == corev1.TolerationOpExists || tol.Value == t.Value) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// take subtracts a placed gang's requests from the nodes it landed on.
func take(nodes []placement.Node, where []string, req placement.Resources) {
	for _, name := range where {
		for i := range nodes {
			if nodes[i].Name == name {
				for k, v := range req {
					nodes[i].Free[k] -= v
				}
			}
		}
	}
}

func (r *PoolReconciler) updateStatus(ctx context.Context, pool *v1.TandemPool, hash string, reps []replicaState, waitErr error) error {
	st := v1.TandemPoolStatus{ObservedGeneration: pool.Generation, Selector: v1.LabelPool + "=" + pool.Name,
		Conditions: slices.Clone(pool.Status.Conditions)}
	for _, r := range reps {
		if r.Terminating {
			continue
		}
		st.Replicas++
		if r.Ready {
			st.ReadyReplicas++
		}
		if r.Hash == hash {
			st.UpdatedReplicas++
		}
	}
	cond := metav1.Condition{Type: v1.ConditionPlaced, Status: metav1.ConditionTrue, Reason: "Placed",
		Message: "every replica has room", ObservedGeneration: pool.Generation}
	if waitErr != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "GangWaiting", waitErr.Error()
		// Logged when the pool starts waiting, not at every try (the counter counts those).
		if old := meta.FindStatusCondition(pool.Status.Conditions, v1.ConditionPlaced); old == nil || old.Reason != cond.Reason {
			r.Log.Info("gang waits for room", "pool", pool.Namespace+"/"+pool.Name, "err", waitErr)
		}
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	if equalPoolStatus(pool.Status, st) {
		return nil
	}
	pool.Status = st
	if err := r.Client.Status().Update(ctx, pool); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update status of pool %s: %w", pool.Name, err)
	}
	return nil
}

func equalPoolStatus(a, b v1.TandemPoolStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.Replicas != b.Replicas || a.ReadyReplicas != b.ReadyReplicas ||
		a.UpdatedReplicas != b.UpdatedReplicas || a.Selector != b.Selector || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}

// poolsToWake lists every pool with a gang when a node changes: room may have opened.
func poolsToWake(ctx context.Context, c client.Client) []ctrl.Request {
	var pools v1.TandemPoolList
	if err := c.List(ctx, &pools); err != nil {
		return nil
	}
	var out []ctrl.Request
	for _, p := range pools.Items {
		if p.Spec.Gang != nil {
			out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
		}
	}
	return out
}
