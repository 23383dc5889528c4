package worker_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/model"
	"tandem/openai"
	"tandem/router"
	"tandem/router/live"
	"tandem/worker"
)

// Two routers over the same two workers share their in-flight load: a request that router A
// sends to a worker reaches router B's view of that worker through the report the worker
// sends as soon as the request arrives, long before its next periodic report, so B sends
// its own request elsewhere.
func TestRoutersShareInflightLoad(t *testing.T) {
	const heartbeat = 20 * time.Second // periodic reports cannot explain what B learns
	state := t.TempDir()               // one cluster: the routers share the CA and token
	cfg := live.Config{Policy: router.DefaultConfig(), Heartbeat: heartbeat, HeartbeatTimeout: 4 * heartbeat}
	a, b := startRouterIn(t, state, cfg).router, startRouterIn(t, state, cfg).router
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open)
	path := fixtures.Model(t, "stories260K-f32.gguf")
	for _, name := range []string{"w1", "w2"} {
		startGatedWorker(t, path, name, []string{a.ORPCAddr, b.ORPCAddr}, a.Token.String(), gate)
	}
	load := func(s *live.Server, node string) (float64, bool) {
		for _, w := range s.Router.Workers() {
			if w.Node == node {
				return w.Load, true
			}
		}
		return 0, false
	}
	waitFor(t, "both routers to see both workers", func() bool {
		return len(a.Router.Workers()) == 2 && len(b.Router.Workers()) == 2
	})
	// The workers joined both: each router follows the place they give it, a share each.
	ia, na := a.Router.Share()
	ib, nb := b.Router.Share()
	if na != 2 || nb != 2 || ia == ib {
		t.Errorf("routers' shares: A %d of %d, B %d of %d; want 0 and 1 of 2", ia, na, ib, nb)
	}

	type result struct {
		worker string
		code   int
		err    error
	}
	send := func(s *live.Server) chan result {
		ch := make(chan result, 1)
		go func() {
			resp, _, _, err := postErr(s.URL(), `{"model":"stories","prompt":"Once upon a time there was a little dog","max_tokens":3,"temperature":0}`)
			r := result{err: err}
			if err == nil {
				r.worker, r.code = resp.Header.Get(openai.WorkerHeader), resp.StatusCode
			}
			ch <- r
		}()
		return ch
	}

	// A's request is held before its first token on some worker.
	first := send(a)
	var busy string
	waitFor(t, "router A to dispatch", func() bool {
		for _, w := range a.Router.Workers() {
			if w.Load > 0 {
				busy = w.Node
				return true
			}
		}
		return false
	})
	deadline := time.Now().Add(heartbeat / 4)
	for {
		if l, _ := load(b, busy); l > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("router B did not learn of A's request on %s within %v (heartbeat %v)", busy, heartbeat/4, heartbeat)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Identical prompt, nothing cached anywhere: B's only reason to avoid the busy worker
	// is the load A put there.
	second := send(b)
	waitFor(t, "router B to dispatch", func() bool {
		for _, w := range b.Router.Workers() {
			if w.Node != busy && w.Load > 0 {
				return true
			}
		}
		return false
	})
	open()
	for i, ch := range []chan result{first, second} {
		select {
		case r := <-ch:
			if r.err != nil || r.code != http.StatusOK {
				t.Fatalf("request %d: %d %v", i, r.code, r.err)
			}
			if i == 0 && r.worker != busy {
				t.Errorf("A's request served by %q, its router saw it on %q", r.worker, busy)
			}
			if i == 1 && r.worker == busy {
				t.Errorf("B sent its request to %s, where A's request was waiting", busy)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("request %d did not finish", i)
		}
	}
}

// startGatedWorker runs an engine behind a gateEngine as worker name, joined to routers.
func startGatedWorker(t *testing.T, path, name string, routers []string, token string, gate chan struct{}) {
	t.Helper()
	be := cpu.New(1)
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	salt := kvcache.Salt(modelName, "", "")
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 256, Salt: salt})
	if err != nil {
		t.Fatal(err)
	}
	format, files, err := cluster.EncodeTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{
		Engine: gateEngine{eng, gate},
		Card: cluster.ModelCard{Model: modelName, HashVersion: kvcache.HashVersion, BlockSize: engine.DefaultBlockSize, Salt: salt,
			KVBlocks: 256, ContextLen: m.Config.ContextLen, TokenizerFormat: format, TokenizerFiles: files},
		Node: name, Routers: routers, Token: token, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	engDone, wDone := make(chan struct{}), make(chan struct{})
	go func() { eng.Run(ctx); close(engDone) }()
	go func() { w.Run(ctx); close(wDone) }()
	t.Cleanup(func() {
		cancel()
		for _, ch := range []chan struct{}{wDone, engDone} {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Errorf("worker %s did not stop", name)
			}
		}
		m.Close()
		be.Close()
	})
}
