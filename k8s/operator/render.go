package operator

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"path"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "tandem/k8s/api/v1alpha1"
)

// Ports and paths inside the pods.
const (
	routerHTTPPort = 8000
	routerORPCPort = 7001
	engineHTTPPort = 8080
	engineORPCPort = 7002
	stateDir       = "/var/lib/tandem"
	modelDir       = "/models"
	// drainMargin is what a pod's termination grace period adds to --drain-timeout: the
	// drain's own bookkeeping after the last request, and the process's exit.
	drainMargin         = 15 * time.Second
	defaultDrainTimeout = 30 * time.Second
)

// Names of a cluster's children: stable, so that a restarted operator finds what it made.
func caSecretName(c *v1.TandemCluster) string       { return c.Name + "-ca" }
func joinSecretName(c *v1.TandemCluster) string     { return c.Name + "-join" }
func routerName(c *v1.TandemCluster) string         { return c.Name + "-router" }
func poolName(c *v1.TandemCluster, p string) string { return c.Name + "-" + p }
func plannerBindingName(c *v1.TandemCluster) string { return c.Name + "-router-planner" }

// PlannerClusterRole is the ClusterRole (deploy/operator/rbac.yaml) a router running the
// planner's connector is bound to in its namespace.
const PlannerClusterRole = "tandem-planner"

func plannerEnabled(c *v1.TandemCluster) bool { return c.Spec.Planner != nil && c.Spec.Planner.Enabled }

// routerServiceAccount is the routers' identity where the planner runs: the planner's
// connector scales the pools with it.
func routerServiceAccount(c *v1.TandemCluster) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: routerName(c), Namespace: c.Namespace,
		Labels: clusterLabels(c, "router"), OwnerReferences: []metav1.OwnerReference{ownerRef(c, "TandemCluster")}}}
}

// plannerBinding grants the routers' service account the planner's role in c's namespace.
func plannerBinding(c *v1.TandemCluster) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: plannerBindingName(c), Namespace: c.Namespace,
			Labels: clusterLabels(c, "router"), OwnerReferences: []metav1.OwnerReference{ownerRef(c, "TandemCluster")}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: PlannerClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: routerName(c), Namespace: c.Namespace}},
	}
}

func clusterLabels(c *v1.TandemCluster, component string) map[string]string {
	return map[string]string{v1.LabelCluster: c.Name, v1.LabelComponent: component}
}

func ownerRef(obj metav1.Object, kind string) metav1.OwnerReference {
	return *metav1.NewControllerRef(obj, v1.GroupVersion.WithKind(kind))
}

func joinTokenEnv(c *v1.TandemCluster) corev1.EnvVar {
	return corev1.EnvVar{Name: "TANDEM_JOIN_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: joinSecretName(c)}, Key: "token"}}}
}

func healthProbe(port int) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt(port)}},
		PeriodSeconds: 5, FailureThreshold: 2,
	}
}

