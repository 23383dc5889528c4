package k8stest

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The server itself runs in k8s/operator's and cmd/tandem-operator's tests; these hold
// the harness's own refusals.

func TestBinaryFromEnvironment(t *testing.T) {
	t.Setenv("TANDEM_K8S_APISERVER", "/opt/prebuilt/apiserver")
	got, err := Binary(context.Background(), io.Discard)
	if err != nil || got != "/opt/prebuilt/apiserver" {
		t.Errorf("Binary = %q, %v; want the prebuilt one", got, err)
	}
}

func TestStartReportsAServerThatExits(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "apiserver")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho no etcd here >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), bin, dir)
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "no etcd here") {
		t.Errorf("Start = %v, want an error saying the server exited, with its log", err)
	}
}
