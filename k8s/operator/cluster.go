package operator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "tandem/k8s/api/v1alpha1"
	"tandem/orpc"
)

// ClusterReconciler turns a TandemCluster into its Secrets, routers and TandemPools.
type ClusterReconciler struct {
	Client  client.Client
	Log     *slog.Logger
	Metrics *Metrics
}

// Reconcile implements reconcile.Reconciler.
func (r *ClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var c v1.TandemCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &c)
	}
	if controllerutil.AddFinalizer(&c, v1.Finalizer) {
		if err := r.Client.Update(ctx, &c); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.secrets(ctx, &c); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.plannerAccess(ctx, &c); err != nil {
		return ctrl.Result{}, err
	}
	dep := routerDeployment(&c)
	if err := r.apply(ctx, dep, func(have client.Object) {
		h := have.(*appsv1.Deployment)
		h.Labels, h.OwnerReferences = dep.Labels, dep.OwnerReferences
		h.Spec.Replicas, h.Spec.Template = dep.Spec.Replicas, dep.Spec.Template
		if h.Spec.Selector == nil {
			h.Spec.Selector = dep.Spec.Selector
		}
	}); err != nil {
		return ctrl.Result{}, err
	}
	svc := routerService(&c)
	if err := r.apply(ctx, svc, func(have client.Object) {
		h := have.(*corev1.Service)
		h.Labels, h.OwnerReferences = svc.Labels, svc.OwnerReferences
		h.Spec.Type, h.Spec.Selector, h.Spec.Ports = svc.Spec.Type, svc.Spec.Selector, svc.Spec.Ports
	}); err != nil {
		return ctrl.Result{}, err
	}

	var have appsv1.Deployment
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(dep), &have); err != nil {
		return ctrl.Result{}, err
	}
	routerReady := have.Status.ReadyReplicas > 0
	pools, err := r.ownPools(ctx, &c)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Routers before engines: a pool is first made once a router is ready (engines
	// joining nobody would only restart); pools made already are kept up to date.
	result := ctrl.Result{}
	if routerReady || len(pools) > 0 {
		if pools, err = r.pools(ctx, &c, pools); err != nil {
			return ctrl.Result{}, err
		}
		if len(pools) < len(c.Spec.Pools) {
			result.RequeueAfter = 2 * time.Second // a replaced cluster's pool is still going
		}
	} else {
		r.Metrics.routerWaits.WithLabelValues(c.Namespace, c.Name).Inc()
	}
	if err := r.updateStatus(ctx, &c, &have, pools); err != nil {
		return ctrl.Result{}, err
	}
	return result, nil
}

// secrets creates the cluster CA and the join token once; they are never rewritten (a
// new CA would lock every joined engine out).
func (r *ClusterReconciler) secrets(ctx context.Context, c *v1.TandemCluster) error {
	mk := func(name string, data func() (map[string][]byte, error)) error {
		var s corev1.Secret
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, &s)
		if err == nil || !apierrors.IsNotFound(err) {
			return err
		}
		d, err := data()
		if err != nil {
			return err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace, Labels: clusterLabels(c, "secret"),
				OwnerReferences: []metav1.OwnerReference{ownerRef(c, "TandemCluster")}},
			Type: corev1.SecretTypeOpaque, Data: d,
		}
		if err := r.Client.Create(ctx, &s); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create secret %s: %w", name, err)
		}
		return nil
	}
	if err := mk(caSecretName(c), func() (map[string][]byte, error) {
		ca, err := orpc.NewCA("tandem " + c.Namespace + "/" + c.Name)
		if err != nil {
			return nil, err
		}
		cert, key, err := ca.PEM()
		if err != nil {
			return nil, err
		}
		return map[string][]byte{orpc.CACertFile: cert, orpc.CAKeyFile: key}, nil
	}); err != nil {
		return err
	}
	return mk(joinSecretName(c), func() (map[string][]byte, error) {
		tok, err := orpc.GenerateToken()
		if err != nil {
			return nil, err
		}
		return map[string][]byte{"token": []byte(tok.String())}, nil
	})
}

