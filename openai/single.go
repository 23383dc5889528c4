package openai

import (
	"context"
	"errors"
	"io"
	"net/http"

	"tandem/httpserve"
	"tandem/llm"
)

// The Responses and Messages APIs answer one choice (they have no n). A single is that
// choice, its output parsed into reasoning, text and tool calls as it becomes final.

// errClientGone is what a single returns when the client went away: nothing is written.
var errClientGone = &apiError{status: 499, typ: "invalid_request_error", msg: "The client went away."}

// startSingle opens the generation of j's one choice. The caller closes c.st.
func (h *handler) startSingle(ctx context.Context, j *job) (*choice, *apiError) {
	req := j.req
	req.ID = j.id + "-0"
	req.Prompt = j.prompts[0]
	st, err := j.m.Backend.Generate(ctx, &req)
	if err == nil && st == nil {
		err = errors.New("the backend returned no stream")
	}
	if err != nil {
		return nil, backendError(err)
	}
	return j.newChoice(st, 0, 0), nil
}

// worker names the worker serving c in w's header, where the backend says.
func (c *choice) worker(w http.ResponseWriter) {
	if ws, ok := c.st.(WorkerStream); ok {
		if wk := ws.Worker(); wk != "" {
			w.Header().Set(WorkerHeader, wk)
		}
	}
}

// runSingle reads c's stream to its end, giving each piece of parsed output (and the
// token's logprobs, when asked for) to each. It returns errClientGone when the client went
// away, the server's shutdown error when the drain deadline cut it, or the backend's.
//
// With sse, the events of a token already followed by the next one wait for it and go
// out together (sseWriter.tokenDone); all are written when it returns.
func (h *handler) runSingle(ctx context.Context, r *http.Request, info *reqInfo, j *job, c *choice, sse *sseWriter, each func(out parsed, lp *tokenLogprob) error) *apiError {
	if sse != nil {
		defer sse.release()
	}
	for !c.done {
		ev, err := c.st.Next(ctx)
		switch {
		case err == nil && ev.Finish == llm.FinishAbort:
			err = errors.New("the generation was aborted")
		case errors.Is(err, io.EOF):
			err = errors.New("the backend ended a stream without a finish reason")
		}
		if err != nil {
			if r.Context().Err() != nil {
				if errors.Is(context.Cause(r.Context()), httpserve.ErrDrainTimeout) {
					if h.met != nil {
						h.met.Cut.Inc()
					}
					return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "server_shutdown", retryAfter: "1",
						msg: "The server is shutting down and ended this response before it finished (its drain deadline passed); retry on another server."}
				}
				return errClientGone
			}
			return backendError(err)
		}
		if ev.PromptLogprobs != nil {
			c.promptLP = ev.PromptLogprobs
		}
		if sse != nil {
			sse.hold = true
		}
		text, lp := j.step(c, ev)
		info.completionTokens++
		if err := each(c.parse(text, c.done), lp); err != nil {
			return errClientGone // a write failed: the client is gone
		}
		if sse != nil && !c.done && sse.tokenDone(ready(c.st)) != nil {
			return errClientGone
		}
	}
	return nil
}
