// Command apiserver runs a Kubernetes API server on loopback for tests: an
// embedded etcd and kube-apiserver in one process, admin access by one bearer token.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for etcd's data, the generated certificates and keys")
	etcdPort := flag.Int("etcd-port", 0, "loopback port of etcd's client endpoint")
	etcdPeerPort := flag.Int("etcd-peer-port", 0, "loopback port of etcd's peer endpoint")
	securePort := flag.Int("secure-port", 0, "loopback port of the API server")
	token := flag.String("token", "", "bearer token of the admin user (group system:masters)")
	flag.Parse()
	if *dataDir == "" || *etcdPort == 0 || *etcdPeerPort == 0 || *securePort == 0 || *token == "" {
		fmt.Fprintln(os.Stderr, "apiserver: -data-dir, -etcd-port, -etcd-peer-port, -secure-port and -token are required")
		os.Exit(2)
	}
	if err := run(*dataDir, *etcdPort, *etcdPeerPort, *securePort, *token); err != nil {
		fmt.Fprintln(os.Stderr, "apiserver:", err)
		os.Exit(1)
	}
}

func run(dataDir string, etcdPort, etcdPeerPort, securePort int, token string) error {
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dataDir, "etcd")
	cfg.LogLevel = "error"
	client, _ := url.Parse(etcdURL)
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer etcd.Close()
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return fmt.Errorf("etcd not ready after 60s")
	}

	saKey := filepath.Join(dataDir, "sa.key")
	if err := writeKey(saKey); err != nil {
		return err
	}
	tokens := filepath.Join(dataDir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	cmd := app.NewAPIServerCommand()
	cmd.SetArgs([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", securePort),
		"--cert-dir=" + filepath.Join(dataDir, "certs"),
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		// No controller manager runs, so no namespace gets its default
		// service account: the admission plugin that requires one is off.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--v=0",
	})
	if code := cli.Run(cmd); code != 0 {
		return fmt.Errorf("kube-apiserver exited with %d", code)
	}
	return nil
}

func writeKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}
