package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"tandem/cluster"
	"tandem/internal/statefile"
	"tandem/router"
	"tandem/router/live"
)

// clusterCmd runs a whole cluster on this machine: a router in this process and N engines
// as child processes, with their ports, state directories and join token handled; it
// restarts an engine that dies and stops everything on Ctrl-C.
func clusterCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem cluster", flag.ContinueOnError)
	engines := fs.Int("engines", 2, "engines serving both prefill and decode")
	prefill := fs.Int("prefill", 0, "engines in the prefill pool (with --decode: a disaggregated cluster; replaces --engines)")
	decode := fs.Int("decode", 0, "engines in the decode pool (with --prefill)")
	modelPath := fs.String("model", "", "GGUF file or Hugging Face directory every engine serves (default: the built-in demo model)")
	host := fs.String("host", "127.0.0.1", "address the router listens on")
	port := fs.Int("port", 8000, "the router's HTTP port: the one URL to use")
	stateDir := fs.String("state-dir", "", "the cluster's state (router CA, token, engine identities, logs) (default: $XDG_STATE_HOME/tandem/cluster-PORT)")
	routing := fs.String("routing", string(router.ModeKV), "routing mode: kv, round-robin, random or least-loaded")
	drain := fs.Duration("drain-timeout", 10*time.Second, "on Ctrl-C, how long running requests may take to finish")
	responseTTL := fs.Duration("response-ttl", 24*time.Hour, "how long the router keeps a stored response (the Responses API; 0: until deleted)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tandem cluster [--engines N | --prefill P --decode D] [--model PATH] [--port P] [flags] [-- serve flags for every engine]")
		fmt.Fprintln(stderr, "\nStarts a router and its engines on this machine, prints the URL, restarts an engine that dies, and stops all on Ctrl-C.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	extra := fs.Args() // after "--": passed to every engine's serve
	roles, err := clusterRoles(*engines, *prefill, *decode)
	if err != nil {
		return err
	}
	mode, err := router.ParseMode(*routing)
	if err != nil {
		return fmt.Errorf("--routing: %w", err)
	}
	if *stateDir == "" {
		if *port == 0 {
			return errors.New("--port 0 needs --state-dir: the default state directory is named after the port")
		}
		if *stateDir, err = statefile.DefaultDir("cluster-" + strconv.Itoa(*port)); err != nil {
			return err
		}
	}
	release, err := statefile.Lock(*stateDir)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	defer release()
	bin, err := os.Executable()
	if err != nil {
		return err
	}

	routerLog, err := os.OpenFile(filepath.Join(*stateDir, "router.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer routerLog.Close()
	if *responseTTL < 0 {
		return fmt.Errorf("--response-ttl %v: want a duration of 0 or more", *responseTTL)
	}
	pol := router.DefaultConfig()
	pol.Mode = mode
	srv, err := live.StartServer(live.ServerConfig{
		Host: *host, Port: *port, ORPCPort: 0, StateDir: filepath.Join(*stateDir, "router"),
		Router:      live.Config{Policy: pol, Name: "tandem-cluster"},
		ResponseTTL: *responseTTL,
		Logger:      slog.New(slog.NewTextHandler(routerLog, nil)),
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stderr, "tandem cluster: %s  (the OpenAI API; %d engine%s behind it)\n  state and logs: %s\n",
		srv.URL(), len(roles), plural(len(roles)), *stateDir)

	var wg sync.WaitGroup
	sups := make([]*supervised, len(roles))
	for i, role := range roles {
		name := fmt.Sprintf("engine-%d", i+1)
		args := []string{"serve", "--port", "0", "--join", srv.ORPCAddr, "--join-token", srv.Token.String(),
			"--state-dir", filepath.Join(*stateDir, name), "--node-name", name, "--role", role,
			"--drain-timeout", drain.String()}
		if *modelPath != "" {
			args = append(args, "--model", *modelPath)
		}
		sups[i] = &supervised{name: name, bin: bin, args: append(args, extra...),
			logPath: filepath.Join(*stateDir, name+".log"), out: stderr, stopWithin: *drain + 10*time.Second}
		wg.Go(func() { sups[i].run(ctx) })
	}
	<-ctx.Done()
	fmt.Fprintln(stderr, "tandem cluster: stopping (engines drain, then the router)")
	wg.Wait() // each supervisor SIGTERMs its engine and waits for it
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(dctx)
	return nil
}

// clusterRoles is the role of each engine: --engines of role both, or --prefill and
// --decode.
func clusterRoles(engines, prefill, decode int) ([]string, error) {
	switch {
	case prefill < 0 || decode < 0 || engines < 0:
		return nil, errors.New("engine counts must not be negative")
	case (prefill > 0) != (decode > 0):
		return nil, errors.New("--prefill and --decode go together (a disaggregated cluster needs both pools)")
	case prefill > 0:
		var roles []string
		for range prefill {
			roles = append(roles, cluster.RolePrefill)
		}
		for range decode {
			roles = append(roles, cluster.RoleDecode)
		}
		return roles, nil
	case engines < 1 || engines > 64:
		return nil, fmt.Errorf("--engines %d: want 1 to 64", engines)
	}
	roles := make([]string, engines)
	for i := range roles {
		roles[i] = cluster.RoleBoth
	}
	return roles, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// supervised is one engine process, restarted when it dies until ctx ends.
type supervised struct {
	name, bin string
	args      []string
	logPath   string
	out       io.Writer
	// stopWithin bounds a drain: past it the engine is killed (and that said), so that
	// Ctrl-C always ends the cluster.
	stopWithin time.Duration
}

var serveURL = regexp.MustCompile(`^tandem serve: (http\S+)`)

func (s *supervised) run(ctx context.Context) {
	backoff := time.Second
	for start := 0; ctx.Err() == nil; start++ {
		began := time.Now()
		err := s.once(ctx, start > 0)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			backoff = time.Second // it ran a good while: a fresh failure
		}
		fmt.Fprintf(s.out, "  %s exited (%v); restarting in %v\n", s.name, err, backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// once runs the engine until it exits or ctx ends (then it is drained with SIGTERM).
func (s *supervised) once(ctx context.Context, restart bool) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, s.args...)
	cmd.SysProcAttr = childProcAttr() // the engine dies with this process
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = logf
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(nil, 1<<20)
		announced := false
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if m := serveURL.FindStringSubmatch(sc.Text()); m != nil && !announced {
				announced = true
				what := "up"
				if restart {
					what = "restarted"
				}
				fmt.Fprintf(s.out, "  %s %s: %s (pid %d, log %s)\n", s.name, what, m[1], cmd.Process.Pid, s.logPath)
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { <-lines; exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(s.stopWithin):
			fmt.Fprintf(s.out, "  %s did not stop within %v of SIGTERM (its drain timeout and 10 s): killed; see %s\n", s.name, s.stopWithin, s.logPath)
			cmd.Process.Kill()
			return <-exited
		}
	}
}
