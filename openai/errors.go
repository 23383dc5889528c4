package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"

	"tandem/llm"
)

// apiError is an error the client sees, in OpenAI's shape:
// {"error":{"message","type","param","code"}}.
type apiError struct {
	status     int
	msg        string
	typ        string
	param      string
	code       string
	retryAfter string
	// after, if set, runs once the error is written (discarding an unread body).
	after func()
}

func (e *apiError) Error() string { return e.msg }

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() errorBody {
	o := errorObject{Message: e.msg, Type: e.typ}
	if e.param != "" {
		o.Param = &e.param
	}
	if e.code != "" {
		o.Code = &e.code
	}
	return errorBody{Error: o}
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter != "" {
		w.Header().Set("Retry-After", e.retryAfter)
	}
	if sw, ok := w.(*statusWriter); ok && sw.anthropic {
		writeJSON(w, e.status, e.anthropicBody())
	} else {
		writeJSON(w, e.status, e.body())
	}
	if e.after != nil {
		e.after()
	}
}

// drainAfterRefusal bounds how much of a refused body is read and thrown away after the
// answer, so that a client still sending it gets to read the answer rather than a reset
// connection; a body larger still is cut.
const drainAfterRefusal = 8 << 20

// discardRest returns a function that sends the answer written so far, then reads and
// drops up to drainAfterRefusal bytes of r's body (under the body's deadline): the bytes
// are consumed as the body, never parsed as requests, and the connection closes after.
func discardRest(w http.ResponseWriter, r *http.Request) func() {
	return func() {
		http.NewResponseController(w).Flush()
		io.Copy(io.Discard, io.LimitReader(r.Body, drainAfterRefusal))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = json.Marshal(errorBody{Error: errorObject{Message: "encoding the response: " + err.Error(), Type: "server_error"}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

// backendError maps an error from Backend.Generate or Stream.Next to what the
// client sees.
func backendError(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, llm.ErrPromptTooLong):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded", msg: err.Error()}
	case errors.Is(err, llm.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", msg: err.Error()}
	case errors.Is(err, llm.ErrQueueFull):
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "rate_limit_exceeded", retryAfter: "1",
			msg: "The server is busy: " + err.Error() + ". Retry later."}
	case errors.Is(err, llm.ErrUnavailable):
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "service_unavailable", retryAfter: "1",
			msg: "The service is unavailable: " + err.Error() + ". Retry later."}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client is still there (the handler checks): the backend gave up.
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "cancelled", retryAfter: "1",
			msg: "The backend cancelled the request: " + err.Error() + ". Retry later."}
	}
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "Internal error: " + err.Error()}
}

// embeddedPrefix matches the Go names of the request types' embedded structs in a
// decoding error's field path.
var embeddedPrefix = regexp.MustCompile(`\b[a-z]+Fields\.`)

// readJSON reads a body of at most maxBody bytes and decodes it into v. A body the
// server stops reading (too large, too slow) leaves the connection in an unknown place
// in the client's bytes, so those answers close it: nothing after them is parsed as
// another request.
func (h *handler) readJSON(w http.ResponseWriter, r *http.Request, maxBody int64, v any) *apiError {
	data, aerr := h.readRequest(w, r, maxBody, nil)
	if aerr != nil {
		return aerr
	}
	return decodeJSON(data, v)
}

// readRequest reads a JSON body of at most maxBody bytes (readJSON without the
// decoding), into buf when it has room for the declared length.
func (h *handler) readRequest(w http.ResponseWriter, r *http.Request, maxBody int64, buf []byte) ([]byte, *apiError) {
	if aerr := checkContentType(r); aerr != nil {
		h.refused("unsupported_media_type")
		w.Header().Set("Connection", "close")
		return nil, aerr
	}
	data, err := readBody(w, r, maxBody, buf)
	if err != nil {
		w.Header().Set("Connection", "close")
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			h.refused("body_too_large")
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
				msg: fmt.Sprintf("The request body is larger than %d bytes.", mbe.Limit), after: discardRest(w, r)}
		case errors.Is(err, os.ErrDeadlineExceeded):
			h.refused("body_timeout")
			return nil, &apiError{status: http.StatusRequestTimeout, typ: "invalid_request_error", code: "request_timeout",
				msg: "The request body did not arrive in time (" + err.Error() + ")."}
		}
		return nil, badRequest("", "Reading the request body: %v.", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, badRequest("", "The request body is empty; send a JSON object.")
	}
	return data, nil
}

// decodeJSON decodes a request body into v; its errors name the field.
func decodeJSON(data []byte, v any) *apiError {
	if err := json.Unmarshal(data, v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te) && te.Field == "":
			return badRequest("", "The request body must be a JSON object, not %s.", te.Value)
		case errors.As(err, &te):
			field := embeddedPrefix.ReplaceAllString(te.Field, "") // embedded structs, not JSON keys
			return badRequest(field, "Invalid type for '%s': expected %s, got %s.", field, jsonTypeName(te.Type.String()), te.Value)
		case errors.As(err, &se):
			return badRequest("", "The request body is not valid JSON: %v (at byte %d).", se, se.Offset)
		}
		return badRequest("", "The request body is not valid JSON: %v.", err)
	}
	return nil
}

// readBody reads the whole body, sized once when the client declared its length, into
// buf if it has room.
func readBody(w http.ResponseWriter, r *http.Request, maxBody int64, buf []byte) ([]byte, error) {
	if r.ContentLength > maxBody {
		// Refused before reading a byte: the declared length is over the limit.
		return nil, &http.MaxBytesError{Limit: maxBody}
	}
	body := http.MaxBytesReader(w, r.Body, maxBody)
	if r.ContentLength <= 0 {
		return io.ReadAll(body)
	}
	// ReadFrom grows a buffer with less than bytes.MinRead free before each read, the
	// one that finds the end included: that much spare keeps it to one allocation.
	if int64(cap(buf)) < r.ContentLength+bytes.MinRead {
		buf = make([]byte, 0, r.ContentLength+bytes.MinRead)
	}
	b := bytes.NewBuffer(buf[:0])
	_, err := b.ReadFrom(body)
	return b.Bytes(), err
}

// bodyBuffers keeps the buffers of bodies that their handler has done with (a
// completion's, once decoded: encoding/json and cutPromptIDs copy what they keep) for
// the next request, so that a stream of long prompts does not allocate one each. Buffers
// over memoryReturnBody are left to the collector.
type bodyBuffers struct{ pool sync.Pool }

func (p *bodyBuffers) get() []byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return nil
}

func (p *bodyBuffers) put(b []byte) {
	if cap(b) > 0 && cap(b) <= memoryReturnBody {
		p.pool.Put(&b)
	}
}

// checkContentType refuses a body declared as something other than JSON (a form, plain
// text), as vLLM does; a body without a Content-Type is read as JSON.
func checkContentType(r *http.Request) *apiError {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return &apiError{status: http.StatusUnsupportedMediaType, typ: "invalid_request_error", code: "unsupported_media_type",
		msg: fmt.Sprintf("Unsupported Content-Type %q: send the body as application/json.", ct)}
}

// jsonTypeName names a Go type the way a JSON user thinks of it.
func jsonTypeName(goType string) string {
	switch {
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "*map["):
		return "an object"
	case strings.HasPrefix(goType, "[]"), strings.HasPrefix(goType, "*[]"):
		return "an array"
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	case strings.Contains(goType, "string"):
		return "a string"
	}
	return "an object"
}
