package openai

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"

	"tandem/llm"
)

// Embeddings: /v1/embeddings pools the final normalised hidden states of each input (the
// model's Pooling: last token or mean), normalises the vector to unit length, and answers
// in OpenAI's shape. dimensions keeps the first values and normalises again (as OpenAI's
// Matryoshka models are used); encoding_format base64 sends the float32s' little-endian
// bytes. Each input is one backend request, all at once; the engine's kernels are batch-
// invariant, so an input's vector is the same bits alone or among others.

// MaxEmbeddingInputs bounds the inputs of one embeddings request (OpenAI's limit).
const MaxEmbeddingInputs = 2048

type embeddingRequest struct {
	Model            string          `json:"model"`
	Input            json.RawMessage `json:"input"`
	EncodingFormat   string          `json:"encoding_format"`
	Dimensions       *int64          `json:"dimensions"`
	User             string          `json:"user"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	// Refused: they change the output and are not implemented.
	TruncatePromptTokens json.RawMessage `json:"truncate_prompt_tokens"`
	Normalize            json.RawMessage `json:"normalize"`
}

type embeddingObject struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32 or a base64 string
}

type embeddingResponse struct {
	Object string            `json:"object"`
	Data   []embeddingObject `json:"data"`
	Model  string            `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// float32s writes float32 values with float32 precision (the shortest text that reads
// back as the same bits).
type float32s []float32

func (v float32s) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 12*len(v)+2)
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, errors.New("an embedding value is not finite")
		}
		b = strconv.AppendFloat(b, float64(x), 'g', -1, 32)
	}
	return append(b, ']'), nil
}

func (h *handler) embeddings(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req embeddingRequest
	if aerr := h.readJSON(w, r, h.maxBody, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	m, aerr := h.resolve(req.Model, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	resp, aerr := h.embed(r.Context(), r, m, &req, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (h *handler) embed(ctx context.Context, r *http.Request, m *Model, req *embeddingRequest, info *reqInfo) (*embeddingResponse, *apiError) {
	switch {
	case !isNull(req.TruncatePromptTokens):
		return nil, badRequest("truncate_prompt_tokens", "truncate_prompt_tokens is not supported by this server: inputs are not truncated; one too long is refused.")
	case !isNull(req.Normalize) && string(req.Normalize) != "true":
		return nil, badRequest("normalize", "normalize is not supported by this server: embeddings are always normalised.")
	case req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64":
		return nil, badRequest("encoding_format", "encoding_format must be \"float\" or \"base64\", got %q.", req.EncodingFormat)
	case m.NoTokenControls:
		return nil, badRequest("model", "The workers serving `%s` predate embeddings; upgrade them.", m.ID)
	}
	if isNull(req.Input) {
		return nil, badRequest("input", "input is required.")
	}
	prompts, aerr := m.promptIDs(req.Input, req.AddSpecialTokens)
	if aerr != nil {
		aerr.param, aerr.msg = "input", embedInputMsg(aerr.msg)
		return nil, aerr
	}
	if len(prompts) > MaxEmbeddingInputs {
		return nil, badRequest("input", "input has %d items; at most %d are embedded in one request.", len(prompts), MaxEmbeddingInputs)
	}
	for i, p := range prompts {
		switch {
		case len(p) == 0:
			return nil, badRequest("input", "input %d encodes to no tokens.", i)
		case m.ContextLen > 0 && len(p) >= m.ContextLen:
			return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input", code: "context_length_exceeded",
				msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, input %d has %d tokens. Please reduce its length.", m.ContextLen, i, len(p))}
		}
	}
	pool := m.Pooling
	if pool == llm.PoolNone {
		pool = llm.PoolLast
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	id := newID("embd-")
	vecs := make([][]float32, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		info.promptTokens += len(p)
		lreq := &llm.Request{ID: fmt.Sprintf("%s-%d", id, i), Model: m.ID, Prompt: p, Pooling: pool, Session: session(r, req.User), Adapter: m.adapter}
		st, err := m.Backend.Generate(ctx, lreq)
		if err == nil && st == nil {
			err = errors.New("the backend returned no stream")
		}
		if err != nil {
			cancel()
			wg.Wait()
			return nil, backendError(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer st.Close()
			for {
				ev, err := st.Next(ctx)
				switch {
				case err != nil && !errors.Is(err, io.EOF):
					errs[i] = err
					cancel()
					return
				case err != nil:
					if vecs[i] == nil {
						errs[i] = errors.New("the backend ended an embedding without one")
					}
					return
				case ev.Embedding != nil:
					vecs[i] = ev.Embedding
				case ev.Finish == llm.FinishAbort:
					errs[i] = errors.New("the embedding was aborted")
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			if r.Context().Err() != nil {
				return nil, &apiError{status: 499, typ: "invalid_request_error", msg: "The client went away."}
			}
			return nil, backendError(err)
		}
	}

	dims := len(vecs[0])
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > int64(dims) {
			return nil, badRequest("dimensions", "dimensions must be between 1 and %d (the model's width), got %d.", dims, *req.Dimensions)
		}
		dims = int(*req.Dimensions)
	}
	resp := &embeddingResponse{Object: "list", Model: m.ID}
	for i, v := range vecs {
		unit := normalize(v[:dims])
		obj := embeddingObject{Object: "embedding", Index: i, Embedding: float32s(unit)}
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*len(unit))
			for k, x := range unit {
				binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(x))
			}
			obj.Embedding = base64.StdEncoding.EncodeToString(b)
		}
		resp.Data = append(resp.Data, obj)
		resp.Usage.PromptTokens += len(prompts[i])
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	return resp, nil
}

// normalize returns v scaled to unit length (summed in float64 in order; a zero vector
// stays zero).
func normalize(v []float32) []float32 {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	out := make([]float32, len(v))
	if sum == 0 {
		return out
	}
	inv := 1 / math.Sqrt(sum)
	for i, x := range v {
		out[i] = float32(float64(x) * inv)
	}
	return out
}

// embedInputMsg rewords a prompt parsing error for the input field.
func embedInputMsg(msg string) string {
	if msg == "prompt is required." {
		return "input is required."
	}
	return "input: " + msg
}
