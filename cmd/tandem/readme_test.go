package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeCommands returns the `go run ./cmd/...` lines of the README's shell blocks, by
// block, without their comments.
func readmeCommands(t *testing.T, readme string) [][]string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			blocks = append(blocks, nil)
		case strings.HasPrefix(line, "```"):
			in = false
		case in && strings.HasPrefix(line, "go run ./cmd/"):
			cmd, _, _ := strings.Cut(line, "#")
			blocks[len(blocks)-1] = append(blocks[len(blocks)-1], strings.TrimSpace(cmd))
		}
	}
	var out [][]string
	for _, bl := range blocks {
		if len(bl) > 0 {
			out = append(out, bl)
		}
	}
	return out
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// stop sends the README's Ctrl-C and waits up to 60 s for the process to end.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%v did not stop on SIGINT within 60 s; it printed:\n%s%s", p.cmd.Args, p.text(), p.logTails())
	}
}

// logTails is the end of each log in the state directory a cluster printed, for a
// failure's message.
func (p *proc) logTails() string {
	m := regexp.MustCompile(`state and logs: (\S+)`).FindStringSubmatch(p.text())
	if m == nil {
		return ""
	}
	logs, _ := filepath.Glob(filepath.Join(m[1], "*.log"))
	var b strings.Builder
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "--- %s (last lines):\n%s\n", l, strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
	return b.String()
}

// TestReadmeCommandsLeaveNothingBehind runs the README's commands (the set-up command, the
// one-command cluster and the cluster by hand) from a fresh clone of the checkout, with
// only the ports changed to free ones and the printed token filled in, and checks that
// each serves a request and that the clone holds nothing new afterwards, not even ignored
// files: their state goes to the user's state directory.
func TestReadmeCommandsLeaveNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the checkout and runs several servers")
	}
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(repo, ".git")); err != nil {
		t.Skipf("not a git checkout (%v): nothing to clone", err)
	}
	tmp := t.TempDir()
	clone := filepath.Join(tmp, "checkout")
	if out, err := exec.Command("git", "clone", "--quiet", repo, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	bins := filepath.Join(tmp, "bin")
	build := exec.Command("go", "build", "-o", bins+string(filepath.Separator), "./cmd/...")
	build.Dir = clone
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in the clone: %v\n%s", err, out)
	}
	home := filepath.Join(tmp, "home")
	env := append(os.Environ(), "HOME="+home, "XDG_STATE_HOME=")
	blocks := readmeCommands(t, filepath.Join(clone, "README.md"))
	if len(blocks) < 3 {
		t.Fatalf("the README has %d blocks of go run commands, want the set-up, cluster and manual ones", len(blocks))
	}

	start := func(line string, subst map[string]string) *proc {
		t.Helper()
		for from, to := range subst {
			line = strings.ReplaceAll(line, from, to)
		}
		args := strings.Fields(strings.TrimPrefix(line, "go run "))
		bin := filepath.Join(bins, filepath.Base(args[0]))
		cmd := exec.Command(bin, args[1:]...)
		cmd.Dir, cmd.Env = clone, env
		return startCmd(t, cmd)
	}
	complete := func(base string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Hello","max_tokens":4}`))
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return
				}
				err = fmt.Errorf("%d %s", resp.StatusCode, b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no completion from %s: %v", base, err)
			}
		}
	}

	// The set-up command: serve on a free port.
	serve := start(blocks[0][0]+" --port "+strconv.Itoa(freeTCPPort(t)), nil)
	complete(serve.waitWithin(t, 90*time.Second, `tandem serve: (http://\S+)`)[1])
	serve.stop(t)

	// The one-command cluster.
	cl := start(blocks[1][0]+" --port "+strconv.Itoa(freeTCPPort(t)), nil)
	url := cl.waitWithin(t, 90*time.Second, `tandem cluster: (http://\S+)`)[1]
	complete(url)
	cl.stop(t)

	// The cluster by hand: the router, then the engines with its printed token.
	manual := blocks[2]
	rport, oport := freeTCPPort(t), freeTCPPort(t)
	r := start(manual[0]+" --port "+strconv.Itoa(rport)+" --orpc-port "+strconv.Itoa(oport), nil)
	m := r.waitWithin(t, 90*time.Second, `tandem-router: (http://\S+)(?s:.*)join token: (\S+)`)
	subst := map[string]string{"127.0.0.1:7001": "127.0.0.1:" + strconv.Itoa(oport), "<printed token>": m[2]}
	var engines []*proc
	for _, line := range manual[1:] {
		line = regexp.MustCompile(`--port \d+`).ReplaceAllString(line, "--port "+strconv.Itoa(freeTCPPort(t)))
		e := start(line, subst)
		e.waitWithin(t, 90*time.Second, `tandem serve: http://`)
		engines = append(engines, e)
	}
	r.waitWithin(t, 90*time.Second, `(?s)worker joined.*worker joined`)
	complete(m[1])
	for _, e := range engines {
		e.stop(t)
	}
	r.stop(t)

	st := exec.Command("git", "status", "--porcelain", "--ignored")
	st.Dir = clone
	out, err := st.Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("the README's commands left files in the checkout:\n%s", s)
	}
	if _, err := os.Stat(filepath.Join(home, ".local", "state", "tandem")); err != nil {
		t.Errorf("no state under the user's state directory: %v", err)
	}
}