// routerDeployment is the routers of c. The cluster CA reaches the router's state
// directory as two files of the CA Secret, so that every router replica signs with it.
func routerDeployment(c *v1.TandemCluster) *appsv1.Deployment {
	replicas := int32(1)
	if c.Spec.Router.Replicas != nil {
		replicas = *c.Spec.Router.Replicas
	}
	args := []string{"--host", "0.0.0.0", "--port", strconv.Itoa(routerHTTPPort), "--orpc-port", strconv.Itoa(routerORPCPort),
		"--state-dir", stateDir, "--join-token", "$(TANDEM_JOIN_TOKEN)", "--name", "$(POD_NAME)"}
	if p := c.Spec.Planner; p != nil && p.Enabled {
		// The router's planner sizes the pools through their scale subresource; the
		// spec's own planner flags (SLA targets, bounds) follow and may override.
		args = append(args, "--planner", "--planner-connector", "kubernetes")
		args = append(args, p.Args...)
	}
	args = append(args, c.Spec.Router.Args...)
	labels := clusterLabels(c, "router")
	env := []corev1.EnvVar{joinTokenEnv(c), fieldEnv("POD_NAME", "metadata.name")}
	serviceAccount := ""
	if plannerEnabled(c) {
		// What the planner's Kubernetes connector needs to find its pools.
		serviceAccount = routerName(c)
		env = append(env, corev1.EnvVar{Name: "TANDEM_K8S_CLUSTER", Value: c.Name}, fieldEnv("TANDEM_K8S_NAMESPACE", "metadata.namespace"))
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: routerName(c), Namespace: c.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef(c, "TandemCluster")}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: serviceAccount,
					Containers: []corev1.Container{{
						Name: "router", Image: c.Spec.Image, ImagePullPolicy: c.Spec.ImagePullPolicy,
						Command: []string{"tandem-router"}, Args: args,
						Env: env,
						Ports: []corev1.ContainerPort{
							{Name: "http", ContainerPort: routerHTTPPort, Protocol: corev1.ProtocolTCP},
							{Name: "orpc", ContainerPort: routerORPCPort, Protocol: corev1.ProtocolUDP},
						},
						Resources:      c.Spec.Router.Resources,
						ReadinessProbe: healthProbe(routerHTTPPort),
						VolumeMounts: []corev1.VolumeMount{
							{Name: "state", MountPath: stateDir},
							{Name: "ca", MountPath: path.Join(stateDir, "ca.crt"), SubPath: "ca.crt", ReadOnly: true},
							{Name: "ca", MountPath: path.Join(stateDir, "ca.key"), SubPath: "ca.key", ReadOnly: true},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: caSecretName(c)}}},
					},
				},
			},
		},
	}
}

func fieldEnv(name, field string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: field}}}
}

// routerService is the routers' address: the OpenAI API for clients, ORPC for engines.
func routerService(c *v1.TandemCluster) *corev1.Service {
	port := int32(routerHTTPPort)
	if c.Spec.Router.Port != 0 {
		port = c.Spec.Router.Port
	}
	typ := c.Spec.Router.ServiceType
	if typ == "" {
		typ = corev1.ServiceTypeClusterIP
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: routerName(c), Namespace: c.Namespace, Labels: clusterLabels(c, "router"),
			OwnerReferences: []metav1.OwnerReference{ownerRef(c, "TandemCluster")}},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: clusterLabels(c, "router"),
			Ports: []corev1.ServicePort{
				{Name: "http", Port: port, TargetPort: intstr.FromInt(routerHTTPPort), Protocol: corev1.ProtocolTCP},
				{Name: "orpc", Port: routerORPCPort, TargetPort: intstr.FromInt(routerORPCPort), Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// poolTemplate is the pod of one engine of pool p (one member of a gang).
func poolTemplate(c *v1.TandemCluster, p *v1.PoolSpec) corev1.PodTemplateSpec {
	role := p.Role
	if role == "" {
		role = v1.RoleBoth
	}
	drain := defaultDrainTimeout
	if p.DrainTimeout != nil {
		drain = p.DrainTimeout.Duration
	}
	model := p.Model
	if model == nil {
		model = c.Spec.Model
	}
	args := []string{"serve", "--host", "0.0.0.0", "--port", strconv.Itoa(engineHTTPPort),
		"--orpc-port", strconv.Itoa(engineORPCPort), "--advertise", "$(POD_IP):" + strconv.Itoa(engineORPCPort),
		"--node-name", "$(POD_NAME)", "--state-dir", stateDir,
		"--join", fmt.Sprintf("%s.%s.svc:%d", routerName(c), c.Namespace, routerORPCPort), "--join-token", "$(TANDEM_JOIN_TOKEN)",
		"--role", role, "--drain-timeout", drain.String()}
	mounts := []corev1.VolumeMount{{Name: "state", MountPath: stateDir}}
	volumes := []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if model != nil {
		switch {
		case model.PVC != nil:
			args = append(args, "--model", path.Join(modelDir, model.PVC.Path))
			mounts = append(mounts, corev1.VolumeMount{Name: "model", MountPath: modelDir, ReadOnly: true})
			volumes = append(volumes, corev1.Volume{Name: "model", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: model.PVC.ClaimName, ReadOnly: true}}})
		case model.Path != "":
			args = append(args, "--model", model.Path)
		}
		if model.ServedName != "" {
			args = append(args, "--served-model-name", model.ServedName)
		}
	}
	if kv := c.Spec.KVCache; kv != nil && kv.Memory != "" {
		args = append(args, "--kv-cache-memory", kv.Memory)
	}
	args = append(args, p.EngineArgs...)
	grace := int64((drain + drainMargin) / time.Second)
	labels := clusterLabels(c, "engine")
	labels[v1.LabelRole] = role
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			// SIGTERM starts the engine's ordered drain (it leaves the router's rotation,
			// finishes or hands off its requests); the grace period covers --drain-timeout.
			TerminationGracePeriodSeconds: &grace,
			NodeSelector:                  p.NodeSelector,
			Tolerations:                   p.Tolerations,
			Containers: []corev1.Container{{
				Name: "engine", Image: c.Spec.Image, ImagePullPolicy: c.Spec.ImagePullPolicy,
				Command: []string{"tandem"}, Args: args,
				Env: []corev1.EnvVar{joinTokenEnv(c), fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_IP", "status.podIP")},
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: engineHTTPPort, Protocol: corev1.ProtocolTCP},
					{Name: "orpc", ContainerPort: engineORPCPort, Protocol: corev1.ProtocolUDP},
				},
				Resources:      p.Resources,
				ReadinessProbe: healthProbe(engineHTTPPort),
				VolumeMounts:   mounts,
			}},
			Volumes: volumes,
		},
	}
}

