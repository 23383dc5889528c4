// Package k8stest runs a real Kubernetes API server (kube-apiserver and an embedded
// etcd, built from the module proxy's k8s.io/kubernetes into a cache directory) on loopback for tests.
//
// The server is built from ./apiserver, a module of its own, on first use: minutes on a
// cold cache (see docs/kubernetes.md), then reused while its sources are unchanged.
// TANDEM_K8S_APISERVER names a prebuilt binary instead.
package k8stest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Server is a running API server.
type Server struct {
	URL    string // https://127.0.0.1:PORT
	Token  string // bearer token of an admin (group system:masters)
	CAData []byte // PEM: the roots the server's certificate chains to
	Log    string // the server's log file

	cmd  *exec.Cmd
	done chan struct{}
}

// sourceDir is the apiserver module's directory, next to this file; built with
// -trimpath, the file's path is not a directory, and the main module's is asked of go.
func sourceDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		return filepath.Join(filepath.Dir(file), "apiserver"), nil
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("k8stest: cannot locate the package's sources (go env GOMOD: %q, %v)", mod, err)
	}
	return filepath.Join(filepath.Dir(mod), "internal", "k8stest", "apiserver"), nil
}

// Binary returns the API server's binary, building it into the cache directory
// ($XDG_CACHE_HOME/tandem-k8s, else ~/.cache/tandem-k8s) when its sources changed.
func Binary(ctx context.Context, log io.Writer) (string, error) {
	if p := os.Getenv("TANDEM_K8S_APISERVER"); p != "" {
		return p, nil
	}
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("k8stest: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("k8stest: cache directory: %w", err)
	}
	dir := filepath.Join(cache, "tandem-k8s", hex.EncodeToString(h.Sum(nil))[:16])
	bin := filepath.Join(dir, "apiserver")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("k8stest: %w", err)
	}
	// One build at a time: test binaries of several packages may start together.
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("k8stest: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("k8stest: lock the build: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp := bin + ".tmp"
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	cmd.Stdout, cmd.Stderr = log, log
	fmt.Fprintf(log, "k8stest: building kube-apiserver and etcd into %s (minutes on a cold build cache)\n", dir)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("k8stest: build the API server: %w", err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("k8stest: %w", err)
	}
	fmt.Fprintf(log, "k8stest: built in %v\n", time.Since(start).Round(time.Second))
	return bin, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts an API server with its data in dir; it is ready when Start returns.
// Stop it with Stop.
func Start(ctx context.Context, bin, dir string) (*Server, error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	var tok [16]byte
	rand.Read(tok[:])
	s := &Server{URL: fmt.Sprintf("https://127.0.0.1:%d", ports[2]), Token: hex.EncodeToString(tok[:]),
		Log: filepath.Join(dir, "apiserver.log"), done: make(chan struct{})}
	logf, err := os.Create(s.Log)
	if err != nil {
		return nil, err
	}
	s.cmd = exec.Command(bin, "-data-dir", dir, "-etcd-port", fmt.Sprint(ports[0]), "-etcd-peer-port", fmt.Sprint(ports[1]),
		"-secure-port", fmt.Sprint(ports[2]), "-token", s.Token)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("k8stest: start %s: %w", bin, err)
	}
	go func() { s.cmd.Wait(); logf.Close(); close(s.done) }()
	if err := s.waitReady(ctx, filepath.Join(dir, "certs", "apiserver.crt")); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\n%s", err, s.logTail())
	}
	return s, nil
}

// waitReady polls /readyz until it answers ok, for at most two minutes.
func (s *Server) waitReady(ctx context.Context, certFile string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("k8stest: API server not ready: %w", ctx.Err())
		case <-s.done:
			return errors.New("k8stest: API server exited")
		case <-tick.C:
		}
		ca, err := os.ReadFile(certFile)
		if err != nil {
			continue
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			continue
		}
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.Token)
		resp, err := c.Do(req)
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			s.CAData = ca
			return nil
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.Log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Stop stops the server: SIGTERM, then SIGKILL after ten seconds.
func (s *Server) Stop() {
	if s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}
