package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"tandem/deploy"
	"tandem/internal/k8stest"
)

// The package's tests share one real API server (no controller manager, no scheduler, no
// kubelet: the fakes below stand in for them, as KWOK does), each test in a namespace
// of its own with an operator of its own watching only that namespace.
var (
	restConfig *rest.Config
	testScheme *runtime.Scheme
	direct     client.Client // uncached
	server     *k8stest.Server
	routersUp  sync.Map // namespace -> true: the fake deployment controller readies routers there
	nsSeq      atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctrllog.SetLogger(logr.Discard())
	bin, err := k8stest.Binary(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "tandem-k8s-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	server, err = k8stest.Start(ctx, bin, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer server.Stop()
	restConfig = &rest.Config{Host: server.URL, BearerToken: server.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: server.CAData}, QPS: 200, Burst: 400}
	if testScheme, err = NewScheme(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if direct, err = client.New(restConfig, client.Options{Scheme: testScheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := installCRDs(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); fakeCluster(ctx) }()
	code := m.Run()
	cancel()
	wg.Wait()
	return code
}

// installCRDs applies deploy/crd and waits until the server serves them.
func installCRDs(ctx context.Context) error {
	entries, err := deploy.Files.ReadDir("crd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		b, err := deploy.Files.ReadFile("crd/" + e.Name())
		if err != nil {
			return err
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		if err := direct.Create(ctx, &u); err != nil {
			return fmt.Errorf("create %s: %w", e.Name(), err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var pools, clusters unstructured.UnstructuredList
		pools.SetAPIVersion("tandem.dev/v1alpha1")
		pools.SetKind("TandemPoolList")
		clusters.SetAPIVersion("tandem.dev/v1alpha1")
		clusters.SetKind("TandemClusterList")
		err1 := direct.List(ctx, &pools)
		err2 := direct.List(ctx, &clusters)
		if err1 == nil && err2 == nil {
			// A fresh client: the first one's discovery may have cached the absence.
			direct, err = client.New(restConfig, client.Options{Scheme: testScheme})
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRDs not served: %v, %v", err1, err2)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fakeCluster stands in for the parts of Kubernetes the API server alone lacks, as KWOK
// does: a scheduler binding unbound pods to a node named fake, a kubelet that marks
// bound pods running and ready and finishes their deletion (the drain is the engine's,
// tested elsewhere), and a deployment controller readying routers where routersUp says.
func fakeCluster(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	ip := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var pods corev1.PodList
		if err := direct.List(ctx, &pods); err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				switch {
				case !p.DeletionTimestamp.IsZero():
					direct.Delete(ctx, p, client.GracePeriodSeconds(0))
				case p.Spec.NodeName == "":
					direct.SubResource("binding").Create(ctx, p, &corev1.Binding{
						ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
						Target:     corev1.ObjectReference{Kind: "Node", Name: "fake"}})
				case (p.Status.Phase == "" || p.Status.Phase == corev1.PodPending) && p.Labels["fake/keep-pending"] == "":
					ip++
					p.Status.Phase = corev1.PodRunning
					p.Status.PodIP = fmt.Sprintf("10.1.%d.%d", ip/250, ip%250+1)
					p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
					direct.Status().Update(ctx, p)
				}
			}
		}
		var deps appsv1.DeploymentList
		if err := direct.List(ctx, &deps); err == nil {
			for i := range deps.Items {
				d := &deps.Items[i]
				if _, up := routersUp.Load(d.Namespace); !up || d.Spec.Replicas == nil {
					continue
				}
				n := *d.Spec.Replicas
				if d.Status.ReadyReplicas == n && d.Status.ObservedGeneration == d.Generation {
					continue
				}
				d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas, d.Status.UpdatedReplicas = n, n, n, n
				d.Status.ObservedGeneration = d.Generation
				direct.Status().Update(ctx, d)
			}
		}
	}
}

// newNamespace makes a namespace for one test.
func newNamespace(t *testing.T, routers bool) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	if len(name) > 60 {
		name = name[:60]
	}
	name = strings.TrimRight(name, "-")
	if err := direct.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	if routers {
		routersUp.Store(name, true)
	}
	return name
}

// startOperator runs the operator on namespace ns until the returned stop is called
// (or the test ends).
func startOperator(t *testing.T, ns string) (stop func()) {
	t.Helper()
	return startOperatorAs(t, restConfig, ns)
}

// startOperatorAs is startOperator with the operator's credentials in cfg.
func startOperatorAs(t *testing.T, cfg *rest.Config, ns string) (stop func()) {
	t.Helper()
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 testScheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skip},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if err := Setup(mgr, log, m); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("operator: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually retries f every 100ms until it returns nil, failing the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func isInvalid(err error) bool { return apierrors.IsInvalid(err) }
