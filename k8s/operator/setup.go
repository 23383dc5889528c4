package operator

import (
	"context"
	"log/slog"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	v1 "tandem/k8s/api/v1alpha1"
)

// NewScheme returns a scheme with Kubernetes' built-in types and the operator's.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Setup registers the cluster and pool controllers with mgr.
func Setup(mgr ctrl.Manager, log *slog.Logger, m *Metrics) error {
	cr := &ClusterReconciler{Client: mgr.GetClient(), Log: log, Metrics: m}
	if err := ctrl.NewControllerManagedBy(mgr).Named("tandemcluster").
		For(&v1.TandemCluster{}).
		Owns(&v1.TandemPool{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Complete(cr); err != nil {
		return err
	}
	pr := &PoolReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Log: log, Metrics: m}
	return ctrl.NewControllerManagedBy(mgr).Named("tandempool").
		For(&v1.TandemPool{}).
		Owns(&corev1.Pod{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []ctrl.Request {
			return poolsToWake(ctx, mgr.GetClient())
		})).
		Complete(pr)
}

// equalObjects compares two objects as the API server would store them.
func equalObjects(a, b runtime.Object) bool {
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	return equality.Semantic.DeepEqual(a, b)
}
