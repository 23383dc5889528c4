package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"tandem/bench"
)

// client sends requests and records their timelines.
type client struct {
	http        *http.Client
	base        string // without a trailing /v1
	endpoint    bench.Endpoint
	model       string
	apiKey      string
	ignoreEOS   bool
	temperature float64
	extra       map[string]any
	timeout     time.Duration
}

// normalizeBase strips a trailing slash and /v1, so users may give either.
func normalizeBase(u string) string {
	u = strings.TrimRight(u, "/")
	return strings.TrimSuffix(u, "/v1")
}

func (c *client) post(ctx context.Context, path string, body any) (*http.Request, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	return req, nil
}

// message is a chat message.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// body builds a streaming request: prompt is a string or token ids for
// completions, messages for chat.
func (c *client) body(prompt any, messages []message, maxTokens int) map[string]any {
	b := map[string]any{
		"model":          c.model,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"max_tokens":     maxTokens,
		"temperature":    c.temperature,
	}
	if c.endpoint == bench.Chat {
		b["messages"] = messages
	} else {
		b["prompt"] = prompt
	}
	if c.ignoreEOS {
		b["ignore_eos"] = true
	}
	for k, v := range c.extra {
		b[k] = v
	}
	return b
}

// streamChunk is the part of an SSE event (completions or chat) we read.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
		Message struct { // a non-streamed chat answer
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (ch *streamChunk) content() string {
	if len(ch.Choices) == 0 {
		return ""
	}
	c := &ch.Choices[0]
	return c.Text + c.Delta.ReasoningContent + c.Delta.Reasoning + c.Delta.Content + c.Message.Content
}

// send sends one request and records its timeline; it returns the answer's
// text too, for multi-turn sessions.
func (c *client) send(ctx context.Context, body map[string]any) (*bench.Timeline, string) {
	tl := bench.NewTimeline()
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	req, err := c.post(ctx, c.endpoint.Path(), body)
	if err != nil {
		tl.Err = err.Error()
		return tl, ""
	}
	tl.Sent = time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		tl.End = time.Now()
		tl.Err = err.Error()
		return tl, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		tl.End = time.Now()
		tl.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return tl, ""
	}
	var answer strings.Builder
	take := func(ch *streamChunk, at time.Time) bool {
		if len(ch.Error) > 0 && string(ch.Error) != "null" {
			tl.Err = "stream error: " + string(ch.Error)
			return false
		}
		if s := ch.content(); s != "" {
			tl.Chunks = append(tl.Chunks, at)
			answer.WriteString(s)
		}
		if u := ch.Usage; u != nil {
			tl.PromptTokens, tl.CompletionTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				tl.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
		return true
	}
	if !strings.Contains(resp.Header.Get("Content-Type"), "event-stream") {
		// A server that ignored "stream": one answer, timed at its end.
		data, err := io.ReadAll(resp.Body)
		tl.End = time.Now()
		var ch streamChunk
		if err == nil {
			err = json.Unmarshal(data, &ch)
		}
		if err != nil {
			tl.Err = fmt.Sprintf("reading the response: %v", err)
			return tl, ""
		}
		take(&ch, tl.End)
		return tl, answer.String()
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	done, events := false, 0
	for !done {
		line, err := br.ReadBytes('\n')
		at := time.Now()
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			events++
			if string(data) == "[DONE]" {
				done = true
				break
			}
			var ch streamChunk
			if jerr := json.Unmarshal(data, &ch); jerr != nil {
				tl.Err = fmt.Sprintf("bad SSE event %.200q: %v", data, jerr)
				break
			}
			if !take(&ch, at) {
				break
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				tl.Err = fmt.Sprintf("reading the stream: %v", err)
			} else if events == 0 {
				tl.Err = "the stream ended without events"
			}
			break
		}
	}
	tl.End = time.Now()
	return tl, answer.String()
}

// discoverModel returns the first model the server lists.
func (c *client) discoverModel(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /v1/models: HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return "", fmt.Errorf("GET /v1/models: %v", err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", errors.New("GET /v1/models lists no model")
	}
	return list.Data[0].ID, nil
}

// probeTokenIDs asks the server's /tokenize (vLLM's and Tandem's shape,
// with llama.cpp's field too) for the ids of the word list, and returns the
// distinct ones: ids of ordinary text tokens of the server's vocabulary.
func (c *client) probeTokenIDs(ctx context.Context) ([]int32, error) {
	text := strings.Join(bench.Words(), " ")
	req, err := c.post(ctx, "/tokenize", map[string]any{
		"model": c.model, "prompt": text, "add_special_tokens": false,
		"content": text, "add_special": false, // llama.cpp
	})
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST /tokenize: HTTP %d", resp.StatusCode)
	}
	var out struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("POST /tokenize: %v", err)
	}
	seen := map[int32]bool{}
	var ids []int32
	for _, id := range out.Tokens {
		if !seen[id] && id >= 0 {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) < 2 {
		return nil, fmt.Errorf("POST /tokenize: %d distinct tokens for %d words", len(ids), len(bench.Words()))
	}
	return ids, nil
}
