// Package connector is the planner's Kubernetes connector: it sizes a TandemCluster's
// pools through their scale subresource, as kubectl scale and an HPA do.
//
// It speaks the API server's REST API with net/http alone, so that tandem-router can
// run it without linking client-go: in a pod it finds the server, its CA and its token
// where Kubernetes mounts them (InCluster).
package connector

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The operator's API on the wire (k8s/api/v1alpha1 names the same).
const (
	apiPath              = "/apis/tandem.dev/v1alpha1"
	labelCluster         = "tandem.dev/cluster"
	labelRole            = "tandem.dev/role"
	annotationDrainFirst = "tandem.dev/drain-first"
)

// Config says which server and cluster to drive.
type Config struct {
	Server    string // https://HOST:PORT
	Token     string // bearer token
	CAData    []byte // PEM roots of the server's certificate
	Namespace string
	Cluster   string // the TandemCluster's name
	Timeout   time.Duration
}

// InCluster is the Config of a pod: the server from KUBERNETES_SERVICE_HOST and _PORT,
// the service account's token, CA and namespace from their mounted files.
func InCluster(cluster string) (Config, error) {
	const dir = "/var/run/secrets/kubernetes.io/serviceaccount/"
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, errors.New("connector: not in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)")
	}
	tok, err := os.ReadFile(dir + "token")
	if err != nil {
		return Config{}, fmt.Errorf("connector: %w", err)
	}
	ca, err := os.ReadFile(dir + "ca.crt")
	if err != nil {
		return Config{}, fmt.Errorf("connector: %w", err)
	}
	ns, err := os.ReadFile(dir + "namespace")
	if err != nil {
		return Config{}, fmt.Errorf("connector: %w", err)
	}
	return Config{Server: "https://" + net.JoinHostPort(host, port), Token: strings.TrimSpace(string(tok)), CAData: ca,
		Namespace: strings.TrimSpace(string(ns)), Cluster: cluster}, nil
}

// Connector sizes pools. Pools are named by role, as the planner names them: both,
// prefill or decode; each must be one TandemPool of the cluster.
type Connector struct {
	cfg  Config
	http *http.Client
}

// New returns a connector for cfg.
func New(cfg Config) (*Connector, error) {
	if cfg.Server == "" || cfg.Namespace == "" || cfg.Cluster == "" {
		return nil, errors.New("connector: the server, the namespace and the cluster are needed")
	}
	pool := x509.NewCertPool()
	if len(cfg.CAData) > 0 && !pool.AppendCertsFromPEM(cfg.CAData) {
		return nil, errors.New("connector: no certificate in the CA data")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	return &Connector{cfg: cfg, http: &http.Client{Timeout: cfg.Timeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}}, nil
}

// Replica is one engine of a pool, as the planner counts them.
type Replica struct {
	Name     string // the pod's name, which is the engine's --node-name
	Started  time.Time
	Draining bool // deleted: draining until it exits
}

// StatusError is an answer of the API server other than success.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("connector: API server answered %d: %s", e.Code, e.Message)
}

// Scale brings pool to n replicas through its scale subresource; on the way down the
// pods named in victims go first, in their order (the operator reads the mark).
func (c *Connector) Scale(ctx context.Context, pool string, n int, victims []string) error {
	if n < 0 {
		return fmt.Errorf("connector: cannot scale pool %s to %d", pool, n)
	}
	name, err := c.poolName(ctx, pool)
	if err != nil {
		return err
	}
	for i, v := range victims {
		patch := map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotationDrainFirst: strconv.Itoa(i + 1)}}}
		err := c.do(ctx, "PATCH", "/api/v1/namespaces/"+c.cfg.Namespace+"/pods/"+url.PathEscape(v), patch, nil)
		var se *StatusError
		if err != nil && !(errors.As(err, &se) && se.Code == http.StatusNotFound) {
			return fmt.Errorf("connector: mark %s to drain first: %w", v, err)
		}
	}
	body := map[string]any{"spec": map[string]any{"replicas": n}}
	if err := c.do(ctx, "PATCH", c.poolPath(name)+"/scale", body, nil); err != nil {
		return fmt.Errorf("connector: scale pool %s: %w", name, err)
	}
	return nil
}

// Replicas lists pool's engines: every pod of the pool, the draining ones included.
func (c *Connector) Replicas(ctx context.Context, pool string) ([]Replica, error) {
	name, err := c.poolName(ctx, pool)
	if err != nil {
		return nil, err
	}
	var scale struct {
		Status struct {
			Selector string `json:"selector"`
		} `json:"status"`
	}
	if err := c.do(ctx, "GET", c.poolPath(name)+"/scale", nil, &scale); err != nil {
		return nil, fmt.Errorf("connector: read the scale of pool %s: %w", name, err)
	}
	if scale.Status.Selector == "" {
		return nil, nil // the operator has not reported the pool yet
	}
	var pods struct {
		Items []struct {
			Metadata struct {
				Name              string     `json:"name"`
				CreationTimestamp time.Time  `json:"creationTimestamp"`
				DeletionTimestamp *time.Time `json:"deletionTimestamp"`
			} `json:"metadata"`
		} `json:"items"`
	}
	q := url.Values{"labelSelector": {scale.Status.Selector}}
	if err := c.do(ctx, "GET", "/api/v1/namespaces/"+c.cfg.Namespace+"/pods?"+q.Encode(), nil, &pods); err != nil {
		return nil, fmt.Errorf("connector: list the pods of pool %s: %w", name, err)
	}
	out := make([]Replica, 0, len(pods.Items))
	for _, p := range pods.Items {
		out = append(out, Replica{Name: p.Metadata.Name, Started: p.Metadata.CreationTimestamp, Draining: p.Metadata.DeletionTimestamp != nil})
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (c *Connector) poolPath(name string) string {
	return apiPath + "/namespaces/" + c.cfg.Namespace + "/tandempools/" + url.PathEscape(name)
}

// poolName finds the cluster's TandemPool of a role.
func (c *Connector) poolName(ctx context.Context, role string) (string, error) {
	switch role {
	case "", "both":
		role = "both"
	case "prefill", "decode":
	default:
		return "", fmt.Errorf("connector: unknown pool %q (want both, prefill or decode)", role)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	q := url.Values{"labelSelector": {labelCluster + "=" + c.cfg.Cluster + "," + labelRole + "=" + role}}
	if err := c.do(ctx, "GET", apiPath+"/namespaces/"+c.cfg.Namespace+"/tandempools?"+q.Encode(), nil, &list); err != nil {
		return "", fmt.Errorf("connector: list the pools of %s: %w", c.cfg.Cluster, err)
	}
	switch len(list.Items) {
	case 0:
		return "", fmt.Errorf("connector: cluster %s has no %s pool", c.cfg.Cluster, role)
	case 1:
		return list.Items[0].Metadata.Name, nil
	}
	return "", fmt.Errorf("connector: cluster %s has %d %s pools: the planner sizes one per role", c.cfg.Cluster, len(list.Items), role)
}

// do sends one request; a PATCH is a JSON merge patch.
func (c *Connector) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.Server+path, rd)
	if err != nil {
		return err
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	req.Header.Set("Accept", "application/json")
	if method == "PATCH" {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var st struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &st) != nil || st.Message == "" {
			st.Message = strings.TrimSpace(string(b[:min(len(b), 300)]))
		}
		return &StatusError{Code: resp.StatusCode, Message: st.Message}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return nil
}
