// Package benchtest is a fake OpenAI-compatible streaming server with known
// timings, for testing load generators without a model.
package benchtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server streams "tokN " tokens: the first after First, the rest Gap apart.
// It serves /v1/models, /tokenize (unless NoTokenize), /v1/completions and
// /v1/chat/completions, and records every generation request's body.
type Server struct {
	First, Gap time.Duration
	// Status, when set, gives the HTTP status of the n-th generation request
	// (1-based); 0 or 200 serves it.
	Status func(n int64) int
	// StreamError, when set, says whether the n-th request's stream ends in
	// an error event after its first token.
	StreamError func(n int64) bool
	NoUsage     bool // never send a usage chunk
	NoTokenize  bool // answer /tokenize with 404
	Model       string

	*httptest.Server
	n        atomic.Int64
	inFlight atomic.Int64
	mu       sync.Mutex
	bodies   []map[string]any
	peak     int64
}

// Start starts s on 127.0.0.1.
func (s *Server) Start() *Server {
	if s.Model == "" {
		s.Model = "fake"
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Bodies returns the generation requests' bodies in arrival order.
func (s *Server) Bodies() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.bodies...)
}

// PeakInFlight is the most generation requests served at once.
func (s *Server) PeakInFlight() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, s.Model)
		return
	case "/tokenize":
		if s.NoTokenize {
			http.NotFound(w, r)
			return
		}
		ids := make([]int, 50)
		for i := range ids {
			ids[i] = 100 + i
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids)})
		return
	case "/v1/completions", "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	n := s.n.Add(1)
	cur := s.inFlight.Add(1)
	// Leave before the last write, which the client may answer at once.
	leave := sync.OnceFunc(func() { s.inFlight.Add(-1) })
	defer leave()
	s.mu.Lock()
	s.bodies = append(s.bodies, body)
	s.peak = max(s.peak, cur)
	s.mu.Unlock()
	if s.Status != nil {
		if st := s.Status(n); st != 0 && st != http.StatusOK {
			leave()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(st)
			fmt.Fprintf(w, `{"error":{"message":"fake status %d","code":%d}}`, st, st)
			return
		}
	}
	maxTokens := 16
	if v, ok := body["max_tokens"].(float64); ok {
		maxTokens = int(v)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	chunk := func(text string) map[string]any {
		if chat {
			return map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": text}}}}
		}
		return map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": text}}}
	}
	if chat { // a role-only chunk first, which is not a token
		send(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}}}})
	}
	ctx := r.Context()
	for i := range maxTokens {
		d := s.Gap
		if i == 0 {
			d = s.First
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return
		}
		send(chunk(fmt.Sprintf("tok%d ", i)))
		if i == 0 && s.StreamError != nil && s.StreamError(n) {
			leave()
			send(map[string]any{"error": map[string]any{"message": "fake failure mid-stream"}})
			return
		}
	}
	if opts, _ := body["stream_options"].(map[string]any); !s.NoUsage && opts["include_usage"] == true {
		send(map[string]any{"choices": []any{}, "usage": map[string]any{
			"prompt_tokens": promptTokens(body), "completion_tokens": maxTokens, "total_tokens": promptTokens(body) + maxTokens}})
	}
	leave()
	fmt.Fprint(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

// promptTokens counts token ids, else words, of a request's prompt.
func promptTokens(body map[string]any) int {
	switch p := body["prompt"].(type) {
	case []any:
		return len(p)
	case string:
		return len(strings.Fields(p))
	}
	n := 0
	msgs, _ := body["messages"].([]any)
	for _, m := range msgs {
		if mm, ok := m.(map[string]any); ok {
			c, _ := mm["content"].(string)
			n += len(strings.Fields(c))
		}
	}
	return n
}
