package pipeline

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"tandem/hal"
	"tandem/metrics"
	"tandem/model"
	"tandem/orpc"
)

// StageConfig describes a stage process other than the head: it serves the link from the
// stage before it, runs its layers over its own KV store and passes each step on to Next
// (the last stage answers it).
type StageConfig struct {
	Model   *model.Model // loaded with model.LoadStage: Model.Stage says which
	Backend hal.Backend
	// Name is the served model name; a hello for another is refused.
	Name string
	// BlockSize is the KV block size this stage was started with; a hello for another is
	// refused (0: any).
	BlockSize int
	// Next is the next stage's address; empty on the last stage.
	Next     string
	Identity *orpc.Identity // the replica's: links are TLS under its CA, both ways
	Metrics  *metrics.Pipeline
	Logger   *slog.Logger
}

// Stage serves one pipeline stage (not the head).
type Stage struct {
	cfg    StageConfig
	log    *slog.Logger
	runner *model.Runner

	mu     sync.Mutex // guards active
	active net.Conn   // the upstream link being served; a new hello replaces it
	// run is held while a link is served: the runner and the KV store are one link's.
	run    sync.Mutex
	kv     hal.KVStore
	layout hal.KVLayout
	batch  model.Batch // the step's, reused
}

// NewStage checks cfg and prepares the stage; Serve serves it.
func NewStage(cfg StageConfig) (*Stage, error) {
	st := cfg.Model.Stage
	switch {
	case st.Whole() || st.First():
		return nil, fmt.Errorf("pipeline: %s is the head's, served by the engine", st)
	case st.Last() != (cfg.Next == ""):
		return nil, fmt.Errorf("pipeline: %s: the last stage has no next stage, the others one", st)
	case cfg.Identity == nil:
		return nil, errors.New("pipeline: a stage needs the replica's identity")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewPipeline(nil)
	}
	return &Stage{cfg: cfg, log: cfg.Logger.With("stage", st.Index), runner: model.NewRunner(cfg.Model, cfg.Backend)}, nil
}

// Listen opens the stage's TCP listener with the link's TLS configuration.
func (s *Stage) Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	return tls.NewListener(l, linkServerTLS(s.cfg.Identity.ServerTLS())), nil
}

// Serve accepts links on l until ctx ends. One link is served at a time: a new one (a
// restarted head, or stage before) replaces the one before.
func (s *Stage) Serve(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		l.Close()
		s.mu.Lock()
		if s.active != nil {
			s.active.Close()
		}
		s.mu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("pipeline: accept: %w", err)
		}
		go s.serveConn(ctx, c)
	}
}

// serveConn serves one upstream link: its hello, then its steps.
func (s *Stage) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	log := s.log.With("from", c.RemoteAddr().String())
	if tc, ok := c.(*tls.Conn); ok {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			log.Warn("pipeline link refused: TLS handshake", "err", err)
			return
		}
	}
	r := bufio.NewReaderSize(c, 1<<20)
	w := bufio.NewWriterSize(c, 1<<20)
	var enc encoder
	typ, p, buf, err := readFrame(r, nil)
	if err != nil || typ != frameHello {
		log.Warn("pipeline link refused: no hello", "err", err, "frame", typ)
		return
	}
	h, err := decodeHello(p)
	if err != nil {
		log.Warn("pipeline link refused: a malformed hello", "err", err)
		return
	}
	if err := s.check(&h); err != nil {
		// Refused before it replaces anything: the link being served goes on.
		s.cfg.Metrics.LinkFailures.WithLabelValues("refused").Inc()
		log.Error("pipeline hello refused", "err", err)
		if _, werr := w.Write(enc.helloReply(&helloReply{Err: err.Error()})); werr == nil {
			w.Flush()
		}
		return
	}
	// The link replaces the one before: close it and wait until its steps stopped.
	s.mu.Lock()
	if s.active != nil {
		s.active.Close()
	}
	s.active = c
	s.mu.Unlock()
	s.run.Lock()
	defer s.run.Unlock()
	defer func() {
		s.mu.Lock()
		if s.active == c {
			s.active = nil
		}
		s.mu.Unlock()
	}()

	var next *link
	reply := func(err error) bool {
		var hr helloReply
		if err != nil {
			hr.Err = err.Error()
			s.cfg.Metrics.LinkFailures.WithLabelValues("refused").Inc()
			log.Error("pipeline hello refused", "err", err)
		}
		if _, werr := w.Write(enc.helloReply(&hr)); werr == nil {
			w.Flush()
		}
		return err == nil
	}
	if err := s.accept(&h); err != nil {
		reply(err)
		return
	}
	if s.cfg.Next != "" {
		h.Index++
		next, err = dial(ctx, s.cfg.Next, s.cfg.Identity, &h)
		if err != nil {
			reply(err) // it names the stage that refused, and why
			return
		}
		defer next.close()
	}
	if !reply(nil) {
		return
	}
	s.cfg.Metrics.LinkUp.Set(1)
	log.Info("pipeline link up", "stage", s.cfg.Model.Stage.String(), "blocks", h.Blocks, "block_size", h.BlockSize)

	sc := &stageConn{s: s, log: log, w: w, next: next}
	relayDone := make(chan error, 1)
	if next != nil {
		// Results come back from the next stage in step order: pass them upstream as they
		// come, while this stage already runs the steps after.
		go func() { relayDone <- sc.relay(c) }()
	}
	for {
		typ, p, buf, err = readFrame(r, buf)
		if err != nil {
			break
		}
		switch typ {
		case frameStep:
			err = sc.step(p)
		case frameKV:
			err = sc.kv(p)
		default:
			err = fmt.Errorf("%w: frame type %d", errFrame, typ)
		}
		if err != nil {
			log.Error("pipeline link: ending it", "err", err)
			break
		}
		if next == nil && r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				break
			}
		}
	}
	s.cfg.Metrics.LinkUp.Set(0)
	c.Close()
	if next != nil {
		next.close()
		<-relayDone
	}
	log.Info("pipeline link down")
}

// A stageConn is the state of one upstream link a stage serves: its main loop runs the
// steps and KV operations in order and passes them on (or, on the last stage, answers
// them on w); on the other stages the relay passes the answers upstream.
type stageConn struct {
	s    *Stage
	log  *slog.Logger
	w    *bufio.Writer // upstream: the last stage's main loop writes it, the others' relay
	next *link         // nil on the last stage
	enc  encoder       // the main loop's answers
	senc encoder       // the main loop's frames to the next stage

	st     step
	res    result
	hidden []float32
	op     kvOp
	part   []byte // the last stage's part of a read, reused
	// pending holds a middle stage's parts of the reads it passed on, oldest first, until
	// their results come back through the relay (nil for a write or a failed read).
	pendMu  sync.Mutex
	pending [][]byte
}

// step runs a step and passes it on, or answers it; an error ends the link.
func (c *stageConn) step(p []byte) error {
	s, st := c.s, &c.st
	if err := decodeStep(p, st); err != nil {
		return fmt.Errorf("a malformed step: %w", err)
	}
	embd, vocab := s.cfg.Model.Config.Embd, s.cfg.Model.Config.VocabSize
	if st.Err == "" {
		if err := s.forward(st, &c.res, &c.hidden, embd, vocab); err != nil {
			s.cfg.Metrics.StepsFailed.Inc()
			c.log.Error("pipeline step failed", "step", st.ID, "err", err)
			st.Err = fmt.Sprintf("%s: %v", s.cfg.Model.Stage, err)
		}
	}
	if c.next != nil {
		st.Hidden = c.hidden[:len(st.Pos)*embd]
		if st.Err != "" {
			st.Hidden = nil
		}
		b := c.senc.step(st)
		if err := c.next.send(b); err != nil {
			s.cfg.Metrics.LinkFailures.WithLabelValues("lost").Inc()
			return fmt.Errorf("the link to the next stage at %s: %w", s.cfg.Next, err)
		}
		s.cfg.Metrics.Steps.Inc()
		s.cfg.Metrics.BytesSent.Add(float64(len(b)))
		return nil
	}
	res := &c.res
	res.ID, res.Err = st.ID, st.Err
	if res.Err != "" {
		res.Logits, res.Hidden = res.Logits[:0], res.Hidden[:0]
	}
	_, err := c.w.Write(c.enc.result(res))
	return err
}

// relay passes the next stage's answers upstream, putting this stage's part of each read
// in front of the parts after it, until the link breaks.
func (c *stageConn) relay(up net.Conn) error {
	var (
		buf []byte
		r   kvResult
		enc encoder
	)
	for {
		typ, p, b, err := readFrame(c.next.r, buf)
		buf = b
		if err == nil {
			switch typ {
			case frameResult:
				err = writeFrame(c.w, typ, p)
			case frameKVResult:
				part := c.popPending()
				if err = decodeKVResult(p, &r); err == nil {
					if r.Err != "" {
						part = nil
					}
					_, err = c.w.Write(enc.kvResult(&r, part))
				}
			default:
				err = fmt.Errorf("%w: frame type %d from the next stage", errFrame, typ)
			}
		}
		if err == nil && c.next.r.Buffered() == 0 {
			err = c.w.Flush()
		}
		if err != nil {
			up.Close()
			return err
		}
	}
}

