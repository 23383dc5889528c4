package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Streaming, per token. A streamed answer is one server-sent event per token (or more:
// a tool call's delta, the finish): its JSON is appended to one buffer kept for the
// response, without encoding/json in the common shapes (a text or content delta, the
// finish, token ids), and the events go out in one write and one flush when the token's
// stream has nothing more ready (ReadyStream): a router that fell behind, or several
// tokens that came in one message, cost one write, not one each. The bytes are the same
// as encoding/json writes for the same chunk (TestChunkEncodersMatchEncodingJSON,
// FuzzAppendJSONString).

// ReadyStream is an optional interface of an llm.Stream: Ready reports whether Next
// would return at once (an event is already received). The handler then holds the
// events written so far and writes them with the next ones, in one write and one flush.
type ReadyStream interface {
	Ready() bool
}

// ready reports whether st's next event is already there.
func ready(st any) bool {
	r, ok := st.(ReadyStream)
	return ok && r.Ready()
}

// sseWriter writes server-sent events. Events are appended to pending and written (one
// write, then a flush) at once, unless hold is set: then at the next event written with
// hold unset, at release, or at done.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	err     error
	pending []byte
	hold    bool

	// interval, above 1, holds the events of that many tokens for one write (but the
	// first token's): Options.StreamInterval. tokens counts the tokens written or held,
	// held those held.
	interval, tokens, held int
	heldBytes              int // of pending, at the last tokenDone
}

// newSSE starts a stream with the handler's options.
func (h *handler) newSSE(w http.ResponseWriter) *sseWriter {
	s := newSSEWriter(w)
	s.interval = h.streamInterval
	return s
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w), pending: make([]byte, 0, 1024)}
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
	return s.write("", marshalEvent(v))
}

func (s *sseWriter) raw(data []byte) error { return s.write("", data) }

// done writes the stream's last event, and everything held.
func (s *sseWriter) done() {
	s.hold = false
	s.raw([]byte("[DONE]"))
}

// event writes one named event ("event: NAME", then the data), as the Responses and
// Anthropic Messages streams have them.
func (s *sseWriter) event(name string, v any) error {
	if s.err != nil {
		return s.err
	}
	return s.write(name, marshalEvent(v))
}

// marshalEvent is v as JSON, or an error body when v cannot be encoded: the stream
// still gets an event that says what went wrong.
func marshalEvent(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		data, _ = json.Marshal(errorBody{Error: errorObject{Message: "encoding the response: " + err.Error(), Type: "server_error"}})
	}
	return data
}

// write sends one event: "event: NAME" when name is set, then the data.
func (s *sseWriter) write(name string, data []byte) error {
	b := s.begin(name)
	return s.commit(append(b, data...))
}

// begin starts an event: it returns the pending bytes with the event's head appended,
// for the caller to append the event's JSON to and pass to commit.
func (s *sseWriter) begin(name string) []byte {
	b := s.pending
	if name != "" {
		b = append(b, "event: "...)
		b = append(b, name...)
		b = append(b, '\n')
	}
	return append(b, "data: "...)
}

// commit ends the event begun with begin and written into b, and writes the pending
// events unless hold is set.
func (s *sseWriter) commit(b []byte) error {
	s.pending = append(b, "\n\n"...)
	if s.err != nil {
		s.pending = s.pending[:0]
		return s.err
	}
	if s.hold {
		return nil
	}
	return s.release()
}

// release writes the pending events in one write, and flushes.
func (s *sseWriter) release() error {
	s.hold, s.heldBytes = false, 0
	if s.err != nil || len(s.pending) == 0 {
		s.pending = s.pending[:0]
		return s.err
	}
	_, err := s.w.Write(s.pending)
	s.pending = s.pending[:0]
	if err != nil {
		s.err = err
		return err
	}
	s.flush()
	return s.err
}

// maxHeld bounds the bytes of events held for one write.
const maxHeld = 64 << 10

// tokenDone writes the events a token made, and those held before them, unless the next
// token is ready already (more) or the stream interval holds them. The interval counts
// the tokens that made events: the first to show the client something goes at once (a
// first token that gives no text yet, a piece of a character, must not hold the first
// text for an interval).
func (s *sseWriter) tokenDone(more bool) error {
	if len(s.pending) > s.heldBytes {
		s.tokens++
		s.held++
	}
	s.heldBytes = len(s.pending)
	if len(s.pending) < maxHeld && (more || (s.interval > 1 && s.tokens > 1 && s.held < s.interval)) {
		s.hold = true
		return s.err
	}
	s.held, s.heldBytes = 0, 0
	return s.release()
}

// JSON, by hand, as encoding/json writes it (HTML-safe: json.Marshal's default).

const hexDigits = "0123456789abcdef"

// htmlSafe[b] is whether ASCII byte b stands for itself in a JSON string encoding/json
// writes (not a control character, quote, backslash, <, > or &).
var htmlSafe = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return t
}()

// appendJSONString appends s as a JSON string exactly as encoding/json's Marshal writes
// it: HTML-safe escapes, invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if htmlSafe[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendKey appends "key": (key needs no escapes).
func appendKey(dst []byte, key string) []byte {
	dst = append(dst, '"')
	dst = append(dst, key...)
	return append(dst, '"', ':')
}

// appendOptString appends s as a JSON string, or null.
func appendOptString(dst []byte, s *string) []byte {
	if s == nil {
		return append(dst, "null"...)
	}
	return appendJSONString(dst, *s)
}

