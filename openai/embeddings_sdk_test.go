package openai_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"testing"

	sdk "github.com/openai/openai-go/v3"

	"tandem/llm"
	"tandem/openai"
)

// embedB64 embeds inputs with base64 encoding (the exact float32 bits), raw HTTP.
func embedB64(t *testing.T, url string, body map[string]any) [][]float32 {
	t.Helper()
	body["encoding_format"] = "base64"
	data, _ := json.Marshal(body)
	r := do(t, "POST", url+"/v1/embeddings", string(data))
	if r.status != http.StatusOK {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	var out struct {
		Data []struct {
			Index     int
			Embedding string
		}
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	vecs := make([][]float32, len(out.Data))
	for _, d := range out.Data {
		b, err := base64.StdEncoding.DecodeString(d.Embedding)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		vecs[d.Index] = v
	}
	return vecs
}

func norm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func sameFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// Embeddings through the SDK: unit vectors of the model's width, float and base64 the same
// values, the same bits alone and in a batch, dimensions truncating and renormalising.
func TestSDKEmbeddings(t *testing.T) {
	e := newFixtureEnv(t, llamaFixture, nil)
	c := e.client()
	out, err := c.Embeddings.New(testCtx(t), sdk.EmbeddingNewParams{Model: "m",
		Input: sdk.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"The cat sat", "on the mat"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Data) != 2 || out.Object != "list" || out.Model != "m" || out.Usage.PromptTokens == 0 || out.Usage.TotalTokens != out.Usage.PromptTokens {
		t.Fatalf("response %+v", out)
	}
	width := e.m.Config.Embd
	for i, d := range out.Data {
		if int(d.Index) != i || len(d.Embedding) != width || math.Abs(normF64(d.Embedding)-1) > 1e-6 {
			t.Errorf("embedding %d: index %d, %d values (width %d), norm %v", i, d.Index, len(d.Embedding), width, normF64(d.Embedding))
		}
	}
	alone := embedB64(t, e.srv.URL, map[string]any{"input": "on the mat"})[0]
	batch := embedB64(t, e.srv.URL, map[string]any{"input": []string{"The cat sat", "on the mat", "and slept"}})
	if !sameFloats(alone, batch[1]) {
		t.Error("the same input alone and in a batch gives different bits")
	}
	for i, x := range alone {
		if x != float32(out.Data[1].Embedding[i]) { // float32 precision in the text, the same bits back
			t.Fatalf("value %d: base64 %v, float %v", i, x, out.Data[1].Embedding[i])
		}
	}
	ids := e.m.Tokenizer.Encode("on the mat", true, true)
	if byIDs := embedB64(t, e.srv.URL, map[string]any{"input": ids})[0]; !sameFloats(byIDs, alone) {
		t.Error("token ids and their text give different embeddings")
	}
	short, err := c.Embeddings.New(testCtx(t), sdk.EmbeddingNewParams{Model: "m", Dimensions: sdk.Int(8),
		Input: sdk.EmbeddingNewParamsInputUnion{OfString: sdk.String("on the mat")}})
	if err != nil {
		t.Fatal(err)
	}
	head := alone[:8]
	n := norm(head)
	for i, x := range short.Data[0].Embedding {
		if want := float64(head[i]) / n; math.Abs(x-want) > 1e-6 {
			t.Errorf("dimensions 8: value %d is %v, want %v", i, x, want)
		}
	}
	for _, tc := range []struct{ body, param string }{
		{`{"input":"x","dimensions":100000}`, "dimensions"},
		{`{"input":"x","encoding_format":"int8"}`, "encoding_format"},
		{`{"input":[]}`, "input"},
		{`{"input":"x","truncate_prompt_tokens":3}`, "truncate_prompt_tokens"},
	} {
		checkError(t, tc.body, do(t, "POST", e.srv.URL+"/v1/embeddings", tc.body), 400, tc.param, "", "")
	}
}

func normF64(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// The model's pooling decides: mean and last differ, and each is the same bits again.
func TestEmbeddingsPooling(t *testing.T) {
	vecs := map[llm.Pooling][]float32{}
	for _, pool := range llm.Poolings {
		e := newFixtureEnv(t, llamaFixture, func(m *openai.Model) { m.Pooling = pool })
		a := embedB64(t, e.srv.URL, map[string]any{"input": "a b c d e"})[0]
		b := embedB64(t, e.srv.URL, map[string]any{"input": []string{"x", "a b c d e"}})[1]
		if !sameFloats(a, b) {
			t.Errorf("%s: not batch-invariant", pool)
		}
		vecs[pool] = a
	}
	if sameFloats(vecs[llm.PoolMean], vecs[llm.PoolLast]) {
		t.Error("mean and last pooling give the same vector")
	}
}