func (c *stageConn) pushPending(part []byte) {
	c.pendMu.Lock()
	c.pending = append(c.pending, part)
	c.pendMu.Unlock()
}

func (c *stageConn) popPending() []byte {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	if len(c.pending) == 0 {
		return nil
	}
	part := c.pending[0]
	c.pending = c.pending[1:]
	return part
}

// kv runs a KV operation on this stage's part of the blocks and passes it on, or answers
// it; an error ends the link (a failed operation does not: it travels on with its error).
func (c *stageConn) kv(p []byte) error {
	s, op := c.s, &c.op
	if err := decodeKV(p, op); err != nil {
		return fmt.Errorf("a malformed KV operation: %w", err)
	}
	var part []byte
	if op.Err == "" {
		buf := c.part
		if c.next != nil {
			buf = nil // held until the read's result comes back through the relay
		}
		var err error
		if part, err = s.kvApply(op, buf); err != nil {
			c.log.Error("pipeline KV operation failed", "blocks", len(op.Blocks), "write", op.Write, "err", err)
			op.Err = fmt.Sprintf("%s: %v", s.cfg.Model.Stage, err)
			part = nil
		} else if c.next == nil && part != nil {
			c.part = part
		}
	}
	if c.next != nil {
		c.pushPending(part)
		if op.Err != "" {
			op.Data = nil
		}
		if err := c.next.send(c.senc.kv(op)); err != nil {
			s.cfg.Metrics.LinkFailures.WithLabelValues("lost").Inc()
			return fmt.Errorf("the link to the next stage at %s: %w", s.cfg.Next, err)
		}
		return nil
	}
	_, err := c.w.Write(c.enc.kvResult(&kvResult{ID: op.ID, Err: op.Err}, part))
	return err
}

