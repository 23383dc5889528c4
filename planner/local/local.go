// Package local is the SLA planner's connector for one machine: it starts and stops
// tandem serve processes (a Supervisor each, restarted if they die), and the supervisor
// tandem cluster runs its engines with. A process is stopped by SIGTERM, the node's
// ordered drain, and waited for.
package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"time"

	"tandem/planner"
)

// A Supervisor runs one engine process until its context ends, restarting it when it
// dies (with a backoff); when the context ends it sends SIGTERM and waits for the drain,
// killing the process only if it outlasts KillAfter.
type Supervisor struct {
	Name      string
	Bin       string
	Args      []string
	LogPath   string        // the process's stdout and stderr
	Out       io.Writer     // a line when it is up, restarted or exits (nil: none)
	KillAfter time.Duration // after SIGTERM (0: 60 s)
	// SysProcAttr is set on each process (the caller's platform's: to die with its parent).
	SysProcAttr *syscall.SysProcAttr
	// OnExit, if set, is called after each exit with its error.
	OnExit func(err error)
	// Count, if set, is told each degraded event: "restarted" (the process died by
	// itself and is started again), "killed" (it outlived KillAfter after SIGTERM).
	Count func(event string)
}

var serveURL = regexp.MustCompile(`^tandem serve: (http\S+)`)

// Run runs the process until ctx ends, then drains it.
func (s *Supervisor) Run(ctx context.Context) {
	backoff := time.Second
	for start := 0; ctx.Err() == nil; start++ {
		began := time.Now()
		err := s.once(ctx, start > 0)
		if s.OnExit != nil {
			s.OnExit(err)
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			backoff = time.Second // it ran a good while: a fresh failure
		}
		s.printf("  %s exited (%v); restarting in %v\n", s.Name, err, backoff)
		s.count("restarted")
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (s *Supervisor) count(event string) {
	if s.Count != nil {
		s.Count(event)
	}
}

func (s *Supervisor) printf(format string, args ...any) {
	if s.Out != nil {
		fmt.Fprintf(s.Out, format, args...)
	}
}

// once runs the engine until it exits or ctx ends (then it is drained with SIGTERM).
func (s *Supervisor) once(ctx context.Context, restart bool) error {
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.Bin, s.Args...)
	cmd.SysProcAttr = s.SysProcAttr
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
				s.printf("  %s %s: %s (pid %d, log %s)\n", s.Name, what, m[1], cmd.Process.Pid, s.LogPath)
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
		kill := s.KillAfter
		if kill <= 0 {
			kill = 60 * time.Second
		}
		select {
		case err := <-exited:
			return err
		case <-time.After(kill):
			s.printf("  %s did not stop within %v of SIGTERM: killed; see %s\n", s.Name, kill, s.LogPath)
			s.count("killed")
			cmd.Process.Kill()
			return <-exited
		}
	}
}

// Config configures a Connector.
type Config struct {
	// Command is the engine's command line without the flags the connector adds: the
	// binary (a path, or a name found in PATH) and the flags every engine gets, e.g.
	// tandem serve --model M --threads 1. The connector adds --port 0, --join, --join-token,
	// --state-dir, --node-name, --role and --drain-timeout.
	Command []string
	Join    string // the router's ORPC address
	Token   string // the join token
	// StateDir holds a directory and a log per engine.
	StateDir string
	// DrainTimeout is each engine's --drain-timeout (0: 30 s); one still running 30 s past
	// it after SIGTERM is killed.
	DrainTimeout time.Duration
	Prefix       string // engines are named PREFIX-ROLE-N ("": planner)
	Out          io.Writer
	Logger       *slog.Logger
	SysProcAttr  *syscall.SysProcAttr
	// Count, if set, counts the engines' degraded events (Supervisor.Count).
	Count func(event string)
}

// Connector runs engines as child processes; it implements planner.Connector.
type Connector struct {
	cfg   Config
	ctx   context.Context
	mu    sync.Mutex
	seq   int
	pools [planner.NumPools][]*replica
	wg    sync.WaitGroup
}

type replica struct {
	rep  planner.Replica
	stop context.CancelFunc
}

