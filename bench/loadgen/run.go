package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"tandem/bench"
)

// Config describes a run. Zero values take the documented defaults.
type Config struct {
	BaseURL  string         // server root, e.g. http://127.0.0.1:8080 (a trailing /v1 is dropped)
	Model    string         // "" → the first model of GET /v1/models
	Endpoint bench.Endpoint // "" → Completions
	APIKey   string         // sent as a bearer token when set

	Workload bench.Workload

	// PromptFormat for synthetic prompts: "" → IDs for single-turn
	// completions, Text otherwise (chat, and multi-turn sessions, which must
	// append the server's answers as text).
	PromptFormat bench.PromptFormat
	// TokenIDs are the token ids synthetic prompts are drawn from in the IDs
	// format. nil → ask the server's /tokenize for the ids of a word list,
	// falling back to TokenIDRange.
	TokenIDs []int32
	// TokenIDRange is [lo, hi) of the fallback; zero → [1000, 10000).
	TokenIDRange [2]int32

	Arrival        bench.Arrival // "" → Trace for timed workloads, else Poisson
	RequestRate    float64       // requests per second; 0 or +Inf → all at once
	Burstiness     float64       // gamma shape of Poisson gaps; 0 → 1
	TraceSpeedup   float64       // 0 → 1
	MaxConcurrency int           // requests in flight at most; 0 → no limit

	IgnoreEOS   bool           // send ignore_eos: true
	Temperature float64        // sent as temperature (vLLM's benchmark sends 0)
	ExtraBody   map[string]any // merged into every request body
	Timeout     time.Duration  // per request; 0 → none
	Warmups     int            // unmeasured short requests before the run, to check the server

	SLO         bench.SLO
	Percentiles []float64 // nil → 90, 99
	Seed        int64

	HTTPClient *http.Client // nil → one with keep-alive and no compression
	Progress   io.Writer    // a progress bar goes here when set (a terminal)
	Log        io.Writer    // notes about choices made (nil: none)
}

