package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"tandem/cluster"
	"tandem/internal/statefile"
	"tandem/planner/local"
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
	sups := make([]*local.Supervisor, len(roles))
	for i, role := range roles {
		name := fmt.Sprintf("engine-%d", i+1)
		args := []string{"serve", "--port", "0", "--join", srv.ORPCAddr, "--join-token", srv.Token.String(),
			"--state-dir", filepath.Join(*stateDir, name), "--node-name", name, "--role", role,
			"--drain-timeout", drain.String()}
		if *modelPath != "" {
			args = append(args, "--model", *modelPath)
		}
		sups[i] = &local.Supervisor{Name: name, Bin: bin, Args: append(args, extra...),
			LogPath: filepath.Join(*stateDir, name+".log"), Out: stderr, SysProcAttr: childProcAttr(),
			KillAfter: *drain + 10*time.Second, Count: srv.Router.CountLocalEngine}
		wg.Go(func() { sups[i].Run(ctx) })
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
