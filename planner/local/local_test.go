package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tandem/planner"
)

// The test binary doubles as the engine: with LOCAL_TEST_ENGINE set it announces itself
// as tandem serve does, writes its arguments to its state directory, and on SIGTERM
// "drains" (writes a mark) and exits. The connector under test runs it as a real child
// process.
func TestMain(m *testing.M) {
	switch os.Getenv("LOCAL_TEST_ENGINE") {
	case "1":
		engine(os.Args[1:])
		return
	case "stubborn": // ignores SIGTERM, then dies by itself after a while
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "tandem serve: http://127.0.0.1:1 (stubborn test engine)")
		time.Sleep(time.Second)
		os.Exit(4)
	}
	os.Exit(m.Run())
}

func engine(args []string) {
	dir := ""
	for i, a := range args {
		if a == "--state-dir" && i+1 < len(args) {
			dir = args[i+1]
		}
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	// Written whole, then renamed: the test polls for the file and reads it at once.
	tmp := filepath.Join(dir, "args.tmp")
	os.WriteFile(tmp, []byte(strings.Join(args, " ")), 0o600)
	os.Rename(tmp, filepath.Join(dir, "args"))
	fmt.Fprintln(os.Stderr, "tandem serve: http://127.0.0.1:1 (test engine)")
	select {
	case <-term:
		os.WriteFile(filepath.Join(dir, "drained"), nil, 0o600)
		os.Exit(0)
	case <-time.After(time.Minute): // the test is gone: do not linger
		os.Exit(3)
	}
}

// waitFor polls cond every 10 ms for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestConnectorStartsAndDrains(t *testing.T) {
	t.Setenv("LOCAL_TEST_ENGINE", "1")
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := New(ctx, Config{Command: []string{os.Args[0], "serve", "--model", "m.gguf"}, Join: "127.0.0.1:7001",
		Token: "abc.def", StateDir: dir, DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); c.Wait() }()
	var _ planner.Connector = c

	if err := c.Scale(ctx, planner.Prefill, 3, nil); err != nil {
		t.Fatal(err)
	}
	reps := c.Replicas(planner.Prefill)
	if len(reps) != 3 || len(c.Replicas(planner.Decode)) != 0 {
		t.Fatalf("after scaling prefill to 3: %v prefill, %v decode", reps, c.Replicas(planner.Decode))
	}
	names := []string{reps[0].Name, reps[1].Name, reps[2].Name}
	if want := []string{"planner-prefill-1", "planner-prefill-2", "planner-prefill-3"}; !slices.Equal(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
	// Each engine got the template's flags and the connector's.
	for _, n := range names {
		waitFor(t, n+" to start", func() bool { _, err := os.Stat(filepath.Join(dir, n, "args")); return err == nil })
		b, _ := os.ReadFile(filepath.Join(dir, n, "args"))
		for _, want := range []string{"serve --model m.gguf", "--port 0", "--join 127.0.0.1:7001", "--join-token abc.def",
			"--node-name " + n, "--role prefill", "--drain-timeout 5s", "--state-dir " + filepath.Join(dir, n)} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s started with %q: lacks %q", n, b, want)
			}
		}
	}

	// Down to 1, the victim named first: it and the newest other drain (SIGTERM) and go.
	if err := c.Scale(ctx, planner.Prefill, 1, []string{"planner-prefill-2"}); err != nil {
		t.Fatal(err)
	}
	draining := 0
	for _, r := range c.Replicas(planner.Prefill) {
		if r.Draining {
			draining++
		}
	}
	if draining == 0 {
		t.Log("both drained before Replicas was read") // allowed: they exit fast
	}
	waitFor(t, "the drained engines to leave", func() bool { return len(c.Replicas(planner.Prefill)) == 1 })
	if left := c.Replicas(planner.Prefill)[0]; left.Name != "planner-prefill-1" || left.Draining {
		t.Errorf("left %+v, want planner-prefill-1 serving", left)
	}
	for _, n := range []string{"planner-prefill-2", "planner-prefill-3"} {
		if _, err := os.Stat(filepath.Join(dir, n, "drained")); err != nil {
			t.Errorf("%s was not sent SIGTERM (the node's drain): %v", n, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "planner-prefill-1", "drained")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("planner-prefill-1 was drained: %v", err)
	}

	// Growing again adds a new name; a bad request is refused with an error.
	if err := c.Scale(ctx, planner.Prefill, 2, nil); err != nil {
		t.Fatal(err)
	}
	if r := c.Replicas(planner.Prefill); len(r) != 2 || r[1].Name != "planner-prefill-4" {
		t.Errorf("after growing to 2: %v", r)
	}
	if err := c.Scale(ctx, planner.Prefill, -1, nil); err == nil {
		t.Error("scaling to -1 was accepted")
	}

	// The connector's context ending drains every engine (once it is up: one signalled
	// while starting simply ends, with nothing to drain).
	waitFor(t, "planner-prefill-4 to start", func() bool {
		_, err := os.Stat(filepath.Join(dir, "planner-prefill-4", "args"))
		return err == nil
	})
	cancel()
	c.Wait()
	if r := c.Replicas(planner.Prefill); len(r) != 0 {
		t.Errorf("after the context ended: %v", r)
	}
	for _, n := range []string{"planner-prefill-1", "planner-prefill-4"} {
		if _, err := os.Stat(filepath.Join(dir, n, "drained")); err != nil {
			t.Errorf("%s was not drained at shutdown: %v", n, err)
		}
	}
}

func TestNewChecksItsConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no command":         {Join: "a:1", Token: "t", StateDir: t.TempDir()},
		"no join":            {Command: []string{os.Args[0]}, Token: "t", StateDir: t.TempDir()},
		"no such binary":     {Command: []string{"/nonexistent/tandem"}, Join: "a:1", Token: "t", StateDir: t.TempDir()},
		"no state directory": {Command: []string{os.Args[0]}, Join: "a:1", Token: "t"},
	} {
		if _, err := New(context.Background(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A supervised engine that dies by itself is restarted, and one that outlives KillAfter
// after SIGTERM is killed: both are counted, for the caller's /metrics.
func TestSupervisorCountsRestartsAndKills(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("LOCAL_TEST_ENGINE", "stubborn")
	var mu sync.Mutex
	events := map[string]int{}
	var out strings.Builder
	s := &Supervisor{Name: "e", Bin: bin, LogPath: filepath.Join(t.TempDir(), "e.log"), KillAfter: 50 * time.Millisecond,
		Out:   writerFunc(func(p []byte) { mu.Lock(); out.Write(p); mu.Unlock() }),
		Count: func(ev string) { mu.Lock(); events[ev]++; mu.Unlock() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	// The second process is up: it ignores the SIGTERM that cancel sends.
	waitFor(t, "the restarted engine", func() bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(out.String(), "e restarted") })
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the supervisor did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	if events["restarted"] < 1 || events["killed"] != 1 {
		t.Errorf("events %v, want a restart and one kill; it printed:\n%s", events, out.String())
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }
