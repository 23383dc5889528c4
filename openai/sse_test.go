package openai

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// jsonStrings are strings whose JSON needs every kind of escape encoding/json writes.
var jsonStrings = []string{
	"", "hello", " world", "a\"b\\c", "<tag> & </tag>", "line\nbreak\r\ttab\b\f", "\x00\x01\x1f\x7f",
	"héllo wörld", "日本語", "emoji 🙂", "\u2028\u2029", "bad \xff utf8 \xc3", "\xe2\x80", strings.Repeat("x", 300),
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json writes %s", s, got, want)
		}
	})
}

// The chunks written by hand are the bytes encoding/json writes for the same chunk, in
// every shape the fast path takes.
func TestChunkEncodersMatchEncodingJSON(t *testing.T) {
	stop := "stop"
	for _, chat := range []bool{false, true} {
		for _, includeUsage := range []bool{false, true} {
			for _, tokenIDs := range []bool{false, true} {
				for _, finish := range []*string{nil, &stop} {
					for _, text := range jsonStrings {
						j := &job{m: &Model{ID: "model <\"x\">"}, id: "cmpl-abc", created: 1733000000, chat: chat,
							includeUsage: includeUsage, tokenIDs: tokenIDs, promptLogprobs: -1, prompts: [][]int32{{1, 2}}}
						mk := func() *choice {
							c := &choice{index: 1, promptSent: true}
							if tokenIDs {
								c.unsent = []int32{5, -1, 123456}
							}
							return c
						}
						var got, want []byte
						if chat {
							for _, d := range []delta{{Content: &text}, {Role: "assistant", Content: &text}, {}, {ReasoningContent: &text, Reasoning: &text}} {
								c1, c2 := mk(), mk()
								if !j.fastChatChunk(c1, &d, nil) {
									t.Fatalf("chat chunk %+v not on the fast path", d)
								}
								got = j.appendChatChunk(nil, c1, &d, finish)
								want = marshalEvent(j.chatChunk(c2, d, nil, finish))
								if !bytes.Equal(got, want) {
									t.Fatalf("chat chunk by hand:\n%s\nencoding/json:\n%s", got, want)
								}
							}
							continue
						}
						c1, c2 := mk(), mk()
						if !j.fastCompletionChunk(c1, nil) {
							t.Fatal("completion chunk not on the fast path")
						}
						got = j.appendCompletionChunk(nil, c1, text, finish)
						want = marshalEvent(j.completionChunk(c2, text, nil, finish))
						if !bytes.Equal(got, want) {
							t.Fatalf("completion chunk by hand:\n%s\nencoding/json:\n%s", got, want)
						}
					}
				}
			}
		}
	}
}

// The chunks that still carry something of the prompt, logprobs or tool calls take
// encoding/json.
func TestChunkSlowPaths(t *testing.T) {
	j := &job{m: &Model{ID: "m"}, tokenIDs: true, promptLogprobs: -1}
	if j.fastCompletionChunk(&choice{}, nil) {
		t.Error("a completion chunk that must send the prompt's ids took the fast path")
	}
	if j.fastCompletionChunk(&choice{promptSent: true}, &completionLogprobs{}) {
		t.Error("a completion chunk with logprobs took the fast path")
	}
	j = &job{m: &Model{ID: "m"}, promptLogprobs: -1}
	if j.fastChatChunk(&choice{}, &delta{ToolCalls: []toolCallDelta{{}}}, nil) {
		t.Error("a chat chunk with tool calls took the fast path")
	}
	if j.fastChatChunk(&choice{}, &delta{}, &chatLogprobs{}) {
		t.Error("a chat chunk with logprobs took the fast path")
	}
}

// The Messages and Responses deltas written by hand are the bytes encoding/json writes
// for the maps they replace.
func TestDeltaEventsMatchEncodingJSON(t *testing.T) {
	for _, text := range jsonStrings {
		rec := httptest.NewRecorder()
		sse := newSSEWriter(rec)
		mb := &msgBuilder{sse: sse, blocks: make([]*msgBlock, 3)}
		rb := &respBuilder{sse: sse, items: make([]*outputItem, 2), open: &outputItem{ID: "msg_<1>"}, seq: 7}
		type ev struct {
			name string
			send func() error
			want any
		}
		for _, e := range []ev{
			{"content_block_delta", func() error { return mb.delta("text_delta", "text", text) },
				map[string]any{"type": "content_block_delta", "index": 2, "delta": map[string]string{"type": "text_delta", "text": text}}},
			{"content_block_delta", func() error { return mb.delta("input_json_delta", "partial_json", text) },
				map[string]any{"type": "content_block_delta", "index": 2, "delta": map[string]string{"type": "input_json_delta", "partial_json": text}}},
			{"response.output_text.delta", func() error { return rb.delta("response.output_text.delta", 0, text, true) },
				map[string]any{"type": "response.output_text.delta", "sequence_number": 7, "item_id": "msg_<1>", "output_index": 1, "content_index": 0, "delta": text, "logprobs": []any{}}},
			{"response.function_call_arguments.delta", func() error { return rb.delta("response.function_call_arguments.delta", -1, text, false) },
				map[string]any{"type": "response.function_call_arguments.delta", "sequence_number": 8, "item_id": "msg_<1>", "output_index": 1, "delta": text}},
		} {
			before := rec.Body.Len()
			if err := e.send(); err != nil {
				t.Fatal(err)
			}
			want := "event: " + e.name + "\ndata: " + string(marshalEvent(e.want)) + "\n\n"
			if got := rec.Body.String()[before:]; got != want {
				t.Fatalf("by hand:\n%s\nencoding/json:\n%s", got, want)
			}
		}
	}
}

// Held events go out together, in order, at the first event written without hold.
func TestSSEWriterHolds(t *testing.T) {
	rec := httptest.NewRecorder()
	sse := newSSEWriter(rec)
	sse.hold = true
	sse.raw([]byte("1"))
	sse.raw([]byte("2"))
	if rec.Body.Len() != 0 {
		t.Fatalf("held events were written: %q", rec.Body.String())
	}
	sse.hold = false
	sse.raw([]byte("3"))
	if got, want := rec.Body.String(), "data: 1\n\ndata: 2\n\ndata: 3\n\n"; got != want {
		t.Fatalf("wrote %q, want %q", got, want)
	}
	sse.hold = true
	sse.raw([]byte("4"))
	sse.done()
	if got, want := rec.Body.String(), "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: [DONE]\n\n"; got != want {
		t.Fatalf("wrote %q, want %q", got, want)
	}
}

// With a stream interval, the first token that shows the client something is written at
// once, even after tokens that showed nothing; then every interval's worth of tokens
// that made events, and whatever is held at the end.
func TestSSEWriterInterval(t *testing.T) {
	rec := httptest.NewRecorder()
	sse := newSSEWriter(rec)
	sse.interval = 3
	writes := func() int { return strings.Count(rec.Body.String(), "\n\n") }
	sse.hold = true
	sse.tokenDone(false) // a token that gave no text yet
	if writes() != 0 {
		t.Fatal("a token with no events wrote something")
	}
	for i, want := range []int{1, 1, 1, 4, 4, 4, 7} {
		sse.hold = true
		sse.raw([]byte(strconv.Itoa(i)))
		if i == 2 {
			sse.tokenDone(false) // another token without events does not count
		}
		sse.tokenDone(false)
		if got := writes(); got != want {
			t.Fatalf("after token %d: %d events written, want %d", i, got, want)
		}
	}
	sse.done()
	if got := writes(); got != 8 {
		t.Fatalf("at the end: %d events written, want 8 (7 and [DONE])", got)
	}
}
