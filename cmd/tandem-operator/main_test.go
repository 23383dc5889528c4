package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"tandem/deploy"
	"tandem/internal/k8stest"
	"tandem/k8s/operator"
)

func TestBadFlags(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"--log-level", "loud"}, &stderr); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Errorf("run(--log-level loud) = %v, want an error naming the flag", err)
	}
	if err := run(context.Background(), []string{"extra"}, &stderr); err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Errorf("run(extra) = %v, want unexpected arguments", err)
	}
}

// TestBinaryReconcilesAndStops runs the tandem-operator binary against a real API server:
// it reconciles the sample cluster, answers /readyz, and exits cleanly on SIGTERM.
func TestBinaryReconcilesAndStops(t *testing.T) {
	ctx := context.Background()
	apiserver, err := k8stest.Binary(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := k8stest.Start(ctx, apiserver, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()

	bin := filepath.Join(dir, "tandem-operator")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	scheme, err := operator.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: srv.URL, BearerToken: srv.Token, TLSClientConfig: rest.TLSClientConfig{CAData: srv.CAData}}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"crd/tandem.dev_tandemclusters.yaml", "crd/tandem.dev_tandempools.yaml"} {
		b, _ := deploy.Files.ReadFile(f)
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, &u); err != nil {
			t.Fatal(err)
		}
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, srv.URL, base64.StdEncoding.EncodeToString(srv.CAData), srv.Token)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := l.Addr().String()
	l.Close()
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--metrics-addr", "0", "--health-addr", health)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("operator's log:\n%s", logs.String())
		}
	}()

	// Apply the sample; poll until the routers' Deployment exists.
	b, _ := deploy.Files.ReadFile("samples/tandemcluster.yaml")
	var u unstructured.Unstructured
	if err := yaml.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	u.SetNamespace("default")
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := c.Create(ctx, &u)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create the sample: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // the CRD may not be served yet
	}
	for {
		var dep appsv1.Deployment
		err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "demo-router"}, &dep)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator made no router Deployment: %v", err)
		}
		select {
		case err := <-done:
			t.Fatalf("the operator exited: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	resp, err := http.Get("http://" + health + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz: %s", resp.Status)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the operator did not stop within 30s of SIGTERM")
	}
}
