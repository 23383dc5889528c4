package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestClusterCommand runs `tandem cluster --engines 3` as a real process: requests through
// the one URL it prints are served, an engine killed comes back by itself, and SIGINT stops
// everything, leaving no process behind.
func TestClusterCommand(t *testing.T) {
	bin, err := buildTandem()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "cluster", "--engines", "3", "--port", strconv.Itoa(port), "--state-dir", t.TempDir(), "--", "--threads", "1")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var mu sync.Mutex
	var log strings.Builder
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			lines <- sc.Text()
		}
		close(lines)
	}()
	up := regexp.MustCompile(`^  (engine-\d) (up|restarted): (http\S+) \(pid (\d+)`)
	urlRE := regexp.MustCompile(`^tandem cluster: (http\S+)`)
	var url string
	pids := map[string]int{}
	wait := func(what string, done func() bool) {
		t.Helper()
		deadline := time.After(90 * time.Second)
		for !done() {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("tandem cluster exited while waiting for %s:\n%s", what, log.String())
				}
				if m := urlRE.FindStringSubmatch(line); m != nil {
					url = m[1]
				}
				if m := up.FindStringSubmatch(line); m != nil {
					pids[m[1]], _ = strconv.Atoi(m[4])
				}
			case <-deadline:
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("no %s:\n%s", what, log.String())
			}
		}
	}
	wait("URL and three engines", func() bool { return url != "" && len(pids) == 3 })
	c := sdk.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0), option.WithRequestTimeout(30*time.Second))
	ask := func() error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := c.Completions.New(context.Background(), sdk.CompletionNewParams{Model: "tandem-demo",
				Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Hello")}, MaxTokens: sdk.Int(8)})
			if err == nil || time.Now().After(deadline) {
				return err
			}
			time.Sleep(100 * time.Millisecond) // the engines may still be joining
		}
	}
	if err := ask(); err != nil {
		t.Fatalf("a request through %s: %v", url, err)
	}
	victim := pids["engine-2"]
	syscall.Kill(victim, syscall.SIGKILL)
	delete(pids, "engine-2")
	wait("engine-2 to come back", func() bool { return pids["engine-2"] != 0 && pids["engine-2"] != victim })
	if err := ask(); err != nil {
		t.Fatalf("a request after the restart: %v", err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("tandem cluster exited with %v after SIGINT", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("tandem cluster still running 60 s after SIGINT")
	}
	for name, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) is still running after the cluster stopped: %v", name, pid, err)
		}
	}

}
