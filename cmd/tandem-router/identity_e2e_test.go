package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"tandem/internal/fixtures"
)

// startEngineIn starts a tandem serve process on the stories fixture that joins the router
// at join, keeps its identity in stateDir, and has the extra flags given (--node-name,
// --join-token).
func startEngineIn(t *testing.T, label, join, stateDir string, flags ...string) *proc {
	args := append([]string{"serve", "--model", fixtures.Model(t, "stories260K-f32.gguf"), "--served-model-name", "stories",
		"--port", "0", "--join", join, "--state-dir", stateDir}, flags...)
	return startProc(t, label, "tandem", args...)
}

// Real processes: an engine whose name another live engine holds is refused, with a
// message naming both addresses, and every request still succeeds on the holder (they do
// not evict each other); an engine killed with SIGKILL restarts from its state directory
// without a join token and gets its name back.
func TestEndToEndNodeIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four processes")
	}
	r := startRouterProc(t)
	dir := t.TempDir()
	first := startEngineIn(t, "dup (first)", r.orpc, dir, "--node-name", "dup", "--join-token", e2eToken)
	first.wait(t, `registered with router`, 60*time.Second)
	firstAddr := first.wait(t, `worker serving ORPC.* addr=(\S+)`, 10*time.Second)[1]

	second := startEngineIn(t, "dup (second)", r.orpc, t.TempDir(), "--node-name", "dup", "--join-token", e2eToken)
	refusal := second.wait(t, `router refused this worker.*`, 60*time.Second)[0]
	secondAddr := second.wait(t, `worker serving ORPC.* addr=(\S+)`, 10*time.Second)[1]
	if !strings.Contains(refusal, firstAddr) || !strings.Contains(refusal, secondAddr) {
		t.Errorf("the refusal does not name both addresses (%s, %s): %s", firstAddr, secondAddr, refusal)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := sdkClient(r.url)
	for i := range 4 {
		if _, wk, err := completion(ctx, c, fmt.Sprintf("The little dog number %d", i), 8); err != nil || wk != "dup" {
			t.Errorf("request %d: worker %q, %v", i, wk, err)
		}
	}
	if n := strings.Count(r.text(), "worker joined"); n != 1 {
		t.Errorf("%d registrations, want the first engine's only:\n%s", n, r.text())
	}
	if got := counter(t, r.url, "tandem_router:worker_name_refusals_total", `reason="name_in_use"`); got < 1 {
		t.Errorf("name_in_use refusals on /metrics: %v", got)
	}
	second.cmd.Process.Signal(syscall.SIGKILL)
	<-second.exited

	// SIGKILL the holder and start it again from its state directory, without a token: its
	// stored certificate is its name.
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.exited
	again := startEngineIn(t, "dup (restarted)", r.orpc, dir)
	again.wait(t, `using the identity stored in the state directory.* node=dup`, 60*time.Second)
	again.wait(t, `registered with router`, 30*time.Second)
	againAddr := again.wait(t, `worker serving ORPC.* addr=(\S+)`, 10*time.Second)[1]
	r.wait(t, `worker joined.*worker=dup addr=`+regexp.QuoteMeta(againAddr), 30*time.Second)
	if _, wk, err := completion(ctx, c, "Once upon a time", 8); err != nil || wk != "dup" {
		t.Errorf("after the restart: worker %q, %v", wk, err)
	}
	if n := strings.Count(r.text(), "node joined the cluster"); n != 2 {
		t.Errorf("%d joins, want the two engines' first starts only:\n%s", n, r.text())
	}
}

// Sim replicas each have their own identity (replica i>0 in STATE_DIR/replica-i), so each
// registers under the name in its own certificate, and a restart without --join-token loads
// them all.
func TestSimReplicasRestartWithoutToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	r := startRouterProc(t)
	dir := t.TempDir()
	const n = 3
	args := []string{"serve", "--backend", "sim", "--replicas", fmt.Sprint(n), "--served-model-name", "stories",
		"--node-name", "sim", "--port", "0", "--join", r.orpc, "--state-dir", dir}
	first := startProc(t, "sims", "tandem", append(args, "--join-token", e2eToken)...)
	for i := range n {
		r.wait(t, fmt.Sprintf(`worker joined.*worker=sim-%d `, i), 60*time.Second)
	}
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.exited
	again := startProc(t, "sims (restarted)", "tandem", args...)
	again.wait(t, `sim backend: 3 replicas`, 60*time.Second)
	for i := range n {
		again.wait(t, fmt.Sprintf(`using the identity stored in the state directory.* node=sim-%d `, i), 30*time.Second)
		if m, _ := r.logged(fmt.Sprintf(`(?s)(worker joined.*worker=sim-%d .*){2}`, i), 30*time.Second); m == nil {
			t.Errorf("sim-%d did not register again:\n%s", i, r.text())
		}
	}
	if n := strings.Count(r.text(), "node joined the cluster"); n != 3 {
		t.Errorf("%d joins, want one per replica, on the first start:\n%s", n, r.text())
	}
}
