package worker_test

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/orpc"
	"tandem/router"
	"tandem/worker"
)

// An engine restarts from the identity in its state directory without a join token, as
// docs/orpc.md says: it registers again under the name in its certificate, also when it is
// not given --node-name.
func TestWorkerRestartsFromIdentity(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	dir := t.TempDir()
	first := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{stateDir: dir})
	c.waitWorkers(1)
	first.stop()
	c.waitWorkers(0)

	for _, name := range []string{"w1", ""} {
		n := c.addWorkerOpts(name, "", workerOpts{stateDir: dir, node: &name})
		waitFor(t, "the restarted worker to register", func() bool {
			_, ok := c.worker("w1")
			return ok && len(c.router.Router.Workers()) == 1
		})
		if !strings.Contains(n.logs.String(), "using the identity stored in the state directory") {
			t.Errorf("--node-name %q: the restarted worker did not say it used its stored identity:\n%s", name, n.logs.String())
		}
		n.stop()
		c.waitWorkers(0)
	}
	if got := strings.Count(c.logs.String(), "node joined the cluster"); got != 1 {
		t.Errorf("%d joins, want the first start's only", got)
	}
}

// Without a join token, a state directory whose identity is missing, damaged, expired,
// under another CA or another node's is refused at once, by an error naming the file.
func TestWorkerIdentityWithoutToken(t *testing.T) {
	ca, err := orpc.NewCA("test cluster")
	if err != nil {
		t.Fatal(err)
	}
	save := func(id *orpc.Identity) string {
		dir := t.TempDir()
		if err := id.Save(dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	good, _ := ca.NewIdentity("w1", nil)
	corrupt := save(good)
	if err := os.WriteFile(filepath.Join(corrupt, orpc.NodeCertFile), []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	other, _ := orpc.NewCA("another cluster")
	otherCA := save(good)
	if err := os.WriteFile(filepath.Join(otherCA, orpc.CACertFile), pemCert(other), 0o644); err != nil {
		t.Fatal(err)
	}
	noKey := save(good)
	os.Remove(filepath.Join(noKey, orpc.NodeKeyFile))

	cases := []struct {
		name, dir, node, file string
	}{
		{"empty", t.TempDir(), "w1", orpc.NodeCertFile},
		{"corrupt certificate", corrupt, "w1", orpc.NodeCertFile},
		{"other CA", otherCA, "w1", orpc.NodeCertFile},
		{"key missing", noKey, "w1", orpc.NodeKeyFile},
		{"another node's", save(good), "w2", orpc.NodeCertFile},
		{"valid", save(good), "w1", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := worker.New(worker.Config{Engine: &fakeStats{pool: kvcache.NewPool(16, 16)},
				Card: cluster.ModelCard{Model: modelName, BlockSize: 16}, Node: tc.node,
				Routers: []string{"127.0.0.1:1"}, StateDir: tc.dir})
			if tc.file == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			t.Logf("%v", err)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(tc.dir, tc.file)) || !strings.Contains(err.Error(), "--join-token") {
				t.Errorf("error %v, want one naming %s and --join-token", err, filepath.Join(tc.dir, tc.file))
			}
		})
	}
}

func pemCert(ca *orpc.CA) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// A router address given twice is refused at once, naming the addresses.
func TestDuplicateJoin(t *testing.T) {
	_, err := worker.New(worker.Config{Engine: &fakeStats{pool: kvcache.NewPool(16, 16)},
		Card: cluster.ModelCard{Model: modelName, BlockSize: 16}, Node: "w1",
		Routers: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"}, Token: "abcdef.0123456789abcdef", StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "given twice (--join): 127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:1") {
		t.Fatalf("error %v, want one naming the twice-given address", err)
	}
}
