package connector

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The connector against the real API server is tested in k8s/operator; these are its
// refusals and how it reads the server's errors.

func TestNewRefusesIncompleteConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Namespace: "ns", Cluster: "c"},
		{Server: "https://x", Cluster: "c"},
		{Server: "https://x", Namespace: "ns"},
		{Server: "https://x", Namespace: "ns", Cluster: "c", CAData: []byte("not a certificate")},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestInClusterOutsideAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := InCluster("c"); err == nil || !strings.Contains(err.Error(), "not in a pod") {
		t.Errorf("InCluster = %v, want an error saying so", err)
	}
}

func TestServerErrors(t *testing.T) {
	var patched []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/tandempools"):
			if !strings.Contains(r.URL.Query().Get("labelSelector"), "tandem.dev/role=decode") {
				io.WriteString(w, `{"items":[]}`)
				return
			}
			io.WriteString(w, `{"items":[{"metadata":{"name":"c-d1"}},{"metadata":{"name":"c-d2"}}]}`)
		case r.Method == "PATCH":
			patched = append(patched, r.URL.Path)
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"kind":"Status","message":"pods \"x\" is forbidden: no"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, err := New(Config{Server: srv.URL, Namespace: "ns", Cluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	c.http = srv.Client()
	ctx := context.Background()
	if err := c.Scale(ctx, "decode", 1, nil); err == nil || !strings.Contains(err.Error(), "2 decode pools") {
		t.Errorf("Scale(decode) = %v, want an error about two decode pools", err)
	}
	if err := c.Scale(ctx, "both", 1, nil); err == nil || !strings.Contains(err.Error(), "no both pool") {
		t.Errorf("Scale(both) = %v, want an error about no pool", err)
	}
	if _, err := c.Replicas(ctx, "mixed"); err == nil || !strings.Contains(err.Error(), "unknown pool") {
		t.Errorf("Replicas(mixed) = %v, want unknown pool", err)
	}
	err = c.do(ctx, "PATCH", "/api/v1/namespaces/ns/pods/x", map[string]any{}, nil)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden || !strings.Contains(se.Message, "forbidden") {
		t.Errorf("do = %v, want a StatusError 403 with the server's message", err)
	}
}
