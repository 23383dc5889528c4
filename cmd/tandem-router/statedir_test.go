package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"tandem/orpc"
)

// A tandem-router killed (SIGKILL) at any point of its first start leaves a state directory
// that the next start starts from. The kills land after fixed delays from the exec, and,
// where inotify is available, the moment each state file lands (the router writes them one
// after another: a kill just after one lands catches the directory between two writes). The
// next start must serve, with a CA whose key matches its certificate and a join token.
func TestRouterKilledDuringFirstStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router many times")
	}
	dir, err := buildBins()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "tandem-router")
	type point struct {
		name   string
		after  time.Duration // kill this long after the start, or
		onFile string        // the moment this file appears
	}
	var points []point
	for _, ms := range []int{0, 1, 2, 3, 5, 8, 12, 16, 25, 40} {
		points = append(points, point{name: (time.Duration(ms) * time.Millisecond).String(), after: time.Duration(ms) * time.Millisecond})
	}
	for _, f := range []string{orpc.CAKeyFile, orpc.CACertFile, orpc.TokenFile} {
		points = append(points, point{name: "on-" + f, onFile: f})
	}
	for _, p := range points {
		t.Run(p.name, func(t *testing.T) {
			state := t.TempDir()
			var appeared <-chan string
			if p.onFile != "" {
				ch, stop, ok := watchFileNames(state, p.onFile)
				if !ok {
					t.Skip("needs inotify to kill on a file's appearance")
				}
				defer stop()
				appeared = ch
			}
			cmd := exec.Command(bin, "--port", "0", "--orpc-port", "0", "--state-dir", state)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if appeared != nil {
				select {
				case <-appeared:
				case <-time.After(30 * time.Second):
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("%s never appeared", p.onFile)
				}
			} else {
				time.Sleep(p.after)
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			left := stateFiles(t, state)
			t.Logf("killed; the state directory holds %v", left)

			r := startProc(t, "tandem-router (after the kill)", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", state)
			r.wait(t, `tandem-router: http://`, 30*time.Second)
			r.wait(t, `join token: \S+`, 10*time.Second)
			if _, err := orpc.LoadCA(filepath.Join(state, orpc.CACertFile), filepath.Join(state, orpc.CAKeyFile)); err != nil {
				t.Errorf("after the restart: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(state, orpc.TokenFile)); err != nil {
				t.Errorf("after the restart: %v", err)
			} else if _, err := orpc.ParseToken(string(b)); err != nil {
				t.Errorf("after the restart: join token: %v", err)
			}
			if slices.Contains(left, orpc.CAKeyFile) && !slices.Contains(left, orpc.CACertFile) &&
				!strings.Contains(r.text(), "interrupted") {
				t.Errorf("the router replaced an unfinished CA without saying so:\n%s", r.text())
			}
		})
	}
}

// stateFiles lists the names in dir.
func stateFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
