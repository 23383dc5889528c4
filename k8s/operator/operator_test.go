package operator

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"tandem/deploy"
	v1 "tandem/k8s/api/v1alpha1"
	"tandem/k8s/connector"
	"tandem/orpc"
)

// sample is deploy/samples/tandemcluster.yaml in namespace ns, decoded strictly: a field
// the Go types lack fails here.
func sample(t *testing.T, ns string) *v1.TandemCluster {
	t.Helper()
	b, err := deploy.Files.ReadFile("samples/tandemcluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c v1.TandemCluster
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("sample: %v", err)
	}
	c.Namespace = ns
	return &c
}

func getCluster(t *testing.T, ns, name string) *v1.TandemCluster {
	t.Helper()
	var c v1.TandemCluster
	if err := direct.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

func listPods(ctx context.Context, ns string, labels client.MatchingLabels) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := direct.List(ctx, &pods, client.InNamespace(ns), labels); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// livePods are the pods not being deleted.
func livePods(ctx context.Context, ns string, labels client.MatchingLabels) ([]corev1.Pod, error) {
	pods, err := listPods(ctx, ns, labels)
	return slices.DeleteFunc(pods, func(p corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() }), err
}

func condition(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return string(c.Status) + " " + c.Reason + ": " + c.Message
	}
	return "missing"
}

func isControlledBy(obj metav1.Object, owner metav1.Object) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == owner.GetUID()
}

// waitReady waits for the cluster's Ready condition, reported for its current spec and
// its pools' (each pool's status of its current spec, all its replicas ready).
func waitReady(t *testing.T, ns, name string) *v1.TandemCluster {
	t.Helper()
	var c *v1.TandemCluster
	eventually(t, 60*time.Second, "cluster ready", func() error {
		c = getCluster(t, ns, name)
		if !meta.IsStatusConditionTrue(c.Status.Conditions, v1.ConditionReady) || c.Status.ObservedGeneration != c.Generation {
			return fmt.Errorf("Ready %s; PoolsReady %s", condition(c.Status.Conditions, v1.ConditionReady), condition(c.Status.Conditions, v1.ConditionPoolsReady))
		}
		var pools v1.TandemPoolList
		if err := direct.List(context.Background(), &pools, client.InNamespace(ns), client.MatchingLabels{v1.LabelCluster: name}); err != nil {
			return err
		}
		for _, p := range pools.Items {
			if p.Status.ObservedGeneration != p.Generation || p.Status.ReadyReplicas != p.Spec.Replicas || p.Status.Replicas != p.Spec.Replicas {
				return fmt.Errorf("pool %s: %d/%d ready, status of generation %d of %d", p.Name, p.Status.ReadyReplicas, p.Spec.Replicas, p.Status.ObservedGeneration, p.Generation)
			}
			for _, st := range c.Status.Pools {
				if st.Name == p.Name && (st.Target != p.Spec.Replicas || st.Ready != p.Status.ReadyReplicas) {
					return fmt.Errorf("cluster status of pool %s: %+v, pool %d/%d", p.Name, st, p.Status.ReadyReplicas, p.Spec.Replicas)
				}
			}
		}
		return nil
	})
	return c
}

// updateCluster applies edit to the cluster, retrying on conflicts with the operator's writes.
func updateCluster(t *testing.T, ns, name string, edit func(*v1.TandemCluster)) {
	t.Helper()
	eventually(t, 10*time.Second, "update cluster", func() error {
		c := getCluster(t, ns, name)
		edit(c)
		return direct.Update(context.Background(), c)
	})
}