// templateHash names a version of a pool's pods: a rollout replaces the pods of every
// other hash. It covers the template and the gang's shape.
func templateHash(spec *v1.TandemPoolSpec) string {
	h := fnv.New32a()
	b, _ := json.Marshal(struct {
		T corev1.PodTemplateSpec
		G *v1.GangSpec
	}{spec.Template, spec.Gang})
	h.Write(b)
	return fmt.Sprintf("%08x", h.Sum32())
}

// gangSize is the number of pods of one replica of spec.
func gangSize(spec *v1.TandemPoolSpec) int {
	if spec.Gang == nil || spec.Gang.Size < 1 {
		return 1
	}
	return int(spec.Gang.Size)
}

// replicaPod is member m of replica idx of pool at hash, bound to node ("": left to the
// cluster's scheduler); nodes lists the whole gang's nodes.
func replicaPod(pool *v1.TandemPool, hash string, idx, m int, nodes []string) *corev1.Pod {
	t := pool.Spec.Template.DeepCopy()
	labels := map[string]string{}
	for k, v := range t.Labels {
		labels[k] = v
	}
	labels[v1.LabelPool] = pool.Name
	labels[v1.LabelTemplateHash] = hash
	labels[v1.LabelReplica] = strconv.Itoa(idx)
	ann := map[string]string{}
	for k, v := range t.Annotations {
		ann[k] = v
	}
	ann[v1.AnnotationGangMember] = strconv.Itoa(m)
	size := gangSize(&pool.Spec)
	if len(nodes) == size {
		b, _ := json.Marshal(nodes)
		ann[v1.AnnotationGangNodes] = string(b)
		t.Spec.NodeName = nodes[m]
	}
	for i := range t.Spec.Containers {
		t.Spec.Containers[i].Env = append(t.Spec.Containers[i].Env,
			corev1.EnvVar{Name: "TANDEM_GANG_MEMBER", Value: strconv.Itoa(m)},
			corev1.EnvVar{Name: "TANDEM_GANG_SIZE", Value: strconv.Itoa(size)})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: podName(pool.Name, hash, idx, m), Namespace: pool.Namespace, Labels: labels, Annotations: ann,
			OwnerReferences: []metav1.OwnerReference{ownerRef(pool, "TandemPool")},
		},
		Spec: t.Spec,
	}
}

func podName(pool, hash string, idx, m int) string {
	return fmt.Sprintf("%s-%s-%d-%d", pool, hash, idx, m)
}