// plannerAccess gives the routers a service account bound to the planner's role while
// the planner is enabled, and takes both away when it is not.
func (r *ClusterReconciler) plannerAccess(ctx context.Context, c *v1.TandemCluster) error {
	sa, rb := routerServiceAccount(c), plannerBinding(c)
	if !plannerEnabled(c) {
		for _, obj := range []client.Object{rb, sa} {
			// Read first (from the cache): most clusters never had them.
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return err
			}
			if !metav1.IsControlledBy(obj, c) {
				continue
			}
			if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete %s: %w", obj.GetName(), err)
			}
		}
		return nil
	}
	if err := r.apply(ctx, sa, func(have client.Object) {
		have.SetLabels(sa.Labels)
		have.SetOwnerReferences(sa.OwnerReferences)
	}); err != nil {
		return err
	}
	return r.apply(ctx, rb, func(have client.Object) {
		h := have.(*rbacv1.RoleBinding)
		h.Labels, h.OwnerReferences, h.Subjects = rb.Labels, rb.OwnerReferences, rb.Subjects
	})
}

// apply creates want, or brings the existing object's owned fields to want's.
func (r *ClusterReconciler) apply(ctx context.Context, want client.Object, mutate func(have client.Object)) error {
	have := want.DeepCopyObject().(client.Object)
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), have); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", want.GetName(), err)
		}
		return nil
	}
	before := have.DeepCopyObject()
	mutate(have)
	if equalObjects(before, have) {
		return nil
	}
	if err := r.Client.Update(ctx, have); err != nil {
		return fmt.Errorf("update %s: %w", want.GetName(), err)
	}
	return nil
}

func (r *ClusterReconciler) ownPools(ctx context.Context, c *v1.TandemCluster) ([]v1.TandemPool, error) {
	var list v1.TandemPoolList
	if err := r.Client.List(ctx, &list, client.InNamespace(c.Namespace), client.MatchingLabels{v1.LabelCluster: c.Name}); err != nil {
		return nil, err
	}
	var out []v1.TandemPool
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == c.UID {
			out = append(out, p)
		}
	}
	return out, nil
}

// pools creates and updates the TandemPools of c's spec and deletes the others.
func (r *ClusterReconciler) pools(ctx context.Context, c *v1.TandemCluster, have []v1.TandemPool) ([]v1.TandemPool, error) {
	var out []v1.TandemPool
	keep := map[string]bool{}
	for i := range c.Spec.Pools {
		ps := &c.Spec.Pools[i]
		name := poolName(c, ps.Name)
		keep[name] = true
		want := int32(1)
		if ps.Replicas != nil {
			want = *ps.Replicas
		}
		spec := v1.TandemPoolSpec{Cluster: c.Name, Role: roleOf(ps), Replicas: want, Gang: ps.Gang.DeepCopy(), Template: poolTemplate(c, ps)}
		idx := slices.IndexFunc(have, func(p v1.TandemPool) bool { return p.Name == name })
		if idx < 0 {
			p := v1.TandemPool{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace,
					Labels:          map[string]string{v1.LabelCluster: c.Name, v1.LabelPool: name, v1.LabelRole: spec.Role},
					Annotations:     map[string]string{v1.AnnotationAppliedReplicas: strconv.Itoa(int(want))},
					OwnerReferences: []metav1.OwnerReference{ownerRef(c, "TandemCluster")}},
				Spec: spec,
			}
			if err := r.Client.Create(ctx, &p); err != nil {
				if apierrors.IsAlreadyExists(err) {
					// A pool of that name not owned by c: the previous cluster's, still
					// draining its pods. Try again when it has gone.
					continue
				}
				return nil, fmt.Errorf("create pool %s: %w", name, err)
			}
			out = append(out, p)
			continue
		}
		p := have[idx]
		before := p.DeepCopy()
		// The cluster's replicas win only when they changed since last applied: in
		// between, the scale subresource (planner, kubectl scale, an HPA) owns the size.
		if p.Annotations[v1.AnnotationAppliedReplicas] != strconv.Itoa(int(want)) {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[v1.AnnotationAppliedReplicas] = strconv.Itoa(int(want))
		} else {
			spec.Replicas = p.Spec.Replicas
		}
		p.Spec = spec
		if !equalObjects(before, &p) {
			if err := r.Client.Update(ctx, &p); err != nil {
				return nil, fmt.Errorf("update pool %s: %w", name, err)
			}
		}
		out = append(out, p)
	}
	for i := range have {
		if !keep[have[i].Name] {
			if err := r.Client.Delete(ctx, &have[i]); client.IgnoreNotFound(err) != nil {
				return nil, fmt.Errorf("delete pool %s: %w", have[i].Name, err)
			}
		}
	}
	return out, nil
}

