package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"tandem/internal/version"
	"tandem/metrics"
	"tandem/model"
	"tandem/orpc"
	"tandem/pipeline"
)

// stageFlags are serve's pipeline flags: which stage of how many this process is, and its
// links.
type stageFlags struct {
	count, index int
	layers       string // the split, e.g. "12,12"
	listen       string // stage 1 on: where the stage before links to
	next         string // all but the last: the next stage's address
	ca           string // the replica's CA directory
	micro        int    // the head's steps in flight (0: one a stage)
}

// spec checks the flags and returns the stage to load (the zero spec: the whole model).
func (f *stageFlags) spec() (model.StageSpec, error) {
	switch {
	case f.count < 1:
		return model.StageSpec{}, fmt.Errorf("--stages %d: want 1 or more", f.count)
	case f.count == 1:
		if f.index != 0 || f.layers != "" || f.listen != "" || f.next != "" || f.micro != 0 {
			return model.StageSpec{}, errors.New("--stage, --stage-layers, --stage-listen, --stage-next and --micro-batches need --stages 2 or more")
		}
		return model.StageSpec{}, nil
	case f.micro < 0:
		return model.StageSpec{}, fmt.Errorf("--micro-batches %d: want 1 or more (0: one a stage)", f.micro)
	case f.index < 0 || f.index >= f.count:
		return model.StageSpec{}, fmt.Errorf("--stage %d of --stages %d: the stages are numbered 0 to %d", f.index, f.count, f.count-1)
	case f.ca == "":
		return model.StageSpec{}, errors.New("--stages needs --stage-ca: the directory of the replica's CA, which its stages share (made by the first to start)")
	case f.index < f.count-1 && f.next == "":
		return model.StageSpec{}, fmt.Errorf("stage %d of %d needs --stage-next, the address of stage %d", f.index, f.count, f.index+1)
	case f.index == f.count-1 && f.next != "":
		return model.StageSpec{}, fmt.Errorf("stage %d is the last of %d: it has no --stage-next", f.index, f.count)
	case f.index > 0 && f.listen == "":
		return model.StageSpec{}, fmt.Errorf("stage %d needs --stage-listen, the address stage %d links to", f.index, f.index-1)
	case f.index == 0 && f.listen != "":
		return model.StageSpec{}, errors.New("stage 0 (the head) links to stage 1 and listens for none: drop --stage-listen")
	}
	sp := model.StageSpec{Count: f.count, Index: f.index}
	if f.layers != "" {
		sizes, err := model.ParseSizes(f.layers)
		if err != nil {
			return sp, fmt.Errorf("--stage-layers: %w", err)
		}
		sp.Sizes = sizes
	}
	return sp, nil
}

// identity is this stage's identity under the replica's CA (made on the first start).
func (f *stageFlags) identity(log *slog.Logger) (*orpc.Identity, error) {
	ca, created, err := orpc.LoadOrCreateCA(f.ca, log)
	if err != nil {
		return nil, fmt.Errorf("--stage-ca: %w", err)
	}
	if created {
		log.Info("made the pipeline replica's CA: its other stages take it from the same directory", "dir", f.ca)
	}
	id, err := ca.NewIdentity(fmt.Sprintf("stage-%d", f.index), nil)
	if err != nil {
		return nil, fmt.Errorf("--stage-ca: %w", err)
	}
	return id, nil
}

// stageServe is what a stage process other than the head serves: the link from the stage
// before on listen, and /health and /metrics on httpAddr.
type stageServe struct {
	flags     *stageFlags
	spec      model.StageSpec
	modelPath string
	name      string
	blockSize int
	httpAddr  string
	dev       deviceFlag
	threads   int
}

// serveStage runs stage s until ctx ends.
func serveStage(ctx context.Context, s stageServe, stderr io.Writer, log *slog.Logger) error {
	t0 := time.Now()
	be, m, closeModel, err := openModelStage(s.modelPath, s.dev, s.threads, log, s.spec)
	if err != nil {
		return err
	}
	defer closeModel()
	m.Prefault(be, nil)
	id, err := s.flags.identity(log)
	if err != nil {
		return err
	}
	reg := metrics.NewRegistry()
	met := metrics.NewPipeline(reg)
	st, err := pipeline.NewStage(pipeline.StageConfig{Model: m, Backend: be, Name: s.name, BlockSize: s.blockSize,
		Next: s.flags.next, Identity: id, Metrics: met, Logger: log})
	if err != nil {
		return err
	}
	l, err := st.Listen(s.flags.listen)
	if err != nil {
		return fmt.Errorf("--stage-listen: %w", err)
	}
	hl, err := net.Listen("tcp", s.httpAddr)
	if err != nil {
		l.Close()
		return fmt.Errorf("--host/--port: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.HandlerFor(reg))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok: pipeline", m.Stage) })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(hl)
	defer hs.Close()
	next := s.flags.next
	if next == "" {
		next = "none (the last stage: it sends the logits back)"
	}
	fmt.Fprintf(stderr, "tandem serve: pipeline %s\n  version: %s\n  model: %s (%s, %d of its %d layers, %s of weights) from %s\n  link: %s (from stage %d), next: %s\n  metrics: http://%s/metrics\n  load time: %v, backend %s\n",
		m.Stage, version.String(), s.name, m.Config.Arch, m.Stage.Layers(), m.Config.Layers, formatBytes(m.WeightBytes), sourceName(s.modelPath),
		l.Addr(), m.Stage.Index-1, next, hl.Addr(), time.Since(t0).Round(time.Millisecond), be.Name())
	return st.Serve(ctx, l)
}