// New returns a connector whose engines live until ctx ends (then each drains) or they
// are scaled away.
func New(ctx context.Context, cfg Config) (*Connector, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("local: an engine command is needed")
	}
	if cfg.Join == "" || cfg.Token == "" || cfg.StateDir == "" {
		return nil, errors.New("local: the router's address, the join token and a state directory are needed")
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "planner"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	bin, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return nil, fmt.Errorf("local: engine command: %w", err)
	}
	cfg.Command = append([]string{bin}, cfg.Command[1:]...)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	return &Connector{cfg: cfg, ctx: ctx}, nil
}

// Replicas implements planner.Connector.
func (c *Connector) Replicas(pool planner.Pool) []planner.Replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []planner.Replica
	for _, r := range c.pools[pool] {
		out = append(out, r.rep)
	}
	return out
}

// Scale implements planner.Connector: new engines are started at once; those to stop get
// SIGTERM now and leave the list when they have exited.
func (c *Connector) Scale(ctx context.Context, pool planner.Pool, n int, victims []string) error {
	if pool < 0 || pool >= planner.NumPools || n < 0 {
		return fmt.Errorf("local: cannot scale pool %v to %d", pool, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var live []*replica
	for _, r := range c.pools[pool] {
		if !r.rep.Draining {
			live = append(live, r)
		}
	}
	for i := len(live); i < n; i++ {
		if err := c.startLocked(pool); err != nil {
			return err
		}
	}
	if len(live) <= n {
		return nil
	}
	// Victims first, in order, then the newest.
	slices.SortStableFunc(live, func(a, b *replica) int {
		ia, ib := slices.Index(victims, a.rep.Name), slices.Index(victims, b.rep.Name)
		switch {
		case ia >= 0 && ib >= 0:
			return ia - ib
		case ia >= 0:
			return -1
		case ib >= 0:
			return 1
		}
		return b.rep.Started.Compare(a.rep.Started)
	})
	for _, r := range live[:len(live)-n] {
		r.rep.Draining = true
		c.cfg.Logger.Info("local: draining engine", "engine", r.rep.Name, "pool", pool)
		r.stop() // SIGTERM: the node's ordered drain; it leaves the list when it exits
	}
	return nil
}

// startLocked starts an engine in pool. Called with c.mu held.
func (c *Connector) startLocked(pool planner.Pool) error {
	c.seq++
	name := fmt.Sprintf("%s-%s-%d", c.cfg.Prefix, pool, c.seq)
	dir := filepath.Join(c.cfg.StateDir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	args := append(slices.Clone(c.cfg.Command[1:]), "--port", "0", "--join", c.cfg.Join, "--join-token", c.cfg.Token,
		"--state-dir", dir, "--node-name", name, "--role", pool.String(), "--drain-timeout", c.cfg.DrainTimeout.String())
	ctx, stop := context.WithCancel(c.ctx)
	r := &replica{rep: planner.Replica{Name: name, Started: time.Now()}, stop: stop}
	c.pools[pool] = append(c.pools[pool], r)
	sup := &Supervisor{Name: name, Bin: c.cfg.Command[0], Args: args, LogPath: filepath.Join(c.cfg.StateDir, name+".log"),
		Out: c.cfg.Out, KillAfter: c.cfg.DrainTimeout + 30*time.Second, SysProcAttr: c.cfg.SysProcAttr, Count: c.cfg.Count,
		OnExit: func(err error) {
			if ctx.Err() == nil { // not asked to stop: it died, and is restarted
				c.cfg.Logger.Warn("local: engine exited by itself; restarting it", "engine", name, "err", err)
			}
		}}
	c.cfg.Logger.Info("local: starting engine", "engine", name, "pool", pool, "log", sup.LogPath)
	c.wg.Go(func() {
		sup.Run(ctx)
		c.mu.Lock()
		c.pools[pool] = slices.DeleteFunc(c.pools[pool], func(x *replica) bool { return x == r })
		c.mu.Unlock()
		c.cfg.Logger.Info("local: engine exited", "engine", name, "pool", pool)
	})
	return nil
}

// Wait waits for every engine to exit (after ctx ended, each drained).
func (c *Connector) Wait() { c.wg.Wait() }

// Names returns the names of the engines of pool, for logs and tests.
func (c *Connector) Names(pool planner.Pool) []string {
	var out []string
	for _, r := range c.Replicas(pool) {
		out = append(out, r.Name+map[bool]string{true: " (draining)"}[r.Draining])
	}
	return out
}