// Run sends the workload to the server and measures it. Cancelling ctx
// stops the run; the requests finished by then are reported.
func Run(ctx context.Context, cfg Config) (*bench.Result, error) {
	if cfg.Workload == nil {
		return nil, errors.New("bench: no workload")
	}
	if cfg.BaseURL == "" {
		return nil, errors.New("bench: no base URL")
	}
	cfg.Endpoint = cmp.Or(cfg.Endpoint, bench.Completions)
	if cfg.Endpoint != bench.Completions && cfg.Endpoint != bench.Chat {
		return nil, fmt.Errorf("bench: unknown endpoint %q (want completions or chat)", cfg.Endpoint)
	}
	if cfg.Arrival == "" {
		cfg.Arrival = bench.Poisson
		if cfg.Workload.Timed() {
			cfg.Arrival = bench.Trace
		}
	}
	if cfg.RequestRate == 0 {
		cfg.RequestRate = math.Inf(1)
	}
	cfg.Burstiness = cmp.Or(cfg.Burstiness, 1)
	cfg.TraceSpeedup = cmp.Or(cfg.TraceSpeedup, 1)
	if cfg.Percentiles == nil {
		cfg.Percentiles = []float64{90, 99}
	}
	cfg.Percentiles = sortedPercentiles(cfg.Percentiles)
	for _, p := range cfg.Percentiles {
		if !(p > 0 && p < 100) {
			return nil, fmt.Errorf("bench: percentile %v outside (0, 100)", p)
		}
	}
	if cfg.MaxConcurrency < 0 || cfg.Warmups < 0 || cfg.Timeout < 0 {
		return nil, errors.New("bench: negative concurrency, warm-ups or timeout")
	}
	multiTurn := false
	total := 0
	sessions := cfg.Workload.Sessions()
	for _, s := range sessions {
		total += len(s.Turns)
		multiTurn = multiTurn || len(s.Turns) > 1
	}
	if total == 0 {
		return nil, errors.New("bench: the workload has no requests")
	}
	switch cfg.PromptFormat {
	case "":
		cfg.PromptFormat = bench.IDs
		if cfg.Endpoint == bench.Chat || multiTurn {
			cfg.PromptFormat = bench.Text
		}
	case bench.IDs:
		if cfg.Endpoint == bench.Chat {
			return nil, errors.New("bench: token-id prompts need the completions endpoint")
		}
		if multiTurn {
			return nil, errors.New("bench: multi-turn sessions send text (the answers are text); use the text prompt format")
		}
	case bench.Text:
	default:
		return nil, fmt.Errorf("bench: unknown prompt format %q (want ids or text)", cfg.PromptFormat)
	}
	offsets, err := bench.Schedule(cfg.Arrival, sessions, cfg.RequestRate, cfg.Burstiness, cfg.TraceSpeedup, cfg.Seed)
	if err != nil {
		return nil, err
	}

	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConns:        0,
			MaxIdleConnsPerHost: 1 << 16,
			DisableCompression:  true,
		}}
	}
	c := &client{http: hc, base: normalizeBase(cfg.BaseURL), endpoint: cfg.Endpoint, model: cfg.Model,
		apiKey: cfg.APIKey, ignoreEOS: cfg.IgnoreEOS, temperature: cfg.Temperature, extra: cfg.ExtraBody, timeout: cfg.Timeout}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	if c.model == "" {
		if c.model, err = c.discoverModel(ctx); err != nil {
			return nil, fmt.Errorf("bench: no model given, and asking the server at %s for one failed: %w", c.base, err)
		}
		logf("model: %s (from /v1/models)", c.model)
	}
	r := &bench.Renderer{TokenIDs: cfg.TokenIDs}
	if cfg.PromptFormat == bench.IDs && r.TokenIDs == nil {
		if r.TokenIDs, err = c.probeTokenIDs(ctx); err != nil {
			lo, hi := cfg.TokenIDRange[0], cfg.TokenIDRange[1]
			if lo == 0 && hi == 0 {
				lo, hi = 1000, 10000
			}
			if lo < 0 || hi <= lo {
				return nil, fmt.Errorf("bench: token id range [%d, %d) is empty", lo, hi)
			}
			logf("no /tokenize (%v): prompts use token ids in [%d, %d)", err, lo, hi)
			for id := lo; id < hi; id++ {
				r.TokenIDs = append(r.TokenIDs, id)
			}
		} else {
			logf("prompts use %d token ids from the server's /tokenize", len(r.TokenIDs))
		}
	}

	run := &runner{cfg: &cfg, c: c, r: r}
	for i := range cfg.Warmups {
		// A short prompt of its own: the first request's would warm the
		// server's prefix cache for it.
		s := bench.Session{Turns: []bench.Request{{Segments: []bench.Segment{{Seed: ^uint64(i) ^ uint64(cfg.Seed), Len: 16}}, OutputLen: 4}}}
		if res, _ := run.do(ctx, &s, 0, nil, time.Now()); !res.OK() {
			return nil, fmt.Errorf("bench: warm-up request failed (is the server up at %s?): %s", c.base, res.Err)
		}
	}

	res := &bench.Result{
		Date: time.Now(), BaseURL: c.base, Model: c.model, Endpoint: cfg.Endpoint, Workload: cfg.Workload.Name(),
		PromptFormat: cfg.PromptFormat, Arrival: cfg.Arrival, RequestRate: cfg.RequestRate, Burstiness: cfg.Burstiness,
		TraceSpeedup: cfg.TraceSpeedup, MaxConcurrency: cfg.MaxConcurrency, NumPrompts: total, SLO: cfg.SLO,
		Percentiles: cfg.Percentiles,
	}
	if cfg.MaxConcurrency > 0 {
		run.sem = make(chan struct{}, cfg.MaxConcurrency)
	}
	var prog *progress
	if cfg.Progress != nil {
		prog = startProgress(cfg.Progress, total)
	}
	perSession := make([][]bench.RequestResult, len(sessions))
	start := time.Now()
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			perSession[i] = run.session(ctx, &sessions[i], start, start.Add(offsets[i]), prog)
		})
	}
	wg.Wait()
	duration := time.Since(start)
	if prog != nil {
		prog.stop()
	}
	for i, rs := range perSession {
		for t := range rs {
			rs[t].Session, rs[t].Turn = i, t
		}
		res.Requests = append(res.Requests, rs...)
	}
	res.Interrupted = total - len(res.Requests)
	// The run lasts until its last request ended, not until an interrupt.
	var last time.Duration
	for i := range res.Requests {
		last = max(last, res.Requests[i].End())
	}
	if ctx.Err() != nil {
		duration = max(last, time.Nanosecond)
	}
	res.Summary = bench.Summarize(res.Requests, duration, cfg.SLO, cfg.Percentiles)
	return res, nil
}