func TestSampleClusterBecomesRoutersPoolsAndSecrets(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, false) // routers held unready at first
	startOperator(t, ns)
	c := sample(t, ns)
	if err := direct.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	// What the API server stored is what was sent: the schema prunes nothing the types have.
	stored := getCluster(t, ns, c.Name)
	if !equalObjects(&v1.TandemCluster{Spec: stored.Spec}, &v1.TandemCluster{Spec: c.Spec}) {
		t.Errorf("stored spec differs from the sample's:\n got %+v\nwant %+v", stored.Spec, c.Spec)
	}

	// Routers before engines: no pool while no router is ready.
	eventually(t, 30*time.Second, "router deployment", func() error {
		return direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &appsv1.Deployment{})
	})
	time.Sleep(time.Second)
	var pools v1.TandemPoolList
	if err := direct.List(ctx, &pools, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pools.Items) != 0 {
		t.Fatalf("%d pools made before a router was ready", len(pools.Items))
	}
	if got := condition(getCluster(t, ns, c.Name).Status.Conditions, v1.ConditionRouterReady); !strings.HasPrefix(got, "False") {
		t.Errorf("RouterReady = %s, want False", got)
	}
	routersUp.Store(ns, true)
	c = waitReady(t, ns, c.Name)

	// Secrets: the CA (a certificate and its key) and a join token, owned by the cluster.
	var caSecret, joinSecret corev1.Secret
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-ca"}, &caSecret); err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caSecret.Data[orpc.CACertFile])
	if block == nil {
		t.Fatal("CA secret: no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !cert.IsCA {
		t.Fatalf("CA secret: %v (IsCA %v)", err, cert != nil && cert.IsCA)
	}
	if len(caSecret.Data[orpc.CAKeyFile]) == 0 {
		t.Error("CA secret: no key")
	}
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-join"}, &joinSecret); err != nil {
		t.Fatal(err)
	}
	if _, err := orpc.ParseToken(string(joinSecret.Data["token"])); err != nil {
		t.Errorf("join secret: %v", err)
	}

	// The routers: a Deployment and a Service, both owned by the cluster.
	var dep appsv1.Deployment
	var svc corev1.Service
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &dep); err != nil {
		t.Fatal(err)
	}
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &svc); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []metav1.Object{&caSecret, &joinSecret, &dep, &svc} {
		if !isControlledBy(obj, c) {
			t.Errorf("%s is not owned by the cluster: %v", obj.GetName(), obj.GetOwnerReferences())
		}
	}
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--join-token $(TANDEM_JOIN_TOKEN)") {
		t.Errorf("router args %q lack the join token", args)
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s/%d/%s", p.Name, p.Port, p.Protocol))
	}
	if want := []string{"http/8000/TCP", "orpc/7001/UDP"}; !slices.Equal(ports, want) {
		t.Errorf("service ports %v, want %v", ports, want)
	}

	// A NodePort service keeps the ports the server gave it across reconciles.
	updateCluster(t, ns, c.Name, func(c *v1.TandemCluster) { c.Spec.Router.ServiceType = corev1.ServiceTypeNodePort })
	var nodePorts []int32
	eventually(t, 30*time.Second, "node ports", func() error {
		if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &svc); err != nil {
			return err
		}
		nodePorts = nil
		for _, p := range svc.Spec.Ports {
			if p.NodePort == 0 {
				return fmt.Errorf("port %s has no node port", p.Name)
			}
			nodePorts = append(nodePorts, p.NodePort)
		}
		return nil
	})
	updateCluster(t, ns, c.Name, func(c *v1.TandemCluster) { c.Spec.Router.Args = []string{"--log-level", "debug"} })
	eventually(t, 30*time.Second, "router args updated", func() error {
		if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &dep); err != nil {
			return err
		}
		if !strings.Contains(strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "), "--log-level debug") {
			return fmt.Errorf("args %v", dep.Spec.Template.Spec.Containers[0].Args)
		}
		return nil
	})
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &svc); err != nil {
		t.Fatal(err)
	}
	for i, p := range svc.Spec.Ports {
		if p.NodePort != nodePorts[i] {
			t.Errorf("port %s moved from node port %d to %d", p.Name, nodePorts[i], p.NodePort)
		}
	}

	// The pool and its two engines.
	var pool v1.TandemPool
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-engines"}, &pool); err != nil {
		t.Fatal(err)
	}
	if !isControlledBy(&pool, c) {
		t.Errorf("pool not owned by the cluster: %v", pool.OwnerReferences)
	}
	pods, err := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: pool.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 {
		t.Fatalf("%d engine pods, want 2", len(pods))
	}
	for _, p := range pods {
		if !isControlledBy(&p, &pool) {
			t.Errorf("pod %s not owned by the pool", p.Name)
		}
		args := strings.Join(p.Spec.Containers[0].Args, " ")
		for _, want := range []string{"--role both", "--model /models/qwen2.5-0.5b-instruct-q8_0.gguf", "--join demo-router." + ns + ".svc:7001",
			"--drain-timeout 30s", "--kv-cache-memory 2GiB", "--served-model-name qwen"} {
			if !strings.Contains(args, want) {
				t.Errorf("pod %s args %q lack %q", p.Name, args, want)
			}
		}
		if g := *p.Spec.TerminationGracePeriodSeconds; g != 45 {
			t.Errorf("pod %s grace period %ds, want 45 (drain 30s + 15s)", p.Name, g)
		}
	}
	if len(c.Status.Pools) != 1 || c.Status.Pools[0].Ready != 2 || c.Status.Pools[0].Target != 2 {
		t.Errorf("status pools %+v, want demo-engines 2/2", c.Status.Pools)
	}
}