// appendIDs appends ids as a JSON array of numbers.
func appendIDs(dst []byte, ids []int32) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(id), 10)
	}
	return append(dst, ']')
}

// appendChunkHead appends a stream chunk's fields up to its choices' array, opened.
func (j *job) appendChunkHead(b []byte) []byte {
	b = append(b, '{')
	b = appendKey(b, "id")
	b = appendJSONString(b, j.id)
	b = append(b, ',')
	b = appendKey(b, "object")
	b = appendJSONString(b, j.chunkObject())
	b = append(b, ',')
	b = appendKey(b, "created")
	b = strconv.AppendInt(b, j.created, 10)
	b = append(b, ',')
	b = appendKey(b, "model")
	b = appendJSONString(b, j.m.ID)
	b = append(b, ',')
	b = appendKey(b, "choices")
	return append(b, '[')
}

// appendChunkTail closes what appendChunkHead opened: with include_usage, every chunk but
// the last has "usage": null.
func (j *job) appendChunkTail(b []byte) []byte {
	b = append(b, ']')
	if j.includeUsage {
		b = append(b, ',')
		b = appendKey(b, "usage")
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// fastChatChunk reports whether chatChunk's JSON can be written by hand: no logprobs,
// no tool calls, nothing of the prompt's still to send.
func (j *job) fastChatChunk(c *choice, d *delta, lp *chatLogprobs) bool {
	return lp == nil && len(d.ToolCalls) == 0 && (c.promptSent || !j.tokenIDs) && (c.promptLPSent || c.promptLP == nil)
}

// appendChatChunk appends the JSON of j.chatChunk(c, d, nil, finish) when fastChatChunk.
func (j *job) appendChatChunk(b []byte, c *choice, d *delta, finish *string) []byte {
	b = appendChoiceHead(j.appendChunkHead(b), c)
	b = appendKey(b, "delta")
	b = append(b, '{')
	comma := false
	field := func(b []byte, key string) []byte {
		if comma {
			b = append(b, ',')
		}
		comma = true
		return appendKey(b, key)
	}
	if d.Role != "" {
		b = field(b, "role")
		b = appendJSONString(b, d.Role)
	}
	if d.Content != nil {
		b = field(b, "content")
		b = appendJSONString(b, *d.Content)
	}
	if d.ReasoningContent != nil {
		b = field(b, "reasoning_content")
		b = appendJSONString(b, *d.ReasoningContent)
	}
	if d.Reasoning != nil {
		b = field(b, "reasoning")
		b = appendJSONString(b, *d.Reasoning)
	}
	b = append(b, '}', ',')
	return j.appendChunkTail(appendChoiceTail(b, c, finish))
}

// fastCompletionChunk reports whether completionChunk's JSON can be written by hand: no
// logprobs, nothing of the prompt's still to send.
func (j *job) fastCompletionChunk(c *choice, lp *completionLogprobs) bool {
	return lp == nil && (c.promptSent || !(j.tokenIDs || j.promptLogprobs >= 0))
}

// appendCompletionChunk appends the JSON of j.completionChunk(c, text, nil, finish) when
// fastCompletionChunk.
func (j *job) appendCompletionChunk(b []byte, c *choice, text string, finish *string) []byte {
	b = appendChoiceHead(j.appendChunkHead(b), c)
	b = appendKey(b, "text")
	b = appendJSONString(b, text)
	b = append(b, ',')
	return j.appendChunkTail(appendChoiceTail(b, c, finish))
}

// appendChoiceHead opens a chunk's choice with its index.
func appendChoiceHead(b []byte, c *choice) []byte {
	b = append(b, '{')
	b = appendKey(b, "index")
	b = strconv.AppendInt(b, int64(c.index), 10)
	return append(b, ',')
}

// appendChoiceTail ends a chunk's choice: no logprobs, the finish reason, the token ids
// not sent yet.
func appendChoiceTail(b []byte, c *choice, finish *string) []byte {
	b = appendKey(b, "logprobs")
	b = append(b, "null,"...)
	b = appendKey(b, "finish_reason")
	b = appendOptString(b, finish)
	if ids := c.takeIDs(); len(ids) > 0 {
		b = append(b, ',')
		b = appendKey(b, "token_ids")
		b = appendIDs(b, ids)
	}
	return append(b, '}')
}

// sendChatChunk writes j.chatChunk(c, d, lp, finish) as one event.
func (j *job) sendChatChunk(sse *sseWriter, c *choice, d delta, lp *chatLogprobs, finish *string) error {
	if sse.err != nil {
		return sse.err
	}
	if !j.fastChatChunk(c, &d, lp) {
		return sse.send(j.chatChunk(c, d, lp, finish))
	}
	return sse.commit(j.appendChatChunk(sse.begin(""), c, &d, finish))
}

// sendCompletionChunk writes j.completionChunk(c, text, lp, finish) as one event.
func (j *job) sendCompletionChunk(sse *sseWriter, c *choice, text string, lp *completionLogprobs, finish *string) error {
	if sse.err != nil {
		return sse.err
	}
	if !j.fastCompletionChunk(c, lp) {
		return sse.send(j.completionChunk(c, text, lp, finish))
	}
	return sse.commit(j.appendCompletionChunk(sse.begin(""), c, text, finish))
}