type runner struct {
	cfg *Config
	c   *client
	r   *bench.Renderer
	sem chan struct{}
}

// turnHistory is a session's conversation so far.
type turnHistory struct {
	prompts, answers []string
}

// session sends a session's turns in order, starting at its arrival time.
// Requests cut short by ctx's cancellation are left out.
func (run *runner) session(ctx context.Context, s *bench.Session, start, at time.Time, prog *progress) []bench.RequestResult {
	if !sleepUntil(ctx, at) {
		return nil
	}
	var out []bench.RequestResult
	h := &turnHistory{}
	for t := range s.Turns {
		if t > 0 && !sleepUntil(ctx, time.Now().Add(s.Think)) {
			break
		}
		if run.sem != nil {
			select {
			case run.sem <- struct{}{}:
			case <-ctx.Done():
				return out
			}
		}
		res, answer := run.do(ctx, s, t, h, start)
		if run.sem != nil {
			<-run.sem
		}
		if ctx.Err() != nil && !res.OK() {
			break
		}
		out = append(out, res)
		if prog != nil {
			prog.add(res.OK())
		}
		if !res.OK() {
			// A conversation cannot go on without its answer.
			if prog != nil {
				for range len(s.Turns) - t - 1 {
					prog.add(false)
				}
			}
			for range len(s.Turns) - t - 1 {
				out = append(out, bench.RequestResult{Start: res.End(), Err: "skipped: an earlier turn of the conversation failed"})
			}
			break
		}
		h.answers = append(h.answers, answer)
	}
	return out
}

// do renders turn t of s (after history h, nil for none) and sends it.
func (run *runner) do(ctx context.Context, s *bench.Session, t int, h *turnHistory, start time.Time) (bench.RequestResult, string) {
	req := &s.Turns[t]
	inputLen := 0
	var prompt any
	var msgs []message
	text := req.Text
	if len(req.Segments) > 0 {
		if run.cfg.PromptFormat == bench.IDs {
			ids := run.r.IDs(req.Segments)
			prompt, inputLen = ids, len(ids)
		} else {
			text = bench.RenderText(req.Segments)
		}
	}
	if prompt == nil {
		if h == nil {
			h = &turnHistory{}
		}
		if run.c.endpoint == bench.Chat {
			for i := range h.answers {
				msgs = append(msgs, message{"user", h.prompts[i]}, message{"assistant", h.answers[i]})
			}
			msgs = append(msgs, message{"user", text})
		} else {
			var b strings.Builder
			for i := range h.answers {
				b.WriteString(h.prompts[i])
				b.WriteString(h.answers[i])
				b.WriteString("\n\n")
			}
			b.WriteString(text)
			prompt = b.String()
		}
		h.prompts = append(h.prompts, text)
	}
	tl, answer := run.c.send(ctx, run.c.body(prompt, msgs, req.OutputLen))
	if tl.Sent.IsZero() {
		tl.Sent = time.Now()
	}
	if tl.End.IsZero() {
		tl.End = tl.Sent
	}
	return tl.Result(start, inputLen), answer
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// sortedPercentiles returns the percentiles in order, without duplicates.
func sortedPercentiles(ps []float64) []float64 {
	out := slices.Clone(ps)
	slices.Sort(out)
	return slices.Compact(out)
}
