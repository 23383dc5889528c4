package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"tandem/httpserve"
	"tandem/llm"
	"tandem/tokenizer"
)

func (h *handler) chatCompletions(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	j, aerr := parseChat(h, r, w, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	h.run(w, r, info, j)
}

func (h *handler) completions(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	j, aerr := parseCompletion(h, r, w, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	h.run(w, r, info, j)
}

// choice is one generated sequence: its stream, detokenizer and stop-string state.
type choice struct {
	index   int
	prompt  int
	st      llm.Stream
	dec     *tokenizer.StreamDecoder
	started bool   // the decoder has seen a token
	pending string // text held back: it could be the start of a stop string
	text    strings.Builder
	tokens  int
	runes   int // characters the decoder has produced, for text_offset
	finish  string
	done    bool
	cached  int
	lps     []tokenLogprob
	stopStr string // the stop string that ended the choice

	// vLLM's token-level answers (job.tokenIDs, promptLogprobs, echo).
	ids          []int32             // the generated token ids
	unsent       []int32             // a stream's ids not sent yet
	promptLP     []llm.PromptLogprob // from the first event
	promptSent   bool                // a stream sent the prompt's ids
	promptLPSent bool                // a chat stream sent the prompt's logprobs
	echoed       bool                // a stream sent the echoed text

	// Chat output parsing (outputSpec): the reasoning block, the tool calls.
	reason    *reasoningSplitter
	tools     *toolParser
	reasoning strings.Builder
	calls     []toolCallOut // started calls; in a stream only their count matters
}

// parsed is what a choice's parsers make of new text.
type parsed struct {
	reasoning string
	events    []toolEvent
}

// parse splits new text into reasoning, content and tool calls.
func (c *choice) parse(text string, final bool) parsed {
	var p parsed
	content := text
	if c.reason != nil {
		p.reasoning, content = c.reason.feed(text, final)
	}
	if c.tools != nil {
		p.events = c.tools.feed(content, final)
	} else if content != "" {
		p.events = []toolEvent{{kind: evText, text: content}}
	}
	return p
}

// finishReason is the choice's finish reason: tool_calls when it called tools.
func (c *choice) finishReason() string {
	if len(c.calls) > 0 && c.finish == string(llm.FinishStop) {
		return "tool_calls"
	}
	return c.finish
}

type tokenLogprob struct {
	id      int32
	logprob float32
	top     []llm.TokenLogprob
	offset  int
	// text is what the client received for this token: its share of the
	// content after detokenization and stop strings. The chosen tokens'
	// texts concatenate to the content exactly; the raw bytes go in "bytes".
	text string
	none bool // no logprob (an echoed prompt's first token): null
}

type item struct {
	i   int
	ev  llm.Event
	err error
}

// run generates every choice of j and writes the response, streamed or not.
// Every stream it opens is closed, and every goroutine it starts has ended,
// when it returns.
func (h *handler) run(w http.ResponseWriter, r *http.Request, info *reqInfo, j *job) {
	ctx, cancel := context.WithCancel(r.Context())
	var choices []*choice
	var wg sync.WaitGroup
	defer func() {
		cancel()
		for _, c := range choices {
			c.st.Close()
		}
		wg.Wait()
	}()

	for p, prompt := range j.prompts {
		info.promptTokens += len(prompt)
		for i := range j.n {
			req := j.req
			req.ID = fmt.Sprintf("%s-%d", j.id, len(choices))
			req.Prompt = prompt
			if req.Sampling.HasSeed {
				req.Sampling.Seed += uint64(i)
			}
			st, err := j.m.Backend.Generate(ctx, &req)
			if err == nil && st == nil {
				err = errors.New("the backend returned no stream")
			}
			if err != nil {
				writeError(w, backendError(err))
				return
			}
			c := &choice{index: len(choices), prompt: p, st: st, dec: j.m.Tokenizer.NewStreamDecoder()}
			if j.echo != nil {
				c.runes = utf8.RuneCountInString(j.echo[p]) // text offsets follow the echoed prompt
			}
			if j.out.raw {
				c.dec = j.m.Tokenizer.NewRawStreamDecoder()
			}
			if j.out.reasoning {
				c.reason = newReasoningSplitter(j.out.inside)
			}
			if j.out.tools != nil {
				c.tools = newToolParser(j.out.tools.format, j.out.tools.forced())
			}
			choices = append(choices, c)
		}
	}
	var workers []string
	for _, c := range choices {
		if ws, ok := c.st.(WorkerStream); ok {
			if wk := ws.Worker(); wk != "" && !contains(workers, wk) {
				workers = append(workers, wk)
			}
		}
	}
	if len(workers) > 0 {
		w.Header().Set(WorkerHeader, strings.Join(workers, ","))
	}

	items := make(chan item, len(choices))
	for i, c := range choices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := c.st.Next(ctx)
				select {
				case items <- item{i: i, ev: ev, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil || ev.Finish != "" {
					return
				}
			}
		}()
	}

	var sse *sseWriter
	if j.stream {
		sse = newSSEWriter(w)
		if j.chat {
			for _, c := range choices {
				role, empty := "assistant", ""
				if sse.send(j.chatChunk(c, delta{Role: role, Content: &empty}, nil, nil)) != nil {
					return
				}
				if j.echo != nil && j.echo[0] != "" {
					c.echoed = true
					if sse.send(j.chatChunk(c, delta{Content: &j.echo[0]}, nil, nil)) != nil {
						return
					}
				}
			}
		}
	} else if j.echo != nil {
		for _, c := range choices {
			c.text.WriteString(j.echo[c.prompt])
		}
	}

	for remaining := len(choices); remaining > 0; {
		var it item
		select {
		case it = <-items:
		case <-ctx.Done():
			// The client went away (the deferred Close frees the sequences), or the
			// server is ending the request, which the client must be told.
			h.endedByServer(w, r, sse)
			return
		}
		c := choices[it.i]
		if c.done {
			continue
		}
		err := it.err
		switch {
		case err == nil && it.ev.Finish == llm.FinishAbort:
			err = errors.New("the generation was aborted")
		case errors.Is(err, io.EOF):
			err = errors.New("the backend ended a stream without a finish reason")
		}
		if err != nil {
			if ctx.Err() != nil {
				h.endedByServer(w, r, sse)
				return
			}
			aerr := backendError(err)
			if sse != nil {
				sse.send(aerr.body())
				sse.done()
			} else {
				writeError(w, aerr)
			}
			return
		}
		if it.ev.PromptLogprobs != nil {
			c.promptLP = it.ev.PromptLogprobs
		}
		text, lp := j.step(c, it.ev)
		info.completionTokens++
		if c.done {
			remaining--
		}
		if !j.chat {
			if j.echoOnly {
				text, lp, c.unsent, c.ids = "", nil, nil, nil
			}
			if sse == nil {
				c.text.WriteString(text)
				if lp != nil {
					c.lps = append(c.lps, *lp)
				}
				continue
			}
			var lps []tokenLogprob
			if j.echo != nil && !c.echoed {
				c.echoed = true
				text = j.echo[c.prompt] + text
				if j.logprobs {
					lps = j.echoLogprobs(c)
				}
			}
			if lp != nil {
				lps = append(lps, *lp)
			}
			if text != "" || lps != nil || len(c.unsent) > 0 {
				if sse.send(j.completionChunk(c, text, j.completionLogprobs(lps), nil)) != nil {
					return
				}
			}
			if c.done {
				if sse.send(j.completionChunk(c, "", nil, &c.finish)) != nil {
					return
				}
			}
			continue
		}
		out := c.parse(text, c.done)
		if sse == nil {
			h.collect(c, out)
			if lp != nil {
				c.lps = append(c.lps, *lp)
			}
			continue
		}
		if h.streamChat(sse, j, c, out, lp) != nil {
			return
		}
		if c.done {
			finish := c.finishReason()
			if sse.send(j.chatChunk(c, delta{}, nil, &finish)) != nil {
				return
			}
		}
	}

	u := j.usage(choices)
	if sse != nil {
		if j.includeUsage {
			if sse.send(streamChunk{ID: j.id, Object: j.chunkObject(), Created: j.created, Model: j.m.ID, Choices: []any{}, Usage: &u}) != nil {
				return
			}
		}
		sse.done()
		return
	}
	if j.chat {
		resp := chatCompletion{ID: j.id, Object: "chat.completion", Created: j.created, Model: j.m.ID, Usage: u}
		if j.tokenIDs {
			resp.PromptTokenIDs = j.prompts[0]
		}
		if len(choices) > 0 && j.promptLogprobs >= 0 {
			resp.PromptLogprobs = j.promptLogprobsOut(j.prompts[0], choices[0].promptLP)
		}
		for _, c := range choices {
			msg := chatMessageOut{Role: "assistant", ToolCalls: c.calls}
			if content := c.text.String(); content != "" || len(c.calls) == 0 {
				msg.Content = &content
			}
			if r := c.reasoning.String(); r != "" {
				msg.ReasoningContent, msg.Reasoning = &r, &r
			}
			resp.Choices = append(resp.Choices, chatChoice{Index: c.index, FinishReason: c.finishReason(),
				Message: msg, Logprobs: j.chatLogprobs(c.lps), TokenIDs: c.ids})
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	resp := completion{ID: j.id, Object: "text_completion", Created: j.created, Model: j.m.ID, Usage: u}
	for _, c := range choices {
		lps := c.lps
		if j.echo != nil && j.logprobs {
			lps = append(j.echoLogprobs(c), lps...)
		}
		ch := completionChoice{Index: c.index, Text: c.text.String(), FinishReason: c.finish,
			Logprobs: j.completionLogprobs(lps), TokenIDs: c.ids}
		if j.tokenIDs {
			ch.PromptTokenIDs = j.prompts[c.prompt]
		}
		if j.promptLogprobs >= 0 {
			ch.PromptLogprobs = j.promptLogprobsOut(j.prompts[c.prompt], c.promptLP)
		}
		resp.Choices = append(resp.Choices, ch)
	}
	writeJSON(w, http.StatusOK, resp)
}

// collect adds parsed output to a choice that is not streamed. A call that did not parse
// becomes text again.
func (h *handler) collect(c *choice, out parsed) {
	c.reasoning.WriteString(out.reasoning)
	for _, ev := range out.events {
		switch ev.kind {
		case evText:
			c.text.WriteString(ev.text)
		case evCallStart:
			c.calls = append(c.calls, toolCallOut{ID: newID("call_"), Type: "function", Function: toolCallFunction{Name: ev.text}})
		case evCallArgs:
			if n := len(c.calls); n > 0 {
				c.calls[n-1].Function.Arguments += ev.text
			}
		case evCallBroken:
			h.unparsedCall()
			if n := len(c.calls); n > 0 {
				c.calls = c.calls[:n-1]
			}
			c.text.WriteString(ev.raw)
		}
	}
}

// streamChat sends parsed output of a streamed chat choice: reasoning, content and tool
// call deltas (the first delta of a call carries its id, type and name, the next ones
// its arguments), the token's logprobs with the first of them.
func (h *handler) streamChat(sse *sseWriter, j *job, c *choice, out parsed, lp *tokenLogprob) error {
	var lps *chatLogprobs
	if lp != nil {
		lps = j.chatLogprobs([]tokenLogprob{*lp})
	}
	sent := false
	send := func(d delta) error {
		var l *chatLogprobs
		if !sent {
			l, sent = lps, true
		}
		return sse.send(j.chatChunk(c, d, l, nil))
	}
	if r := out.reasoning; r != "" {
		if err := send(delta{ReasoningContent: &r, Reasoning: &r}); err != nil {
			return err
		}
	}
	for _, ev := range out.events {
		var d delta
		switch ev.kind {
		case evText:
			if ev.text == "" {
				continue
			}
			t := ev.text
			d.Content = &t
		case evCallStart:
			c.calls = append(c.calls, toolCallOut{})
			d.ToolCalls = []toolCallDelta{{Index: len(c.calls) - 1, ID: newID("call_"), Type: "function", Function: toolCallDeltaFunction{Name: ev.text}}}
		case evCallArgs:
			d.ToolCalls = []toolCallDelta{{Index: max(len(c.calls)-1, 0), Function: toolCallDeltaFunction{Arguments: ev.text}}}
		case evCallBroken:
			h.unparsedCall()
			continue
		default:
			continue
		}
		if err := send(d); err != nil {
			return err
		}
	}
	if !sent && lp != nil {
		empty := ""
		return send(delta{Content: &empty})
	}
	return nil
}

func (h *handler) unparsedCall() {
	if h.met != nil {
		h.met.ToolCallsUnparsed.Inc()
	}
}

// endedByServer answers a request whose context ended because the server is ending it
// (its drain deadline passed): a stream gets an error event and [DONE], as for a backend
// failure, so that the client does not take the cut for a finished answer; a response
// not yet begun gets a 503. A client that went away gets nothing.
func (h *handler) endedByServer(w http.ResponseWriter, r *http.Request, sse *sseWriter) {
	if !errors.Is(context.Cause(r.Context()), httpserve.ErrDrainTimeout) {
		return
	}
	if h.met != nil {
		h.met.Cut.Inc()
	}
	aerr := &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "server_shutdown", retryAfter: "1",
		msg: "The server is shutting down and ended this response before it finished (its drain deadline passed); retry on another server."}
	if sse != nil {
		sse.send(aerr.body())
		sse.done()
		return
	}
	writeError(w, aerr)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// step takes one event of choice c: it counts the token, detokenizes it
// (end-of-generation and stop tokens give no text), applies the stop strings
// and finishes the choice when its stream or a stop string says so. It
// returns the text that is now final and the token's logprobs, if asked for.
func (j *job) step(c *choice, ev llm.Event) (string, *tokenLogprob) {
	c.tokens++
	if j.tokenIDs {
		c.ids = append(c.ids, ev.Token)
		c.unsent = append(c.unsent, ev.Token)
	}
	var lp *tokenLogprob
	if j.logprobs {
		lp = &tokenLogprob{id: ev.Token, logprob: ev.Logprob, top: ev.Top, offset: c.runes}
	}
	final := ev.Finish != ""
	var text string
	if !j.stopTokens[ev.Token] && !(!j.req.IgnoreEOS && j.m.Tokenizer.IsEOG(ev.Token)) {
		text = c.dec.Add(ev.Token)
		if !c.started {
			// The decoder drops a leading space as if the text began here; it
			// continues the prompt, so the space stays (as vLLM and llama.cpp
			// give it): prompt text + completion text = the whole text.
			c.started = true
			if p := j.m.Tokenizer.Piece(ev.Token); j.spacePrefix && len(p) > 0 && p[0] == ' ' {
				text = " " + text
			}
		}
	}
	if final {
		text += c.dec.Flush()
	}
	c.runes += utf8.RuneCountInString(text)
	stops := j.stops
	if c.tokens < j.minTokens {
		stops = nil // as vLLM: stop strings apply once min_tokens are out
	}
	text, hit := c.cut(text, stops, j.includeStop, final)
	if lp != nil {
		lp.text = text
	}
	switch {
	case hit:
		c.finish, c.done = string(llm.FinishStop), true
		c.st.Close() // the backend frees the sequence at once
	case final:
		c.finish, c.done = string(ev.Finish), true
		c.cached = ev.Usage.CachedTokens
	}
	return text, lp
}

// cut applies stop strings to new text t: it returns the text that can be
// sent, holding back a tail that could begin a stop string, and whether a
// stop string was found (the text from it on is dropped, unless include).
func (c *choice) cut(t string, stops []string, include, final bool) (string, bool) {
	if len(stops) == 0 {
		return t, false
	}
	buf := c.pending + t
	c.pending = ""
	at, n := -1, 0
	for _, s := range stops {
		if i := strings.Index(buf, s); i >= 0 && (at < 0 || i < at || (i == at && len(s) > n)) {
			at, n = i, len(s)
			c.stopStr = s
		}
	}
	switch {
	case at >= 0 && include:
		return buf[:at+n], true
	case at >= 0:
		return buf[:at], true
	case final:
		return buf, false
	}
	for p := range len(buf) {
		for _, s := range stops {
			if len(buf)-p < len(s) && strings.HasPrefix(s, buf[p:]) {
				c.pending = buf[p:]
				return buf[:p], false
			}
		}
	}
	return buf, false
}

func (j *job) usage(choices []*choice) usage {
	u := usage{}
	cached := make([]int, len(j.prompts))
	for _, c := range choices {
		u.CompletionTokens += c.tokens
		cached[c.prompt] = max(cached[c.prompt], c.cached)
	}
	for i, p := range j.prompts {
		u.PromptTokens += len(p)
		u.PromptTokensDetails.CachedTokens += min(cached[i], len(p))
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// Response shapes.

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
	// vLLM's: with return_token_ids, prompt_logprobs.
	PromptTokenIDs []int32           `json:"prompt_token_ids,omitempty"`
	PromptLogprobs []promptLogprobAt `json:"prompt_logprobs,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	TokenIDs     []int32        `json:"token_ids,omitempty"`
}

type chatMessageOut struct {
	Role    string  `json:"role"`
	Content *string `json:"content"` // null when the message is only tool calls
	// ReasoningContent and Reasoning carry the same text (servers disagree on the name).
	ReasoningContent *string       `json:"reasoning_content,omitempty"`
	Reasoning        *string       `json:"reasoning,omitempty"`
	ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
}

type toolCallOut struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type toolCallDelta struct {
	Index    int                   `json:"index"`
	ID       string                `json:"id,omitempty"`
	Type     string                `json:"type,omitempty"`
	Function toolCallDeltaFunction `json:"function"`
}

type toolCallDeltaFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   usage              `json:"usage"`
}

type completionChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *completionLogprobs `json:"logprobs"`
	FinishReason   string              `json:"finish_reason"`
	PromptTokenIDs []int32             `json:"prompt_token_ids,omitempty"`
	TokenIDs       []int32             `json:"token_ids,omitempty"`
	PromptLogprobs []promptLogprobAt   `json:"prompt_logprobs,omitempty"`
}

// streamChunk is one SSE event. Usage is null on every chunk but the last
// when the client asked for usage, and absent otherwise.
type streamChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []any  `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
	// A chat stream's first chunk carries the prompt's ids (return_token_ids), the
	// first after the first token its logprobs (prompt_logprobs).
	PromptTokenIDs []int32           `json:"prompt_token_ids,omitempty"`
	PromptLogprobs []promptLogprobAt `json:"prompt_logprobs,omitempty"`
}

type chunkWithNullUsage struct {
	streamChunk
	Usage *usage `json:"usage"`
}

type delta struct {
	Role             string          `json:"role,omitempty"`
	Content          *string         `json:"content,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
	Reasoning        *string         `json:"reasoning,omitempty"`
	ToolCalls        []toolCallDelta `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        delta         `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	TokenIDs     []int32       `json:"token_ids,omitempty"`
}

type completionChunkChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *completionLogprobs `json:"logprobs"`
	FinishReason   *string             `json:"finish_reason"`
	PromptTokenIDs []int32             `json:"prompt_token_ids,omitempty"`
	TokenIDs       []int32             `json:"token_ids,omitempty"`
	PromptLogprobs []promptLogprobAt   `json:"prompt_logprobs,omitempty"`
}

func (j *job) chunkObject() string {
	if j.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (j *job) chunk(choice any, top streamChunk) any {
	c := top
	c.ID, c.Object, c.Created, c.Model, c.Choices = j.id, j.chunkObject(), j.created, j.m.ID, []any{choice}
	if j.includeUsage {
		return chunkWithNullUsage{streamChunk: c}
	}
	return c
}

// takeIDs returns the token ids a stream has not sent yet.
func (c *choice) takeIDs() []int32 {
	ids := c.unsent
	c.unsent = nil
	return ids
}

func (j *job) chatChunk(c *choice, d delta, lp *chatLogprobs, finish *string) any {
	var top streamChunk
	if !c.promptSent && j.tokenIDs {
		top.PromptTokenIDs = j.prompts[c.prompt]
		c.promptSent = true
	}
	if !c.promptLPSent && c.promptLP != nil {
		top.PromptLogprobs = j.promptLogprobsOut(j.prompts[c.prompt], c.promptLP)
		c.promptLPSent = true
	}
	return j.chunk(chatChunkChoice{Index: c.index, Delta: d, Logprobs: lp, FinishReason: finish, TokenIDs: c.takeIDs()}, top)
}

func (j *job) completionChunk(c *choice, text string, lp *completionLogprobs, finish *string) any {
	ch := completionChunkChoice{Index: c.index, Text: text, Logprobs: lp, FinishReason: finish, TokenIDs: c.takeIDs()}
	if !c.promptSent && (j.tokenIDs || j.promptLogprobs >= 0) {
		c.promptSent = true
		if j.tokenIDs {
			ch.PromptTokenIDs = j.prompts[c.prompt]
		}
		if j.promptLogprobs >= 0 {
			ch.PromptLogprobs = j.promptLogprobsOut(j.prompts[c.prompt], c.promptLP)
		}
	}
	return j.chunk(ch, streamChunk{})
}

// Logprobs.

// logprob is a float32 log-probability written with float32 precision;
// -Inf and NaN are written as -9999 (as vLLM does: JSON has no infinities).
type logprob float32

func (l logprob) MarshalJSON() ([]byte, error) {
	f := float64(l)
	if math.IsNaN(f) || math.IsInf(f, 0) || f < -9999 {
		f = -9999
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 32), nil
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     logprob          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob logprob `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []optLogprob         `json:"token_logprobs"`
	TopLogprobs   []map[string]logprob `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// tokenText is an alternative token's text for top_logprobs: the bytes it stands for when
// they are valid UTF-8, "bytes:\xNN…" (OpenAI's form) when they are not,
// and the vocabulary text for control tokens, which stand for no bytes.
func tokenText(t *tokenizer.Tokenizer, id int32) (string, []int) {
	p := t.Piece(id)
	if len(p) == 0 {
		p = []byte(t.TokenText(id))
	}
	b := make([]int, len(p))
	for i, c := range p {
		b[i] = int(c)
	}
	if utf8.Valid(p) {
		return string(p), b
	}
	var s strings.Builder
	s.WriteString("bytes:")
	for _, c := range p {
		fmt.Fprintf(&s, "\\x%02x", c)
	}
	return s.String(), b
}

func (j *job) chatLogprobs(lps []tokenLogprob) *chatLogprobs {
	if !j.logprobs {
		return nil
	}
	out := &chatLogprobs{Content: make([]chatTokenLogprob, 0, len(lps))}
	t := j.m.Tokenizer
	for _, lp := range lps {
		_, b := tokenText(t, lp.id)
		e := chatTokenLogprob{Token: lp.text, Logprob: logprob(lp.logprob), Bytes: b, TopLogprobs: make([]chatTopLogprob, 0, len(lp.top))}
		if j.idsAsTokens {
			e.Token = tokenIDText(lp.id)
		}
		for _, top := range lp.top {
			tt, tb := tokenText(t, top.ID)
			if j.idsAsTokens {
				tt = tokenIDText(top.ID)
			}
			e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: tt, Logprob: logprob(top.Logprob), Bytes: tb})
		}
		out.Content = append(out.Content, e)
	}
	return out
}

func (j *job) completionLogprobs(lps []tokenLogprob) *completionLogprobs {
	if !j.logprobs {
		return nil
	}
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []optLogprob{}, TopLogprobs: []map[string]logprob{}, TextOffset: []int{}}
	t := j.m.Tokenizer
	for _, lp := range lps {
		tok := lp.text
		if j.idsAsTokens {
			tok = tokenIDText(lp.id)
		}
		out.Tokens = append(out.Tokens, tok)
		out.TokenLogprobs = append(out.TokenLogprobs, optLogprob{v: logprob(lp.logprob), ok: !lp.none})
		if lp.none {
			out.TopLogprobs = append(out.TopLogprobs, nil)
			out.TextOffset = append(out.TextOffset, lp.offset)
			continue
		}
		top := make(map[string]logprob, len(lp.top))
		for _, x := range lp.top {
			tt, _ := tokenText(t, x.ID)
			if j.idsAsTokens {
				tt = tokenIDText(x.ID)
			}
			if _, dup := top[tt]; !dup {
				top[tt] = logprob(x.Logprob)
			}
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, lp.offset)
	}
	return out
}

// sseWriter writes server-sent events, flushing after each.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	s.flush()
	return s
}

func (s *sseWriter) flush() {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) && s.err == nil {
		s.err = err
	}
}

// send writes one data event; it returns the first write error seen.
func (s *sseWriter) send(v any) error {
	if s.err != nil {
		return s.err
	}
	data, err := json.Marshal(v)
	if err != nil {
		data, _ = json.Marshal(errorBody{Error: errorObject{Message: "encoding the response: " + err.Error(), Type: "server_error"}})
	}
	return s.raw(data)
}

func (s *sseWriter) raw(data []byte) error {
	if s.err != nil {
		return s.err
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		s.err = err
		return err
	}
	s.flush()
	return s.err
}

func (s *sseWriter) done() { s.raw([]byte("[DONE]")) }

// optLogprob is a logprob that may be absent (null): an echoed prompt's first token.
type optLogprob struct {
	v  logprob
	ok bool
}

func (o optLogprob) MarshalJSON() ([]byte, error) {
	if !o.ok {
		return []byte("null"), nil
	}
	return o.v.MarshalJSON()
}

// tokenIDText is a token as return_tokens_as_token_ids writes it.
func tokenIDText(id int32) string { return "token_id:" + strconv.Itoa(int(id)) }

// promptLogprobAt is one prompt position of vLLM's prompt_logprobs: null for the first,
// then the token's and the best alternatives' logprobs by token id.
type promptLogprobAt map[string]promptLogprobEntry

type promptLogprobEntry struct {
	Logprob      logprob `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// promptLogprobsOut is vLLM's prompt_logprobs for prompt (nil when they did not come).
func (j *job) promptLogprobsOut(prompt []int32, lps []llm.PromptLogprob) []promptLogprobAt {
	if lps == nil {
		return nil
	}
	t := j.m.Tokenizer
	name := func(id int32) string {
		if j.idsAsTokens {
			return tokenIDText(id)
		}
		s, _ := tokenText(t, id)
		return s
	}
	out := make([]promptLogprobAt, 1, len(prompt))
	for k, lp := range lps {
		if k+1 >= len(prompt) {
			break
		}
		tok := prompt[k+1]
		at := promptLogprobAt{strconv.Itoa(int(tok)): {Logprob: logprob(lp.Logprob), Rank: lp.Rank, DecodedToken: name(tok)}}
		for r, x := range lp.Top {
			key := strconv.Itoa(int(x.ID))
			if _, ok := at[key]; !ok {
				at[key] = promptLogprobEntry{Logprob: logprob(x.Logprob), Rank: r + 1, DecodedToken: name(x.ID)}
			}
		}
		out = append(out, at)
	}
	return out
}

// echoLogprobs are the logprob entries of an echoed prompt: its tokens' texts as a
// stream decoder gives them, the first without a logprob, the others from the prompt
// logprobs the first event brought.
func (j *job) echoLogprobs(c *choice) []tokenLogprob {
	prompt := j.prompts[c.prompt]
	dec := j.m.Tokenizer.NewStreamDecoder()
	out := make([]tokenLogprob, 0, len(prompt))
	offset := 0
	for k, id := range prompt {
		text := dec.Add(id)
		if k == len(prompt)-1 {
			text += dec.Flush()
		}
		lp := tokenLogprob{id: id, offset: offset, text: text, none: k == 0}
		if k > 0 && k-1 < len(c.promptLP) {
			lp.logprob, lp.top = c.promptLP[k-1].Logprob, c.promptLP[k-1].Top
		}
		out = append(out, lp)
		offset += utf8.RuneCountInString(text)
	}
	return out
}