// smallCluster is a cluster of one pool of role both with n replicas.
func smallCluster(ns, name string, n int32) *v1.TandemCluster {
	return &v1.TandemCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ClusterSpec{Image: "tandem:test", Model: &v1.ModelSource{Path: "/m.gguf"},
			Pools: []v1.PoolSpec{{Name: "p", Role: v1.RoleBoth, Replicas: &n}}},
	}
}

func TestScaleSubresourceAndPlannerConnector(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, true)
	startOperator(t, ns)
	c := smallCluster(ns, "sc", 1)
	if err := direct.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "sc")
	waitPods := func(n int) []corev1.Pod {
		t.Helper()
		var pods []corev1.Pod
		eventually(t, 30*time.Second, fmt.Sprintf("%d pods", n), func() error {
			var err error
			pods, err = livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "sc-p"})
			if err == nil && len(pods) != n {
				err = fmt.Errorf("%d pods", len(pods))
			}
			return err
		})
		return pods
	}
	waitPods(1)

	// kubectl scale's path: a merge patch of the scale subresource.
	pool := &v1.TandemPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sc-p"}}
	if err := direct.SubResource("scale").Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`))); err != nil {
		t.Fatal(err)
	}
	waitPods(3)
	c = waitReady(t, ns, "sc")
	if c.Status.Pools[0].Target != 3 {
		t.Errorf("cluster status target %d, want 3 (the scale subresource's)", c.Status.Pools[0].Target)
	}

	// The planner's connector: the same subresource, victims first.
	conn, err := connector.New(connector.Config{Server: server.URL, Token: server.Token, CAData: server.CAData, Namespace: ns, Cluster: "sc"})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := conn.Replicas(ctx, "both")
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 3 {
		t.Fatalf("connector sees %d replicas, want 3: %+v", len(reps), reps)
	}
	victim := reps[1].Name
	if err := conn.Scale(ctx, "both", 1, []string{victim}); err != nil {
		t.Fatal(err)
	}
	pods := waitPods(1)
	if pods[0].Name == victim {
		t.Errorf("the planner's victim %s stayed", victim)
	}
	if _, err := conn.Replicas(ctx, "prefill"); err == nil || !strings.Contains(err.Error(), "no prefill pool") {
		t.Errorf("Replicas(prefill) = %v, want an error saying there is no prefill pool", err)
	}
	if err := conn.Scale(ctx, "both", -1, nil); err == nil {
		t.Error("Scale(-1) succeeded")
	}

	// The cluster spec's replicas win again only when they change there.
	two := int32(2)
	updateCluster(t, ns, "sc", func(c *v1.TandemCluster) { c.Spec.Pools[0].Replicas = &two })
	waitPods(2)
}

// twelveNodes makes the nodes: 12, 4 a rack, racks a and b in zone z1 and c in
// z2, one GPU each.
func twelveNodes(t *testing.T, prefix string) {
	t.Helper()
	ctx := context.Background()
	for i := range 12 {
		rack := string(rune('a' + i/4))
		zone := "z1"
		if rack == "c" {
			zone = "z2"
		}
		name := fmt.Sprintf("%s%02d", prefix, i)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"tandem.dev/rack": rack, "topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name, "test/gang": prefix}}}
		if err := direct.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		// As KWOK does: the node is ready, and the not-ready taint the API server
		// puts on new nodes is lifted (the node lifecycle controller's job).
		n.Spec.Taints = nil
		if err := direct.Update(ctx, n); err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
			corev1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": resource.MustParse("1")}
		n.Status.Capacity = n.Status.Allocatable
		if err := direct.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The operator has stopped (cleanups run last first): free the nodes of every
		// pod bound to them, so that a later test's gangs find them empty.
		var pods corev1.PodList
		if err := direct.List(context.Background(), &pods); err == nil {
			for i := range pods.Items {
				if strings.HasPrefix(pods.Items[i].Spec.NodeName, prefix) {
					direct.Delete(context.Background(), &pods.Items[i], client.GracePeriodSeconds(0))
				}
			}
		}
		for i := range 12 {
			direct.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%02d", prefix, i)}})
		}
	})
}

// gangCluster is a cluster of one pool of 4-pod gangs of one GPU each, on the nodes
// twelveNodes made with prefix ns's test's.
func gangCluster(ns, name string, replicas int32, topo []v1.TopologyLevel) *v1.TandemCluster {
	prefix := name
	if name == "req" || name == "pref" {
		prefix = "gpu"
	}
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("1")}
	return &v1.TandemCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ClusterSpec{Image: "tandem:test", Model: &v1.ModelSource{Path: "/m.gguf"},
			Pools: []v1.PoolSpec{{Name: "g", Replicas: &replicas, NodeSelector: map[string]string{"test/gang": prefix},
				Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu},
				Gang:      &v1.GangSpec{Size: 4, Topology: topo}}}},
	}
}

// racksOf returns the rack of each of the gang's pods, by replica.
func racksOf(t *testing.T, pods []corev1.Pod) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			t.Fatalf("pod %s not placed", p.Name)
		}
		var n corev1.Node
		if err := direct.Get(context.Background(), types.NamespacedName{Name: p.Spec.NodeName}, &n); err != nil {
			t.Fatal(err)
		}
		r := p.Labels[v1.LabelReplica]
		out[r] = append(out[r], n.Labels["tandem.dev/rack"])
	}
	return out
}

func TestGangPlacementOnTwelveNodes(t *testing.T) {
	ctx := context.Background()
	twelveNodes(t, "gpu")
	ns := newNamespace(t, true)
	startOperator(t, ns)
	required := []v1.TopologyLevel{{Key: "tandem.dev/rack", Mode: v1.PlacementRequired}, {Key: "topology.kubernetes.io/zone", Mode: v1.PlacementRequired}}
	preferred := []v1.TopologyLevel{{Key: "tandem.dev/rack", Mode: v1.PlacementPreferred}, {Key: "topology.kubernetes.io/zone", Mode: v1.PlacementPreferred}}

	// A 4-pod gang lands in one rack.
	if err := direct.Create(ctx, gangCluster(ns, "req", 1, required)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "req")
	pods, err := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "req-g"})
	if err != nil {
		t.Fatal(err)
	}
	racks := racksOf(t, pods)
	if len(pods) != 4 || len(racks["0"]) != 4 || slices.Compact(slices.Clone(racks["0"]))[0] != racks["0"][3] {
		t.Fatalf("the first gang: racks %v, want 4 pods in one rack", racks)
	}
	first := racks["0"][0]

	// Take one GPU in each other rack: no rack has room for 4.
	var blockers []*corev1.Pod
	for _, node := range map[string]string{"a": "gpu00", "b": "gpu04", "c": "gpu08"} {
		var n corev1.Node
		direct.Get(ctx, types.NamespacedName{Name: node}, &n)
		if n.Labels["tandem.dev/rack"] == first {
			continue
		}
		gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		b := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "blocker-" + node, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "x", Image: "x",
				Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu}}}}}
		if err := direct.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		blockers = append(blockers, b)
	}

	// A second gang of the required pool waits, creating none of its pods.
	pool := &v1.TandemPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "req-g"}}
	if err := direct.SubResource("scale").Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":2}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the second gang waits", func() error {
		if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "req-g"}, pool); err != nil {
			return err
		}
		if got := condition(pool.Status.Conditions, v1.ConditionPlaced); !strings.HasPrefix(got, "False GangWaiting") || !strings.Contains(got, "tandem.dev/rack") {
			return fmt.Errorf("Placed = %s", got)
		}
		return nil
	})
	if got := condition(getCluster(t, ns, "req").Status.Conditions, v1.ConditionReady); !strings.HasPrefix(got, "False") {
		// The cluster's status follows the pool's on its next reconcile.
		eventually(t, 10*time.Second, "cluster not ready", func() error {
			if got := condition(getCluster(t, ns, "req").Status.Conditions, v1.ConditionReady); !strings.HasPrefix(got, "False") {
				return fmt.Errorf("Ready = %s", got)
			}
			return nil
		})
	}
	time.Sleep(2 * time.Second)
	if pods, _ := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "req-g"}); len(pods) != 4 {
		t.Fatalf("%d pods while the second gang waits, want the first gang's 4 (no partial placement)", len(pods))
	}

	// A gang whose levels are all preferred spreads across racks.
	if err := direct.Create(ctx, gangCluster(ns, "pref", 1, preferred)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "pref")
	pods, _ = livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "pref-g"})
	racks = racksOf(t, pods)
	if spread := slices.Compact(slices.Sorted(slices.Values(racks["0"]))); len(pods) != 4 || len(spread) < 2 {
		t.Fatalf("the preferred gang: racks %v, want 4 pods over several racks", racks)
	}

	// Room opens in one rack (the preferred cluster goes, and a blocker): the waiting gang lands there whole.
	if err := direct.Delete(ctx, getCluster(t, ns, "pref")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the preferred cluster's pods gone", func() error {
		pods, err := listPods(ctx, ns, client.MatchingLabels{v1.LabelPool: "pref-g"})
		if err == nil && len(pods) > 0 {
			err = fmt.Errorf("%d pods", len(pods))
		}
		return err
	})
	if err := direct.Delete(ctx, blockers[0], client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "req")
	pods, _ = livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "req-g"})
	racks = racksOf(t, pods)
	for r, rs := range racks {
		if len(rs) != 4 || slices.Compact(slices.Clone(rs))[0] != rs[3] {
			t.Errorf("replica %s: racks %v, want 4 pods in one rack", r, rs)
		}
	}
	if len(racks) != 2 {
		t.Errorf("replicas %v, want 2", racks)
	}
}

func TestRolloutAndDeletionLeaveNoOrphans(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, true)
	startOperator(t, ns)
	c := smallCluster(ns, "ro", 2)
	if err := direct.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "ro")
	old, _ := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "ro-p"})
	oldHash := old[0].Labels[v1.LabelTemplateHash]

	// New engine flags: a rolling update, one replica of surge at most.
	updateCluster(t, ns, "ro", func(c *v1.TandemCluster) { c.Spec.Pools[0].EngineArgs = []string{"--max-seqs", "8"} })
	most := 0
	eventually(t, 60*time.Second, "rollout done", func() error {
		pods, err := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "ro-p"})
		if err != nil {
			return err
		}
		most = max(most, len(pods))
		for _, p := range pods {
			if p.Labels[v1.LabelTemplateHash] == oldHash {
				return fmt.Errorf("pod %s of the old template left", p.Name)
			}
		}
		if len(pods) != 2 {
			return fmt.Errorf("%d pods", len(pods))
		}
		return nil
	})
	if most > 3 {
		t.Errorf("%d pods at once during the rollout, want at most 3 (2 and one of surge)", most)
	}
	waitReady(t, ns, "ro")

	// Deleting the cluster leaves nothing of it.
	if err := direct.Delete(ctx, getCluster(t, ns, "ro")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "cluster gone", func() error {
		err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ro"}, &v1.TandemCluster{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	assertEmpty(t, ns)
}

// TestReplacedClusterLeavesNoOrphans deletes a cluster and makes it again at once under
// the same name: the new one waits for the old pool to go, and every pod left is the new
// pool's.
func TestReplacedClusterLeavesNoOrphans(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, true)
	startOperator(t, ns)
	if err := direct.Create(ctx, smallCluster(ns, "rp", 3)); err != nil {
		t.Fatal(err)
	}
	old := waitReady(t, ns, "rp")
	if err := direct.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "make it again", func() error {
		return direct.Create(ctx, smallCluster(ns, "rp", 2))
	})
	c := waitReady(t, ns, "rp")
	if c.UID == old.UID {
		t.Fatal("the old cluster is still there")
	}
	var pool v1.TandemPool
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rp-p"}, &pool); err != nil {
		t.Fatal(err)
	}
	if !isControlledBy(&pool, c) {
		t.Fatalf("pool owned by %v, not the new cluster", pool.OwnerReferences)
	}
	pods, err := listPods(ctx, ns, client.MatchingLabels{v1.LabelCluster: "rp"})
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, p := range pods {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		live++
		if !isControlledBy(&p, &pool) {
			t.Errorf("pod %s is not the new pool's: %v", p.Name, p.OwnerReferences)
		}
	}
	if live != 2 {
		t.Errorf("%d pods, want the new cluster's 2", live)
	}
}

// assertEmpty fails unless ns holds no pod, pool, deployment, service or secret of the operator.
func assertEmpty(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	var pods corev1.PodList
	var pools v1.TandemPoolList
	var deps appsv1.DeploymentList
	var svcs corev1.ServiceList
	var secrets corev1.SecretList
	var sas corev1.ServiceAccountList
	var rbs rbacv1.RoleBindingList
	for _, l := range []client.ObjectList{&pods, &pools, &deps, &svcs, &secrets, &sas, &rbs} {
		if err := direct.List(ctx, l, client.InNamespace(ns), client.HasLabels{v1.LabelCluster}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(pods.Items) + len(pools.Items) + len(deps.Items) + len(svcs.Items) + len(secrets.Items) + len(sas.Items) + len(rbs.Items); n > 0 {
		t.Errorf("left behind: %d pods, %d pools, %d deployments, %d services, %d secrets, %d service accounts, %d role bindings",
			len(pods.Items), len(pools.Items), len(deps.Items), len(svcs.Items), len(secrets.Items), len(sas.Items), len(rbs.Items))
	}
}

func TestOperatorRestartedMidReconcileConverges(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, true)
	stop := startOperator(t, ns)
	if err := direct.Create(ctx, smallCluster(ns, "rs", 4)); err != nil {
		t.Fatal(err)
	}
	// Stop the operator as soon as it has begun on the pods, and leave a pod with the
	// pool's labels that the pool does not own.
	eventually(t, 30*time.Second, "first pod", func() error {
		pods, err := listPods(ctx, ns, client.MatchingLabels{v1.LabelPool: "rs-p"})
		if err == nil && len(pods) == 0 {
			err = fmt.Errorf("no pod yet")
		}
		return err
	})
	stop()
	before, err := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "rs-p"})
	if err != nil {
		t.Fatal(err)
	}
	stray := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: ns, Labels: map[string]string{v1.LabelPool: "rs-p", "fake/keep-pending": "yes"}},
		Spec: corev1.PodSpec{NodeName: "fake", Containers: []corev1.Container{{Name: "x", Image: "x"}}}}
	if err := direct.Create(ctx, stray); err != nil {
		t.Fatal(err)
	}

	startOperator(t, ns)
	waitReady(t, ns, "rs")
	pods, _ := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "rs-p", v1.LabelCluster: "rs"})
	if len(pods) != 4 {
		t.Errorf("%d pods after the restart, want 4", len(pods))
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Labels[v1.LabelReplica]] = true
	}
	if len(names) != 4 {
		t.Errorf("replicas %v, want 4 distinct", names)
	}
	if err := direct.Get(ctx, client.ObjectKeyFromObject(stray), stray); err != nil {
		t.Errorf("the pod the pool does not own was touched: %v", err)
	}
	// The pods made before the restart are kept: a restarted (or upgraded) operator
	// rendering the same pods restarts none.
	for _, b := range before {
		if !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.UID == b.UID }) {
			t.Errorf("pod %s, made before the restart, was replaced", b.Name)
		}
	}
	direct.Delete(ctx, stray, client.GracePeriodSeconds(0))
}

func TestGangHalfMadeIsCompleted(t *testing.T) {
	ctx := context.Background()
	twelveNodes(t, "half")
	ns := newNamespace(t, true)
	stop := startOperator(t, ns)
	c := gangCluster(ns, "half", 0, []v1.TopologyLevel{{Key: "tandem.dev/rack", Mode: v1.PlacementRequired}})
	if err := direct.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	pool := &v1.TandemPool{}
	eventually(t, 30*time.Second, "pool made", func() error {
		return direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "half-g"}, pool)
	})
	stop()
	// What an operator stopped between two creates leaves: one member of a gang placed on
	// rack b; then the pool is scaled to one replica.
	rackB := []string{"half04", "half05", "half06", "half07"}
	if err := direct.Create(ctx, replicaPod(pool, templateHash(&pool.Spec), 0, 0, rackB)); err != nil {
		t.Fatal(err)
	}
	if err := direct.SubResource("scale").Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":1}}`))); err != nil {
		t.Fatal(err)
	}
	startOperator(t, ns)
	waitReady(t, ns, "half")
	members := func() map[string]corev1.Pod {
		t.Helper()
		pods, _ := livePods(ctx, ns, client.MatchingLabels{v1.LabelPool: "half-g"})
		out := map[string]corev1.Pod{}
		for _, p := range pods {
			out[p.Annotations[v1.AnnotationGangMember]] = p
		}
		return out
	}
	before := members()
	for m, node := range rackB {
		if p, ok := before[fmt.Sprint(m)]; !ok || p.Spec.NodeName != node {
			t.Fatalf("member %d on %q, want %s (completed where the gang was placed): %v", m, p.Spec.NodeName, node, before)
		}
	}

	// A member lost is made again on its node; the others stay.
	victim := before["2"]
	if err := direct.Delete(ctx, &victim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "member made again", func() error {
		now := members()
		if p, ok := now["2"]; !ok || p.UID == victim.UID || p.Spec.NodeName != "half06" {
			return fmt.Errorf("member 2: %v", now["2"].Spec.NodeName)
		}
		if now["0"].UID != before["0"].UID {
			return fmt.Errorf("member 0 replaced")
		}
		return nil
	})

	// A member failed breaks the gang: all of it is replaced.
	failed := members()["1"]
	failed.Status.Phase = corev1.PodFailed
	if err := direct.Status().Update(ctx, &failed); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "gang replaced", func() error {
		now := members()
		if len(now) != 4 {
			return fmt.Errorf("%d members", len(now))
		}
		for m, p := range now {
			if p.UID == before["0"].UID || p.UID == failed.UID {
				return fmt.Errorf("member %s of the broken gang still there", m)
			}
		}
		return nil
	})
	waitReady(t, ns, "half")
}