// kvApply reads (into buf, grown as needed) or writes this stage's part of op's blocks;
// a write consumes its part of op.Data.
func (s *Stage) kvApply(op *kvOp, buf []byte) ([]byte, error) {
	mine := s.kv.Format()
	if mine == "" || op.Format != mine {
		return nil, fmt.Errorf("the head's KV blocks are %q, this stage's store reads and writes %q: a transfer cannot move them", op.Format, mine)
	}
	own := s.layout.BlockBytes()
	for _, b := range op.Blocks {
		if b < 0 || int(b) >= s.layout.Blocks {
			return nil, fmt.Errorf("KV block %d of a store of %d", b, s.layout.Blocks)
		}
	}
	n := len(op.Blocks) * own
	if op.Write {
		if len(op.Data) < n || s.cfg.Next == "" && len(op.Data) != n {
			return nil, fmt.Errorf("a write of %d blocks with %d bytes for this stage and after (%d a block here)", len(op.Blocks), len(op.Data), own)
		}
		for i, b := range op.Blocks {
			if err := s.kv.WriteBlock(int(b), op.Data[i*own:(i+1)*own]); err != nil {
				return nil, err
			}
		}
		op.Data = op.Data[n:]
		s.cfg.Metrics.KVBytes.WithLabelValues("write").Add(float64(n))
		return nil, nil
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	for i, b := range op.Blocks {
		if err := s.kv.ReadBlock(int(b), buf[i*own:(i+1)*own]); err != nil {
			return nil, err
		}
	}
	s.cfg.Metrics.KVBytes.WithLabelValues("read").Add(float64(n))
	return buf, nil
}

// check checks a hello against this stage.
func (s *Stage) check(h *hello) error {
	m := s.cfg.Model
	st := m.Stage
	mine := fmt.Sprintf("stage %d of %d of %s (%s) with split %s, block size %d",
		st.Index, st.Count, s.cfg.Name, modelShape(m), model.FormatSizes(m.Split), s.cfg.BlockSize)
	theirs := fmt.Sprintf("stage %d of %d of %s (%s) with split %s, block size %d",
		h.Index, len(h.Sizes), h.Model, h.Shape, model.FormatSizes(h.Sizes), h.BlockSize)
	switch {
	case h.Version != Version:
		return fmt.Errorf("pipeline: link protocol version %d, this stage speaks %d", h.Version, Version)
	case h.Model != s.cfg.Name || h.Shape != modelShape(m) || h.Index != st.Index || len(h.Sizes) != st.Count ||
		model.FormatSizes(h.Sizes) != model.FormatSizes(m.Split) || s.cfg.BlockSize != 0 && h.BlockSize != s.cfg.BlockSize:
		return fmt.Errorf("pipeline: this process serves %s; the replica asks for %s", mine, theirs)
	case h.Blocks < 1 || h.BlockSize < 1:
		return fmt.Errorf("pipeline: a KV store of %d blocks of %d", h.Blocks, h.BlockSize)
	}
	return nil
}

// accept sizes the stage's KV store for a hello it checked.
func (s *Stage) accept(h *hello) error {
	m := s.cfg.Model
	st := m.Stage
	m.KVType = h.KVType
	l := m.KVLayout(h.Blocks, h.BlockSize)
	if s.kv != nil && s.layout == l {
		return nil // the same store serves the new link: the head forgot what it held
	}
	s.kv = nil // the old store's memory goes before the new one's is taken
	kv, err := s.cfg.Backend.NewKVStore(l)
	if err != nil {
		return fmt.Errorf("pipeline: %s: a KV store of %d blocks of %d: %w", st, h.Blocks, h.BlockSize, err)
	}
	s.kv, s.layout = kv, l
	return nil
}

// forward runs the stage's layers over a step: on the last stage it fills res, on the
// others hidden, the states the next stage starts from.
func (s *Stage) forward(st *step, res *result, hidden *[]float32, embd, vocab int) error {
	n := len(st.Pos)
	if err := checkStep(st, s.layout, embd); err != nil {
		return err
	}
	b := &s.batch // kept: the runner holds on to its address for the step
	*b = model.Batch{Attn: hal.AttnBatch{Pos: st.Pos, SeqOf: st.SeqOf, Blocks: st.Blocks}, Outputs: st.Outputs}
	if !s.cfg.Model.Stage.Last() {
		if cap(*hidden) < n*embd {
			*hidden = make([]float32, n*embd)
		}
		return s.runner.ForwardStage(s.kv, b, st.Hidden, (*hidden)[:n*embd], nil)
	}
	no := len(st.Outputs)
	if cap(res.Logits) < no*vocab {
		res.Logits = make([]float32, no*vocab)
	}
	res.Logits = res.Logits[:no*vocab]
	res.Hidden = res.Hidden[:0]
	if st.WantHidden {
		if cap(res.Hidden) < no*embd {
			res.Hidden = make([]float32, no*embd)
		}
		res.Hidden = res.Hidden[:no*embd]
		b.Hidden = res.Hidden
	}
	return s.runner.ForwardStage(s.kv, b, st.Hidden, nil, res.Logits)
}

// checkStep checks that a step's layout fits the KV store, so that a bad step is an error
// and not an out-of-range write.
func checkStep(st *step, l hal.KVLayout, embd int) error {
	n := len(st.Pos)
	switch {
	case len(st.SeqOf) != n:
		return fmt.Errorf("a step of %d positions and %d sequence ids", n, len(st.SeqOf))
	case len(st.Hidden) != n*embd:
		return fmt.Errorf("a step of %d positions with %d hidden values, want %d", n, len(st.Hidden), n*embd)
	}
	for i, q := range st.SeqOf {
		if q < 0 || int(q) >= len(st.Blocks) {
			return fmt.Errorf("position %d of sequence %d, of %d", i, q, len(st.Blocks))
		}
		if p := st.Pos[i]; p < 0 || int(p) >= len(st.Blocks[q])*l.BlockSize {
			return fmt.Errorf("position %d past sequence %d's %d blocks", p, q, len(st.Blocks[q]))
		}
	}
	for _, t := range st.Blocks {
		for _, b := range t {
			if b < 0 || int(b) >= l.Blocks {
				return fmt.Errorf("block %d of a store of %d", b, l.Blocks)
			}
		}
	}
	for _, o := range st.Outputs {
		if o < 0 || o >= n {
			return fmt.Errorf("output row %d of %d", o, n)
		}
	}
	return nil
}

// modelShape describes a model's shape, which every stage of a replica must share.
func modelShape(m *model.Model) string {
	c := &m.Config
	// Not the file type: a stage's weights may all be of one type where the model mixes.
	return fmt.Sprintf("%s, %d layers, embd %d, %d heads (%d kv) of %d, ffn %d, vocab %d",
		c.Arch, c.Layers, c.Embd, c.Heads, c.KVHeads, c.HeadDim, c.FFN, c.VocabSize)
}