func roleOf(p *v1.PoolSpec) string {
	if p.Role == "" {
		return v1.RoleBoth
	}
	return p.Role
}

// finalize deletes the pools first (each drains and deletes its pods), then the routers
// and the Secrets, then lets the cluster go: nothing is left behind even where no
// garbage collector runs.
func (r *ClusterReconciler) finalize(ctx context.Context, c *v1.TandemCluster) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(c, v1.Finalizer) {
		return ctrl.Result{}, nil
	}
	pools, err := r.ownPools(ctx, c)
	if err != nil {
		return ctrl.Result{}, err
	}
	for i := range pools {
		if pools[i].DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, &pools[i]); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if len(pools) > 0 {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	for _, obj := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: routerName(c)}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: routerName(c)}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: plannerBindingName(c)}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: routerName(c)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: caSecretName(c)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: joinSecretName(c)}},
	} {
		if err := r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("delete %s: %w", obj.GetName(), err)
		}
	}
	controllerutil.RemoveFinalizer(c, v1.Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, c))
}

func (r *ClusterReconciler) updateStatus(ctx context.Context, c *v1.TandemCluster, dep *appsv1.Deployment, pools []v1.TandemPool) error {
	st := v1.ClusterStatus{ObservedGeneration: c.Generation, Conditions: slices.Clone(c.Status.Conditions),
		RouterReady: dep.Status.ReadyReplicas}
	if dep.Spec.Replicas != nil {
		st.RouterReplicas = *dep.Spec.Replicas
	}
	set := func(typ string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: c.Generation})
	}
	routerOK := dep.Status.ReadyReplicas > 0
	if routerOK {
		set(v1.ConditionRouterReady, true, "RoutersReady", fmt.Sprintf("%d of %d routers ready", dep.Status.ReadyReplicas, st.RouterReplicas))
	} else {
		set(v1.ConditionRouterReady, false, "RoutersStarting", "no router ready yet: engine pools wait for one")
	}
	poolsOK := len(pools) == len(c.Spec.Pools)
	var waiting []string
	for _, p := range pools {
		st.Pools = append(st.Pools, v1.PoolStatusEntry{Name: p.Name, Role: p.Spec.Role, Target: p.Spec.Replicas, Ready: p.Status.ReadyReplicas})
		if p.Status.ObservedGeneration != p.Generation {
			poolsOK = false
			waiting = append(waiting, p.Name+" not yet reconciled")
		} else if p.Status.ReadyReplicas < p.Spec.Replicas || p.Status.UpdatedReplicas < p.Spec.Replicas || p.Status.Replicas != p.Spec.Replicas {
			poolsOK = false
			waiting = append(waiting, fmt.Sprintf("%s %d/%d ready", p.Name, p.Status.ReadyReplicas, p.Spec.Replicas))
		}
		if cond := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionPlaced); cond != nil && cond.Status == metav1.ConditionFalse {
			poolsOK = false
			waiting = append(waiting, p.Name+": "+cond.Message)
		}
	}
	switch {
	case poolsOK:
		set(v1.ConditionPoolsReady, true, "PoolsReady", "every pool has its replicas ready")
	case len(pools) < len(c.Spec.Pools):
		set(v1.ConditionPoolsReady, false, "PoolsPending", fmt.Sprintf("%d of %d pools made", len(pools), len(c.Spec.Pools)))
	default:
		set(v1.ConditionPoolsReady, false, "PoolsScaling", fmt.Sprint(waiting))
	}
	set(v1.ConditionReady, routerOK && poolsOK, map[bool]string{true: "Ready", false: "NotReady"}[routerOK && poolsOK], "routers and pools ready")
	if st.ObservedGeneration == c.Status.ObservedGeneration && equalObjects(&v1.TandemCluster{Status: st}, &v1.TandemCluster{Status: c.Status}) {
		return nil
	}
	c.Status = st
	if err := r.Client.Status().Update(ctx, c); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update status of cluster %s: %w", c.Name, err)
	}
	return nil
}