// TestManifestsApplyAndRBACSuffices applies deploy/'s kustomization (the API server
// validates every object), then runs the operator as its service account, impersonated,
// so that a rule missing from deploy/operator/rbac.yaml fails the sample cluster.
func TestManifestsApplyAndRBACSuffices(t *testing.T) {
	ctx := context.Background()
	b, err := deploy.Files.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kust struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(b, &kust); err != nil {
		t.Fatal(err)
	}
	for _, res := range kust.Resources {
		b, err := deploy.Files.ReadFile(res)
		if err != nil {
			t.Fatalf("kustomization lists %s: %v", res, err)
		}
		if strings.HasPrefix(res, "crd/") {
			continue // installed by TestMain
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s: %v", res, err)
			}
			if err := direct.Create(ctx, &u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: %s %s: %v", res, u.GetKind(), u.GetName(), err)
			}
		}
	}

	ns := newNamespace(t, true)
	cfg := rest.CopyConfig(restConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:tandem-system:tandem-operator",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:tandem-system", "system:authenticated"}}
	startOperatorAs(t, cfg, ns)
	c := sample(t, ns)
	c.Spec.Planner = &v1.PlannerSpec{Enabled: true}
	if err := direct.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, c.Name)

	// The planner enabled: the routers run as their own service account, which the
	// tandem-planner role lets the connector scale pools with.
	var dep appsv1.Deployment
	if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: "demo-router"}, &dep); err != nil {
		t.Fatal(err)
	}
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa != "demo-router" {
		t.Fatalf("routers' service account %q, want demo-router", sa)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo-router"}}
	tr := &authenticationv1.TokenRequest{}
	if err := direct.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}
	conn, err := connector.New(connector.Config{Server: server.URL, Token: tr.Status.Token, CAData: server.CAData, Namespace: ns, Cluster: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := conn.Replicas(ctx, "both")
	if err != nil || len(reps) != 2 {
		t.Fatalf("Replicas as the routers' service account: %v, %v; want 2", reps, err)
	}
	if err := conn.Scale(ctx, "both", 1, []string{reps[0].Name}); err != nil {
		t.Fatalf("Scale as the routers' service account: %v", err)
	}
	waitReady(t, ns, c.Name)
	if got := getCluster(t, ns, c.Name).Status.Pools[0].Target; got != 1 {
		t.Errorf("target %d after the connector's scale, want 1", got)
	}
	if err := direct.Delete(ctx, getCluster(t, ns, c.Name)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "cluster gone", func() error {
		err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: c.Name}, &v1.TandemCluster{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	assertEmpty(t, ns)
}
