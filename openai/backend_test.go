package openai_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/llm"
	"tandem/model"
	"tandem/openai"
)

// engineBackend is test scaffolding: an openai.Backend over
// engine.Generator that runs one generation at a time.
type engineBackend struct {
	m     *model.Model
	gen   *engine.Generator
	mu    sync.Mutex    // one generation at a time
	delay time.Duration // pause before each token, to make streams slow

	opened  atomic.Int64 // streams returned
	closed  atomic.Int64 // streams closed (Close called at least once)
	running atomic.Int64 // generation goroutines alive
}

type engineStream struct {
	b         *engineBackend
	events    chan llm.Event
	done      chan struct{} // closed when the generation goroutine ends
	err       error         // io.EOF or the failure; set before done is closed
	cancel    context.CancelFunc
	closeOnce sync.Once
}

func (b *engineBackend) Generate(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	c := &b.m.Config
	if len(req.Prompt) >= c.ContextLen {
		return nil, fmt.Errorf("%w: %d prompt tokens, context %d", llm.ErrPromptTooLong, len(req.Prompt), c.ContextLen)
	}
	if err := req.Sampling.Validate(c.VocabSize); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrInvalid, err)
	}
	if p := req.Sampling; p.MinTokens > 0 || p.AllowedTokens != nil || req.PromptLogprobs || req.Pooling != llm.PoolNone {
		// engine.Generator has none of these; the real engine's tests (fixtureEnv) cover them.
		return nil, fmt.Errorf("%w: this test backend has no min_tokens, allowed tokens, prompt logprobs or embeddings", llm.ErrInvalid)
	}
	if !req.Constraint.IsZero() {
		// engine.Generator has no grammar; the real engine's tests cover constraints.
		return nil, fmt.Errorf("%w: this test backend does not follow constraints", llm.ErrInvalid)
	}
	gctx, cancel := context.WithCancel(context.Background())
	s := &engineStream{b: b, events: make(chan llm.Event), done: make(chan struct{}), cancel: cancel}
	b.opened.Add(1)
	b.running.Add(1)
	go s.run(gctx, req)
	return s, nil
}

func (s *engineStream) run(ctx context.Context, req *llm.Request) {
	b := s.b
	defer b.running.Add(-1)
	defer close(s.done)
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.err = ctx.Err(); s.err != nil {
		return
	}
	send := func(ev llm.Event) error {
		select {
		case s.events <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var prev *llm.Event // an event is sent once the next token says it is not the last
	res, err := b.gen.Generate(ctx, &engine.Request{
		Prompt: req.Prompt, Params: req.Sampling, MaxTokens: req.MaxTokens, StopTokens: req.StopTokens, IgnoreEOS: req.IgnoreEOS,
	}, func(t engine.Token) error {
		if b.delay > 0 {
			select {
			case <-time.After(b.delay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if prev != nil {
			if err := send(*prev); err != nil {
				return err
			}
		}
		prev = &llm.Event{Token: t.ID, Logprob: t.Logprob, Top: slices.Clone(t.Top)}
		return nil
	})
	if err != nil {
		s.err = err
		return
	}
	prev.Finish = llm.FinishReason(res.FinishReason)
	prev.Usage = llm.Usage{PromptTokens: res.PromptTokens, CompletionTokens: len(res.Tokens)}
	if s.err = send(*prev); s.err == nil {
		s.err = io.EOF
	}
}

func (s *engineStream) Next(ctx context.Context) (llm.Event, error) {
	select {
	case ev := <-s.events:
		return ev, nil
	case <-s.done:
		return llm.Event{}, s.err
	case <-ctx.Done():
		return llm.Event{}, ctx.Err()
	}
}

func (s *engineStream) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.b.closed.Add(1)
	})
	return nil
}

// settle waits until every stream has been closed and every generation has
// ended, failing t after a bound.
func (b *engineBackend) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.running.Load() != 0 || b.closed.Load() != b.opened.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("backend did not settle: %d opened, %d closed, %d running", b.opened.Load(), b.closed.Load(), b.running.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var (
	storiesMu sync.Mutex
	stories   *model.Model
	storiesBe *cpu.Backend
)

// loadStories loads stories260K-f32 once for the test binary.
func loadStories(t testing.TB) *model.Model {
	t.Helper()
	path := fixtures.Model(t, "stories260K-f32.gguf")
	storiesMu.Lock()
	defer storiesMu.Unlock()
	if stories == nil {
		be := cpu.New(0)
		m, err := model.Load(path, be)
		if err != nil {
			be.Close()
			t.Fatal(err)
		}
		stories, storiesBe = m, be
	}
	return stories
}

// testTemplate puts the BOS text first, so the handler must not add another.
const testTemplate = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

type env struct {
	m     *model.Model
	be    *engineBackend
	srv   *httptest.Server
	model *openai.Model
	logs  *syncBuffer
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newEnv serves stories260K (as "stories", with testTemplate) plus extra
// models, on 127.0.0.1.
func newEnv(t *testing.T, opts openai.Options, extra ...*openai.Model) *env {
	t.Helper()
	m := loadStories(t)
	e := &env{m: m, be: &engineBackend{m: m, gen: engine.NewGenerator(m, storiesBe)}, logs: &syncBuffer{}}
	e.model = &openai.Model{ID: "stories", Tokenizer: m.Tokenizer, ContextLen: m.Config.ContextLen, Created: 1700000000,
		OwnedBy: "test", Backend: e.be, ChatTemplate: testTemplate}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(e.logs, nil))
	}
	e.srv = httptest.NewServer(openai.NewHandler(append([]*openai.Model{e.model}, extra...), opts))
	t.Cleanup(func() {
		e.srv.Close()
		e.be.settle(t)
	})
	return e
}

// direct runs the engine directly, greedily, and returns the tokens and the
// text a client should see (end-of-generation tokens give none).
func (e *env) direct(t *testing.T, prompt []int32, maxTokens int) ([]int32, string) {
	t.Helper()
	e.be.mu.Lock()
	defer e.be.mu.Unlock()
	var ids []int32
	_, err := engine.NewGenerator(e.m, storiesBe).Generate(context.Background(), &engine.Request{Prompt: prompt, MaxTokens: maxTokens},
		func(tok engine.Token) error { ids = append(ids, tok.ID); return nil })
	if err != nil {
		t.Fatal(err)
	}
	// The completion continues the prompt: its text is what decoding the
	// prompt and the generated tokens adds to decoding the prompt alone.
	all := slices.Clone(prompt)
	for _, id := range ids {
		if !e.m.Tokenizer.IsEOG(id) {
			all = append(all, id)
		}
	}
	head, whole := e.m.Tokenizer.Decode(prompt), e.m.Tokenizer.Decode(all)
	if !strings.HasPrefix(whole, head) {
		t.Fatalf("decoding %v does not start with decoding %v", all, prompt)
	}
	return ids, whole[len(head):]
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
