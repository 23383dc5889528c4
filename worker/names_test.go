package worker_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/orpc"
	"tandem/router"
	"tandem/router/live"
)

// stable checks, over a few heartbeats, that name stays registered as want (same id, same
// address).
func (c *testCluster) stable(name string, want live.WorkerInfo) {
	c.t.Helper()
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		got, ok := c.worker(name)
		if !ok || got.ID != want.ID || got.Addr != want.Addr {
			c.t.Fatalf("%s is now %+v (registered %v), want it to stay %+v", name, got, ok, want)
		}
	}
}

// Two engines that joined separately under one node name hold two certificates for it:
// while the first is live the second is refused, with an error naming both addresses,
// instead of the two evicting each other without end. When the first goes, the second gets
// the name.
func TestClusterNameInUse(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	tok := c.router.Token.String()
	a := c.addWorker("twin", tok, 0)
	c.waitWorkers(1)
	holder, _ := c.worker("twin")
	b := c.addWorker("twin", tok, 0) // its own state directory: its own certificate
	waitFor(t, "the second twin's refusal", func() bool { return strings.Contains(b.logs.String(), "router refused this worker") })
	c.stable("twin", holder)
	msg := b.logs.String()
	if !strings.Contains(msg, a.w.Addr()) || !strings.Contains(msg, b.w.Addr()) || !strings.Contains(msg, "AlreadyExists") {
		t.Errorf("the refusal does not name both addresses (%s, %s) and AlreadyExists:\n%s", a.w.Addr(), b.w.Addr(), msg)
	}
	if got := scrape(t, c.router.URL(), "tandem_router:worker_name_refusals_total", `reason="name_in_use"`); got < 1 {
		t.Errorf("name_in_use refusals on /metrics: %v", got)
	}
	a.stop()
	waitFor(t, "the second twin to take the name", func() bool {
		w, ok := c.worker("twin")
		return ok && w.Addr == b.w.Addr()
	})
}

// A node's name is the one in its certificate: a node holding spoofB's certificate that
// registers as spoofA, while the real spoofA runs, is refused (PermissionDenied), and the
// real spoofA keeps its registration.
func TestClusterSpoofedName(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	tok, err := orpc.ParseToken(c.router.Token.String())
	if err != nil {
		t.Fatal(err)
	}
	a := c.addWorker("spoofA", tok.String(), 0)
	c.waitWorkers(1)
	real, _ := c.worker("spoofA")
	ctx := testCtx(t)
	id, err := orpc.Join(ctx, c.router.ORPCAddr, tok, "spoofB", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := orpc.Dial(ctx, c.router.ORPCAddr, id.ClientTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// spoofA's very card, but for the name: all the router could check besides the certificate.
	format, files, err := cluster.EncodeTokenizer(c.path)
	if err != nil {
		t.Fatal(err)
	}
	card := cluster.ModelCard{Version: cluster.Version, Model: modelName, Node: "spoofA", Addr: a.w.Addr(),
		HashVersion: kvcache.HashVersion, BlockSize: 16, Salt: kvcache.Salt(modelName, "", ""), KVBlocks: 256,
		ContextLen: a.m.Config.ContextLen, TokenizerFormat: format, TokenizerFiles: files}
	st, err := cl.Stream(ctx, cluster.MethodRegister, &card)
	if err == nil {
		var reply cluster.RegisterReply
		err = st.RecvMsg(&reply)
		st.Close()
	}
	t.Logf("spoofed registration: %v", err)
	if !errors.Is(err, orpc.ErrPermissionDenied) || !strings.Contains(err.Error(), `"spoofB"`) {
		t.Errorf("spoofed registration: %v, want PermissionDenied naming the certificate's name", err)
	}
	c.stable("spoofA", real)
	if got := scrape(t, c.router.URL(), "tandem_router:worker_name_refusals_total", `reason="certificate_name"`); got != 1 {
		t.Errorf("certificate_name refusals on /metrics: %v, want 1", got)
	}
}

// A node that restarts from its state directory gets its name back at once, although its
// old registration still looks live (kill -9 says nothing; here the old process is cut off
// the network): the same certificate is the same node.
func TestClusterRestartTakesOverName(t *testing.T) {
	// Heartbeats every 2 s: the vanished registration looks live for 8 s.
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 2 * time.Second, HeartbeatTimeout: 30 * time.Second})
	dir := t.TempDir()
	old := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{stateDir: dir, relays: true})
	c.waitWorkers(1)
	old.vanish()
	restarted := c.addWorkerOpts("w1", "", workerOpts{stateDir: dir})
	waitFor(t, "the restarted node to take its name", func() bool {
		w, ok := c.worker("w1")
		return ok && w.Addr == restarted.w.Addr()
	})
	logs := c.logs.String()
	if !strings.Contains(logs, "replacing the previous registration of this node") || !strings.Contains(logs, "same_identity=true") ||
		strings.Contains(logs, "declared dead") {
		t.Errorf("the restarted node did not replace its live-looking registration as the same identity:\n%s", logs)
	}
}

// Two processes started on one state directory hold one identity: the second replaces the
// first (it could be its restart), and when the first registers again from the address it
// was displaced from, it is refused: they do not take turns.
func TestClusterSharedIdentity(t *testing.T) {
	c := startRouter(t, router.ModeKV)
	dir := t.TempDir()
	a := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{stateDir: dir})
	c.waitWorkers(1)
	b := c.addWorkerOpts("w1", "", workerOpts{stateDir: dir})
	waitFor(t, "the first process's refusal", func() bool {
		return strings.Contains(a.logs.String(), "router refused this worker") && strings.Contains(a.logs.String(), "share a state directory")
	})
	holder, ok := c.worker("w1")
	if !ok || holder.Addr != b.w.Addr() {
		t.Fatalf("w1 is %+v, want the second process at %s", holder, b.w.Addr())
	}
	c.stable("w1", holder)
	if got := scrape(t, c.router.URL(), "tandem_router:worker_name_refusals_total", `reason="shared_identity"`); got < 1 {
		t.Errorf("shared_identity refusals on /metrics: %v", got)
	}
}
